//! External plugins against a real agent: crashes, hangs, floods, garbage,
//! retryable and permanent exits, missing executables, the bundled examples
//! with their rollbacks, and the plugin-author test kit.

use apollo_shared::state::TaskState;
use apollo_tests::*;
use serde_json::Value;

/// A plugin whose execute runs `body` (sh), with a fixed describe.
fn plugin(body: &str) -> String {
    format!(
        r#"#!/bin/sh
case "$1" in
describe) echo '{{"name": "t", "version": "1.0.0", "idempotent": true}}'; exit 0 ;;
validate) echo '{{"ok": true}}'; exit 0 ;;
rollback) echo '{{}}'; exit 0 ;;
esac
cat > /dev/null
{body}
"#
    )
}

fn task(name: &str, plugin: &str, retry: u32, timeout: u32) -> String {
    format!(
        "task: {name}\non_failure: stop\nsteps:\n  - plugin: {plugin}\n    retry: {retry}\n    timeout: {timeout}\n"
    )
}

const CONFIG: &str = "scheduler:\n  backoff_base: 100ms\n  kill_grace: 500ms\nlogging:\n  step_log_bytes: 1048576\n";

fn error_of(inst: &Value) -> String {
    inst["steps"][0]["error"].as_str().unwrap_or_default().to_string()
}

