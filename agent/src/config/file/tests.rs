//! The config file's parse and checks.

use super::*;

#[test]
fn a_type_error_in_one_section_hides_neither_another_nor_the_checks_of_the_rest() {
    let src = "scheduler:\n  concurrency: four\nmetrics:\n  listen: nope\nlogging:\n  format: xml\n";
    let e = Config::every_problem(src, "apollo.yaml").unwrap();
    assert_eq!(e.len(), 3, "{e:#?}");
    assert!(e[0].starts_with("apollo.yaml: line 2: scheduler.concurrency:"), "{e:#?}");
    assert!(e[1].starts_with("apollo.yaml: line 4: metrics.listen:"), "{e:#?}");
    assert!(e[2].contains("logging.format: \"xml\""), "{e:#?}");
}

#[test]
fn a_file_whose_shape_is_wrong_is_left_to_its_first_error() {
    assert_eq!(Config::every_problem("- a\n- b\n", "a"), None);
}

#[test]
fn empty_config_has_the_documented_defaults() {
    let c = Config::parse("{}", "apollo.yaml").unwrap();
    assert_eq!(c.scheduler.concurrency, None);
    assert_eq!(c.scheduler.concurrency(), 2 * crate::config::cores());
    assert_eq!(c.scheduler.default_timeout, std::time::Duration::from_secs(300));
    assert_eq!(c.database.synchronous, crate::config::Synchronous::Full);
    assert_eq!(c.socket_path(), PathBuf::from(".apollo/agent.sock"));
}

#[test]
fn errors_name_the_file_line_and_field() {
    let e = Config::parse("scheduler:\n  concurency: 4\n", "apollo.yaml").unwrap_err().to_string();
    assert!(e.starts_with("apollo.yaml: line 2: scheduler: unknown field `concurency`"), "{e}");
    let e = Config::parse("scheduler:\n  lease: forever\n", "apollo.yaml").unwrap_err().to_string();
    assert!(e.contains("scheduler.lease") && e.contains("duration like"), "{e}");
    let e = Config::parse("plugins:\n  - name: x\n    class: nope\n", "a.yaml").unwrap_err().to_string();
    assert!(e.contains("unknown class \"nope\""), "{e}");
}

#[test]
fn the_config_is_checked_as_strictly_as_definitions_and_every_problem_is_listed() {
    let err = |src: &str| format!("{:#}", Config::parse(src, "apollo.yaml").unwrap_err());
    let e = err("database:\n  url: mysql://x\n");
    assert!(
        e.contains(
            "database.url: \"mysql://x\" is not valid: mysql: is not a store this agent knows (expected sqlite:PATH"
        ),
        "{e}"
    );
    assert!(e.contains("postgres://user@host:port/db (postgresql:// too)"), "{e}");
    let e = err("database:\n  url: postgres://apollo:hunter2@db:5432/ops\n");
    assert!(e.contains("the URL holds a password") && e.contains("database.password_env"), "{e}");
    assert!(!e.contains("hunter2"), "the password is not repeated: {e}");
    let e = err("database:\n  url: postgres://apollo@db/ops?password=x\n");
    assert!(e.contains("the URL holds a password"), "{e}");
    let e = err("socket:\n  operators: [nosuchuser, \"@nosuchgroup\", 4242, \"@4343\", root, \"@root\"]\n");
    assert!(e.contains("socket.operators[0]: there is no user \"nosuchuser\" on this host"), "{e}");
    assert!(e.contains("socket.operators[1]: there is no group \"nosuchgroup\" on this host"), "{e}");
    assert_eq!(e.lines().count(), 2, "numbers and existing names pass: {e}");
    let e = err("metrics:\n  listen: localhost:9464\n");
    assert!(e.contains("metrics.listen: invalid socket address syntax (expected an IP address and a port, for example 127.0.0.1:9464)"), "{e}");
    // Every problem, not the first one only.
    let e = err("scheduler:\n  concurrency: 0\ndatabase:\n  url: mysql://x\nlogging:\n  format: xml\n");
    assert_eq!(e.lines().count(), 3, "{e}");
    // Nothing but comments: the defaults.
    let c = Config::parse("# nothing set here yet\n\n", "apollo.yaml").unwrap();
    assert_eq!(c.scheduler.concurrency(), Config::default().scheduler.concurrency());
    assert!(Config::parse("", "apollo.yaml").is_ok());
    // What passes: sqlite:, a plain path, postgres:// and postgresql://.
    for url in ["sqlite:data/a.db", "data/a.db", "postgres://apollo@db:5432/ops", "postgresql://db/ops"] {
        assert!(Config::parse(&format!("database:\n  url: {url}\n"), "a").is_ok(), "{url}");
    }
}

#[test]
fn a_system_config_defaults_to_the_system_paths() {
    let mut c = Config::parse("scheduler:\n  concurrency: 2\n", "x").unwrap();
    c.source = Some(PathBuf::from("/etc/apollo/apollo.yaml"));
    c.install = apollo_shared::paths::Install::System;
    assert_eq!(c.tasks_dir(), PathBuf::from("/etc/apollo/tasks"));
    assert_eq!(c.data_dir(), PathBuf::from("/var/lib/apollo"));
    assert_eq!(c.socket_path(), PathBuf::from("/run/apollo/agent.sock"));
    assert_eq!(c.db_path(), PathBuf::from("/var/lib/apollo/apollo.db"));
}

#[test]
fn paths_are_relative_to_the_config_file() {
    let mut c = Config::parse("tasks: defs\ndata_dir: /var/lib/apollo\n", "x").unwrap();
    c.source = Some(PathBuf::from("/etc/apollo/apollo.yaml"));
    assert_eq!(c.tasks_dir(), PathBuf::from("/etc/apollo/defs"));
    assert_eq!(c.db_path(), PathBuf::from("/var/lib/apollo/apollo.db"));
}
