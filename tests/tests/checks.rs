//! `apollo-agent check` refuses what would open a gate to anyone, freeze
//! nothing or hide a second problem behind the first: each problem on its
//! line, in plain words, with the closest name; and it exits as its help
//! says (0 nothing wrong, 1 a problem found, 2 it could not run).

use apollo_tests::*;
use std::path::Path;

/// A project directory: `apollo.yaml` (when given) and `tasks/`.
fn project(config: Option<&str>, tasks: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("tasks")).unwrap();
    if let Some(c) = config {
        std::fs::write(dir.path().join("apollo.yaml"), c).unwrap();
    }
    for (file, yaml) in tasks {
        std::fs::write(dir.path().join("tasks").join(file), yaml).unwrap();
    }
    dir
}

/// `apollo-agent check ARGS` in `dir`: its exit code, and stdout then stderr.
fn check(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(agent_bin())
        .current_dir(dir)
        .arg("check")
        .args(args)
        .env_remove("APOLLO_CONFIG")
        .env_remove("APOLLO_SOCKET")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), said)
}

/// A definition with one approval step whose params end with `approvers`.
fn gate(message: &str, approvers: &str) -> String {
    let step = "task: gate\nsteps:\n  - plugin: approval\n    params:\n";
    format!("{step}      message: {message:?}\n      approvers: {approvers}\n")
}

#[test]
fn an_approval_takes_only_users_and_groups_of_this_host() {
    let cases: &[(&str, &str)] = &[
        ("{user: [root]}", "line 3: steps[0].params: approvers: unknown field \"user\" (did you mean \"users\"?"),
        ("{users: [root], grups: [root]}", "approvers: unknown field \"grups\" (did you mean \"groups\"?"),
        (
            "{users: [nosuchuser]}",
            "line 3: steps[0].params: approvers.users[0]: there is no user \"nosuchuser\" on this host",
        ),
        ("{groups: [nosuchgroup]}", "approvers.groups[0]: there is no group \"nosuchgroup\" on this host"),
        (
            "root",
            "line 3: steps[0].params: approvers: expected a mapping of users and groups, found the text \"root\" \
             (e.g. approvers: {users: [root]}",
        ),
        ("{users: root}", "approvers.users: expected a list of user names, found the text \"root\""),
    ];
    // A message that is a template leaves every other param to its run,
    // but not the approvers.
    for message in ["fail over?", "fail over {{ task }}?"] {
        for (approvers, said) in cases {
            let dir = project(None, &[("gate.yaml", &gate(message, approvers))]);
            let (code, text) = check(dir.path(), &[]);
            assert_eq!(code, Some(1), "{approvers}: {text}");
            assert!(text.contains(said), "{message} {approvers}: {said:?} not in\n{text}");
            assert!(!text.contains("invalid type") && !text.contains("unknown variant"), "serde's words: {text}");
        }
        let dir = project(None, &[("gate.yaml", &gate(message, "{users: [root], groups: [root]}"))]);
        let (code, text) = check(dir.path(), &[]);
        assert_eq!(code, Some(0), "known users and groups pass: {text}");
    }
}

const FREEZES: &str = "scheduler:
  queues:
    q1: {limit: 2}
  freezes:
    - name: year-end
      from: 2026-12-20T00:00:00Z
      until: 2027-01-04T00:00:00Z
      queues: [q1x]
      tasks: [deplyo]
      reason: year-end freeze
";