#[test]
fn crashing_plugins_fail_their_step_with_the_signal_and_the_agent_runs_on() {
    let agent = Agent::builder()
        .config(CONFIG)
        .plugin("segv.sh", &plugin("kill -SEGV $$"))
        .plugin("abort.sh", &plugin("kill -ABRT $$"))
        .task("segv.yaml", &task("segv", "segv", 0, 10))
        .task("abort.yaml", &task("abort", "abort", 0, 10))
        .start();
    let (code, inst) = agent.cli_json(&["run", "segv", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")));
    assert!(error_of(&inst).contains("killed by signal SIGSEGV"), "{inst:#}");
    let (_, inst) = agent.cli_json(&["run", "abort", "--wait"]);
    assert!(error_of(&inst).contains("killed by signal SIGABRT"), "{inst:#}");
    assert_eq!(agent.cli(&["status"]).status.code(), Some(0));
}

#[test]
fn a_hanging_plugin_and_its_grandchild_are_gone_after_the_timeout() {
    let agent = Agent::builder()
        .config(CONFIG)
        .plugin("hang.sh", &plugin("sh -c 'sleep 5678.5' & sleep 5678.25"))
        .task("hang.yaml", &task("hang", "hang", 0, 1))
        .start();
    let (code, inst) = agent.cli_json(&["run", "hang", "--wait"]);
    assert_eq!(code, 1);
    assert!(error_of(&inst).contains("timed out after 1s"), "{inst:#}");
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("sleep 5678."))
        .collect();
    assert!(left.is_empty(), "survivors: {left:?}");
}

#[test]
fn a_gigabyte_flood_does_not_grow_the_agent_and_the_step_ends_by_its_exit_status() {
    let agent = Agent::builder()
        .config(CONFIG)
        .plugin("flood_out.sh", &plugin("head -c 1073741824 /dev/zero"))
        .plugin("flood_err.sh", &plugin("head -c 1073741824 /dev/zero | tr '\\0' x >&2; echo '{\"done\": true}'"))
        .task("out.yaml", &task("flood_out", "flood_out", 0, 120))
        .task("err.yaml", &task("flood_err", "flood_err", 0, 120))
        .start();
    let (code, inst) = agent.cli_json(&["run", "flood_out", "--wait"]);
    assert_eq!(code, 1);
    let e = error_of(&inst);
    assert!(e.contains("printed 1073741824 bytes on stdout, over the 65536 byte limit"), "{e}");
    let (code, inst) = agent.cli_json(&["run", "flood_err", "--wait"]);
    assert_eq!(code, 0, "{inst:#}");
    assert_eq!(inst["steps"][0]["output"]["done"], true);
    let id = inst["id"].as_str().unwrap();
    let log = std::fs::metadata(agent.path().join(format!("data/logs/{id}/0.log"))).unwrap().len();
    assert!(log <= 1024 * 1024 + 200, "the step log was not capped: {log} bytes");
    let text = String::from_utf8_lossy(&agent.cli(&["logs", id]).stdout).to_string();
    assert!(text.contains("log truncated at 1048576 bytes"), "{}", &text[text.len().saturating_sub(200)..]);
    let rss = peak_rss_kib(agent.pid());
    assert!(rss < 100 * 1024, "agent peak RSS {rss} KiB after 2 GiB of plugin output");
}

#[test]
fn garbage_output_is_quoted_in_the_error() {
    let agent = Agent::builder()
        .config(CONFIG)
        .plugin("garbage.sh", &plugin("echo 'hello, this is not json'"))
        .plugin("silent.sh", &plugin("true"))
        .plugin("array.sh", &plugin("echo '[1, 2, 3]'"))
        .task("garbage.yaml", &task("garbage", "garbage", 0, 10))
        .task("silent.yaml", &task("silent", "silent", 0, 10))
        .task("array.yaml", &task("array", "array", 0, 10))
        .start();
    let (_, inst) = agent.cli_json(&["run", "garbage", "--wait"]);
    let e = error_of(&inst);
    assert!(e.contains("execute printed invalid JSON") && e.contains("\"hello, this is not json\""), "{e}");
    let (_, inst) = agent.cli_json(&["run", "silent", "--wait"]);
    assert!(error_of(&inst).contains("printed nothing on stdout"), "{inst:#}");
    let (_, inst) = agent.cli_json(&["run", "array", "--wait"]);
    assert!(error_of(&inst).contains("JSON that is not an object (a list): \"[1, 2, 3]\""), "{inst:#}");
}

#[test]
fn exit_75_is_retried_and_exit_1_is_not() {
    let agent = Agent::builder()
        .config(CONFIG)
        .plugin("tempfail.sh", &plugin("echo 'upstream busy' >&2; exit 75"))
        .plugin("permfail.sh", &plugin("echo '{\"error\": \"bad credentials\"}'; exit 1"))
        .task("temp.yaml", &task("tempfail", "tempfail", 2, 10))
        .task("perm.yaml", &task("permfail", "permfail", 2, 10))
        .start();
    let (_, inst) = agent.cli_json(&["run", "tempfail", "--wait"]);
    assert_eq!(inst["steps"][0]["attempts"], 3, "{inst:#}");
    assert!(error_of(&inst).contains("asked to be retried (exit 75): upstream busy"), "{inst:#}");
    let (_, inst) = agent.cli_json(&["run", "permfail", "--wait"]);
    assert_eq!(inst["steps"][0]["attempts"], 1, "{inst:#}");
    assert!(error_of(&inst).contains("failed (exit 1, permanent): bad credentials"), "{inst:#}");
}

#[test]
fn missing_or_unusable_plugins_are_reported_at_load_and_the_agent_runs_on() {
    use std::os::unix::fs::PermissionsExt;
    let agent = Agent::builder()
        .config(
            "plugins:\n  - name: ghost\n    command: ./no/such/plugin\n  - name: flat\n    command: tasks/flat.sh\n",
        )
        .task("ghost.yaml", "task: ghost_task\nsteps:\n  - plugin: ghost\n")
        .plugin("broken.sh", "#!/bin/sh\necho 'describe is broken' >&2\nexit 3\n")
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")
        .task("flat.sh", "#!/bin/sh\necho '{}'\n");
    // flat.sh exists but is not executable.
    let agent = agent.start();
    std::fs::set_permissions(agent.path().join("tasks/flat.sh"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let (_, plugins) = agent.cli_json(&["plugins"]);
    let err = |name: &str| {
        plugins
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .map(|p| p["error"].as_str().unwrap_or("").to_string())
    };
    assert!(err("ghost").unwrap().contains("No such file"), "{plugins:#}");
    assert!(
        err("broken").unwrap().contains("describe ended with exit code 3; stderr: \"describe is broken\""),
        "{plugins:#}"
    );
    assert!(err("flat").is_some(), "{plugins:#}");
    let (_, defs) = agent.cli_json(&["defs"]);
    let ghost = defs.as_array().unwrap().iter().find(|d| d["file"].as_str().unwrap().ends_with("ghost.yaml")).unwrap();
    assert!(ghost["errors"][0].as_str().unwrap().contains("plugin \"ghost\" is not usable"), "{ghost:#}");
    let (code, _) = agent.cli_json(&["run", "ok", "--wait"]);
    assert_eq!(code, 0);
}

#[test]
fn the_bundled_example_plugins_run_and_roll_back() {
    let agent = Agent::builder().bundled_tasks().start();
    let (code, inst) = agent.cli_json(&["run", "provision_host", "-p", "host=db-3", "--wait"]);
    assert_eq!(code, 0, "{inst:#}\n{}", agent.log());
    let out = &inst["steps"][0]["output"];
    assert_eq!((out["host"].as_str(), out["serial"].as_u64()), (Some("db-3"), Some(1)));
    assert_eq!(inst["steps"][0]["plugin_version"], "1.2.0");
    let inventory = out["inventory"].as_str().unwrap().to_string();
    let entries: Value = serde_json::from_str(&std::fs::read_to_string(&inventory).unwrap()).unwrap();
    assert_eq!(entries["hosts"].as_object().unwrap().len(), 1);

    let (code, inst) = agent.cli_json(&["run", "provision_host", "-p", "fail_configure=yes", "--wait"]);
    assert_eq!(code, 1);
    assert_eq!(inst["state"], "ROLLED_BACK");
    let inventory = inst["steps"][0]["output"]["inventory"].as_str().unwrap();
    let entries: Value = serde_json::from_str(&std::fs::read_to_string(inventory).unwrap()).unwrap();
    assert_eq!(entries["hosts"], serde_json::json!({}), "the rollback left the entry");

    let (code, inst) = agent.cli_json(&["run", "disk_report", "--wait"]);
    assert_eq!(code, 0, "{inst:#}");
    let report = inst["steps"][0]["output"]["report"].as_str().unwrap();
    assert!(std::path::Path::new(report).exists());
    let (_, plugins) = agent.cli_json(&["plugins"]);
    let inv = plugins.as_array().unwrap().iter().find(|p| p["name"] == "inventory").unwrap();
    assert_eq!((inv["version"].as_str(), inv["idempotent"].as_bool()), (Some("1.2.0"), Some(true)));
    assert_eq!(TaskState::Success.as_str(), "SUCCESS");
}

#[test]
fn the_test_kit_passes_the_examples_and_catches_a_non_idempotent_plugin() {
    for example in ["inventory.py", "disk_usage.sh"] {
        let out = std::process::Command::new(agent_bin())
            .args(["plugin", "test"])
            .arg(repo().join("tasks/plugins").join(example))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{example}:\n{text}");
        assert!(text.contains("ok   idempotent") && text.contains("all checks passed"), "{text}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("counter.sh");
    let script = r#"#!/bin/sh
case "$1" in
describe) echo '{"name": "counter", "version": "0.1.0", "example_params": {}}' ;;
validate) echo '{"ok": true}' ;;
execute) cat >/dev/null; echo x >> "$APOLLO_WORK_DIR/n"; echo "{\"n\": $(wc -l < "$APOLLO_WORK_DIR/n")}" ;;
rollback) echo '{}' ;;
esac
"#;
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = std::process::Command::new(agent_bin()).args(["plugin", "test"]).arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("FAIL idempotent: NOT idempotent"), "{text}");
    // Held to the contract: a validate that does not answer in JSON, and a
    // version that is not semver, are refused saying so.
    let kit = |script: &str| {
        std::fs::write(&path, script).unwrap();
        let out = std::process::Command::new(agent_bin()).args(["plugin", "test"]).arg(&path).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string())
    };
    let (code, text) = kit(&script.replace("echo '{\"ok\": true}'", "echo looks fine to me"));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("FAIL validate: validate broke the plugin protocol (expected {\"ok\": true})"), "{text}");
    assert!(text.contains("it began: \"looks fine to me\""), "{text}");
    let (code, text) = kit(&script.replace("\"0.1.0\"", "\"1.0\""));
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(
            "FAIL describe: version \"1.0\" is not a semver version (expected MAJOR.MINOR.PATCH, such as \"1.0.0\")"
        ),
        "{text}"
    );
}

#[tokio::test]
async fn sighup_registers_new_and_changed_plugins() {
    let agent =
        Agent::builder().config("watch_tasks: false\n").plugin("greet.sh", &plugin("echo '{\"v\": 1}'")).start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Defs]).await.unwrap();
    let mut events = c.take_events().unwrap();
    // A new plugin, a new version of an old one, and a definition using both.
    let new = "#!/bin/sh\ncase \"$1\" in describe) echo '{\"version\": \"0.3.0\"}' ;; validate) echo '{\"ok\": true}' ;; *) cat >/dev/null; echo '{\"new\": true}' ;; esac\n";
    let greet2 = plugin("echo '{\"v\": 2}'").replace("\"1.0.0\"", "\"2.0.0\"");
    {
        use std::os::unix::fs::PermissionsExt;
        for (f, text) in [("fresh.sh", new.to_string()), ("greet.sh", greet2)] {
            let p = agent.path().join("tasks/plugins").join(f);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    std::fs::write(
        agent.path().join("tasks/both.yaml"),
        "task: both\nsteps:\n  - plugin: fresh\n  - plugin: greet\n    version: \"^2\"\n",
    )
    .unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.pid()), nix::sys::signal::Signal::SIGHUP).unwrap();
    loop {
        let ev = tokio::time::timeout(std::time::Duration::from_secs(30), events.recv()).await.unwrap().unwrap();
        if ev.kind() == EventKind::DefsReloaded {
            break;
        }
    }
    let (_, plugins) = agent.cli_json(&["plugins"]);
    let version = |n: &str| {
        plugins.as_array().unwrap().iter().find(|p| p["name"] == n).map(|p| p["version"].as_str().unwrap().to_string())
    };
    assert_eq!((version("fresh").as_deref(), version("greet").as_deref()), (Some("0.3.0"), Some("2.0.0")));
    let (code, inst) = agent.cli_json(&["run", "both", "--wait"]);
    assert_eq!(code, 0, "{inst:#}");
    assert_eq!(inst["steps"][1]["output"]["v"], 2);
}