#[test]
fn a_freeze_window_that_would_freeze_nothing_is_refused_with_its_line_and_the_closest_name() {
    let deploy = "task: deploy\nsteps:\n  - plugin: sleep\n";
    let dir = project(Some(FREEZES), &[("deploy.yaml", deploy)]);
    let (code, text) = check(dir.path(), &[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("apollo.yaml: line 8: scheduler.freezes[0] (year-end).queues[0]: no queue \"q1x\" here")
            && text.contains("did you mean \"q1\"?"),
        "{text}"
    );
    assert!(
        text.contains("apollo.yaml: line 9: scheduler.freezes[0] (year-end).tasks[0]: no task \"deplyo\" here")
            && text.contains("did you mean \"deploy\"?"),
        "{text}"
    );
    assert!(text.contains("2 problem(s)"), "{text}");
    // The names the config and the definitions know pass.
    let fixed = FREEZES.replace("[q1x]", "[q1, default]").replace("[deplyo]", "[deploy]");
    let dir = project(Some(&fixed), &[("deploy.yaml", deploy)]);
    let (code, text) = check(dir.path(), &[]);
    assert_eq!(code, Some(0), "{text}");
}

#[test]
fn two_freeze_windows_of_one_name_and_a_bad_cron_are_refused_on_their_lines() {
    let conf = "scheduler:
  freezes:
    - name: weekend
      cron: '0 25 * * FRI'
      duration: 60h
      reason: weekend
    - name: weekend
      from: 2026-12-20T00:00:00Z
      until: 2027-01-04T00:00:00Z
      timezone: Mars/Olympus
      reason: year-end
";
    let dir = project(Some(conf), &[]);
    let (code, text) = check(dir.path(), &[]);
    assert_eq!(code, Some(1), "a config problem is a problem found: {text}");
    assert!(text.contains("line 4: scheduler.freezes[0] (weekend).cron:") && text.contains("hour"), "{text}");
    let dup = "line 7: scheduler.freezes[1] (weekend).name: freezes[0] is named \"weekend\" too";
    assert!(text.contains(dup), "{text}");
    assert!(text.contains("line 7: scheduler.freezes[1] (weekend): give either from and until"), "{text}");
}

#[test]
fn a_lock_and_a_secret_are_refused_on_their_lines_once() {
    let locks = "task: t\nparams: {cluster: eu}\nlocks:\n  - \"db:{{ params.clustr }}\"\n  - \"x:{{ steps.a.b }}\"\n\
                 steps:\n  - plugin: sleep\n";
    let secret = "task: s\nsecrets:\n  db: {env: A, file: /f}\nsteps:\n  - plugin: shell\n    params:\n      \
                  command: \"echo {{ secrets.db }}\"\n";
    let dir = project(None, &[("t.yaml", locks), ("s.yaml", secret)]);
    let (code, text) = check(dir.path(), &[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("t.yaml: line 4: locks[0]: params.clustr: the definition declares no param"), "{text}");
    let steps = "t.yaml: line 5: locks[1]: steps: a lock is rendered when the instance is created";
    assert!(text.contains(steps), "{text}");
    let about_s: Vec<&str> = text.lines().filter(|l| l.contains("s.yaml")).collect();
    assert_eq!(about_s.len(), 1, "one error for one malformed source: {text}");
    let once = "s.yaml: line 3: secrets.db: expected exactly one of env: VAR or file: PATH";
    assert!(about_s[0].contains(once), "{text}");
    assert!(!text.contains("declares no secret"), "{text}");
}

#[test]
fn every_section_of_the_config_is_reported_and_check_exits_as_its_help_says() {
    let conf = "scheduler:\n  concurrency: four\nmetrics:\n  listen: nope\nlogging:\n  format: xml\n";
    let dir = project(Some(conf), &[]);
    let (code, text) = check(dir.path(), &[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("apollo.yaml: line 2: scheduler.concurrency: expected a whole number"), "{text}");
    assert!(text.contains("metrics.listen: invalid socket address syntax"), "{text}");
    assert!(text.contains("logging.format: \"xml\" is not valid"), "the checks of the sections that parse: {text}");
    // Nothing wrong: 0; a config that cannot be read: 2 (it could not run).
    let dir = project(Some("scheduler:\n  concurrency: 4\n"), &[("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")]);
    assert_eq!(check(dir.path(), &[]).0, Some(0));
    let (code, text) = check(dir.path(), &["--config", "no-such.yaml"]);
    assert_eq!(code, Some(2), "{text}");
    // The help says so.
    let (_, help) = check(dir.path(), &["--help"]);
    assert!(help.contains("exit 1 when anything is wrong"), "{help}");
}