/// A plugin copied into a watched tasks dir is registered without a signal,
/// and the definitions that use it load; a broken one is named with its
/// file and why; a removed one is gone.
#[tokio::test]
async fn a_plugin_dropped_into_the_tasks_dir_is_registered_without_a_signal() {
    use std::os::unix::fs::PermissionsExt;
    let agent = Agent::builder().task("m.yaml", &task("m", "maint", 0, 10)).start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Defs, Topic::Alerts]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let out = agent.cli(&["run", "m"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no task \"m\" is defined"), "not loaded: unknown plugin");
    let dir = agent.path().join("tasks/plugins");
    std::fs::create_dir_all(&dir).unwrap();
    // Written elsewhere and renamed in, as a copy or an install would.
    let staged = agent.path().join("maint.staged");
    std::fs::write(&staged, plugin("echo '{\"done\": true}'").replace("\"name\": \"t\"", "\"name\": \"maint\""))
        .unwrap();
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&staged, dir.join("maint.sh")).unwrap();
    wait_event(&mut events, "the definitions read again", |e| {
        e.kind() == EventKind::DefsReloaded && e.data.json()["errors"].as_array().is_some_and(|a| a.is_empty())
    })
    .await;
    let (code, inst) = agent.cli_json(&["run", "m", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (0, Some("SUCCESS")), "{inst:#}");
    // A file that cannot describe itself: an alert naming it, and a run says why.
    std::fs::write(dir.join("broken.sh"), "#!/bin/sh\necho not json\n").unwrap();
    std::fs::set_permissions(dir.join("broken.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let alert = wait_event(&mut events, "the plugin_error alert", |e| e.data.json()["kind"] == "plugin_error").await;
    assert!(alert.data.json()["message"].as_str().unwrap().contains("broken.sh"), "{alert:?}");
    std::fs::write(agent.path().join("tasks/b.yaml"), task("b", "broken", 0, 10)).unwrap();
    wait_event(&mut events, "b.yaml read", |e| {
        e.kind() == EventKind::DefsReloaded && e.data.json()["errors"].to_string().contains("is not usable")
    })
    .await;
    let (code, defs) = agent.cli_json(&["defs"]);
    assert_eq!(code, 1);
    let b = defs
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["file"].as_str().is_some_and(|f| f.ends_with("b.yaml")))
        .unwrap()
        .clone();
    assert!(b["errors"][0].as_str().unwrap().contains("plugin \"broken\" is not usable"), "{b:#}");
    // Removed: the definitions that use it no longer load.
    std::fs::remove_file(dir.join("maint.sh")).unwrap();
    wait_event(&mut events, "the plugins registered anew", |e| {
        e.kind() == EventKind::DefsReloaded
            && e.data.json()["errors"].to_string().contains("unknown plugin \\\"maint\\\"")
    })
    .await;
}

/// The original design's §3.1: `plugins_path` names where plugins are
/// registered from — one directory or several, in order (the first of a
/// name wins) — and each is watched as the tasks dir is.
#[tokio::test]
async fn plugins_load_from_every_directory_of_the_plugin_path_in_order_and_each_is_watched() {
    use std::os::unix::fs::PermissionsExt;
    let named = |name: &str, version: &str, out: &str| {
        plugin(&format!("echo '{out}'"))
            .replace("\"name\": \"t\"", &format!("\"name\": \"{name}\""))
            .replace("\"version\": \"1.0.0\"", &format!("\"version\": \"{version}\""))
    };
    let agent = Agent::builder()
        .config("plugins_path: [ops/first, /nonexistent/apollo-plugins, ops/second]\n")
        .task("both.yaml", "task: both\nsteps:\n  - plugin: alpha\n  - plugin: beta\n")
        .task("late.yaml", "task: late\nsteps:\n  - plugin: gamma\n");
    let put = |dir: &std::path::Path, file: &str, text: &str| {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
        std::fs::set_permissions(dir.join(file), std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    let (first, second) = (agent.path().join("ops/first"), agent.path().join("ops/second"));
    put(&first, "alpha.sh", &named("alpha", "1.0.0", "{\"from\": \"first\"}"));
    put(&second, "alpha.sh", &named("alpha", "9.0.0", "{\"from\": \"second\"}"));
    put(&second, "beta.sh", &named("beta", "2.0.0", "{\"b\": 2}"));
    // With a plugin path, `<tasks>/plugins` is not on it.
    put(&agent.path().join("tasks/plugins"), "inside.sh", &named("inside", "1.0.0", "{}"));
    let agent = agent.start();
    let (_, plugins) = agent.cli_json(&["plugins"]);
    let version = |n: &str| {
        plugins.as_array().unwrap().iter().find(|p| p["name"] == n).map(|p| p["version"].as_str().unwrap().to_string())
    };
    assert_eq!(
        (version("alpha").as_deref(), version("beta").as_deref()),
        (Some("1.0.0"), Some("2.0.0")),
        "{plugins:#}"
    );
    assert_eq!(version("inside"), None, "{plugins:#}");
    let (code, inst) = agent.cli_json(&["run", "both", "--wait"]);
    assert_eq!(code, 0, "{inst:#}");
    assert_eq!(inst["steps"][0]["output"]["from"], "first", "the first directory's alpha ran");
    assert!(agent.log().contains("is not registered: a plugin of that name comes first"), "{}", agent.log());
    // A plugin dropped into the second directory is registered without a signal.
    let c = agent.client().await;
    c.subscribe(&[Topic::Defs]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let staged = agent.path().join("gamma.staged");
    std::fs::write(&staged, named("gamma", "1.0.0", "{\"g\": 3}")).unwrap();
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&staged, second.join("gamma.sh")).unwrap();
    let mut seen = Vec::new();
    loop {
        let ev = tokio::time::timeout(std::time::Duration::from_secs(20), events.recv()).await;
        let Ok(Some(ev)) = ev else { panic!("gamma not registered: {seen:#?}\n{}", agent.log()) };
        if ev.kind() == EventKind::DefsReloaded && ev.data.json()["errors"].as_array().is_some_and(|a| a.is_empty()) {
            break;
        }
        seen.push(ev);
    }
    let (code, inst) = agent.cli_json(&["run", "late", "--wait"]);
    assert_eq!((code, inst["steps"][0]["output"]["g"].as_u64()), (0, Some(3)), "{inst:#}");
    // One directory alone may be written without a list.
    let one = Agent::builder().config("plugins_path: ops\n");
    put(&one.path().join("ops"), "solo.sh", &named("solo", "1.0.0", "{}"));
    let one = one.start();
    let (_, plugins) = one.cli_json(&["plugins"]);
    assert!(plugins.as_array().unwrap().iter().any(|p| p["name"] == "solo"), "{plugins:#}");
    // Anything else is refused, naming the field and what it takes.
    let bad = one.path().join("bad.yaml");
    std::fs::write(&bad, "plugins_path: {a: 1}\n").unwrap();
    let out = std::process::Command::new(agent_bin()).arg("--config").arg(&bad).arg("check").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(err.contains("plugins_path") && err.contains("a directory or a list of directories"), "{err}");
}
