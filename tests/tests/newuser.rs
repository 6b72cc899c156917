//! What a new user meets after the first runbook: an agent started in a
//! project directory (no `--tasks`, as the README starts it) reloads new,
//! edited and deleted files by itself, and `apollo-agent check` refuses a
//! param the plugin does not take even beside a template.

use apollo_shared::protocol::{EventKind, Topic};
use apollo_tests::*;
use serde_json::{json, Value};

async fn next_reload(events: &mut tokio::sync::mpsc::Receiver<apollo_shared::protocol::Event>) -> Value {
    loop {
        let ev = tokio::time::timeout(std::time::Duration::from_secs(20), events.recv())
            .await
            .expect("no reload within 20s: the watcher did not see the change")
            .expect("connection closed");
        if ev.kind() == EventKind::DefsReloaded {
            return ev.data.json();
        }
    }
}

#[tokio::test]
async fn an_agent_started_in_a_project_directory_reloads_new_edited_and_deleted_files() {
    // The harness starts the agent in its directory with no `--tasks`: the
    // tasks directory is the relative `tasks` of the project.
    let agent = Agent::builder().task("a.yaml", "task: a\nsteps:\n  - plugin: sleep\n").start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Defs]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let file = agent.path().join("tasks/b.yaml");

    std::fs::write(&file, "task: b\nsteps:\n  - plugin: sleep\n").unwrap();
    let change = next_reload(&mut events).await;
    assert_eq!(change["changed"], json!(["b"]), "{change:#}");
    assert_eq!(agent.cli(&["run", "b"]).status.code(), Some(0));
    let hash_of_b = || {
        let (_, defs) = agent.cli_json(&["defs"]);
        defs.as_array().unwrap().iter().find(|d| d["task"] == "b").map(|d| d["hash"].clone()).unwrap_or_default()
    };
    let first = hash_of_b();

    std::fs::write(&file, "task: b\nsteps:\n  - name: edited\n    plugin: sleep\n").unwrap();
    let change = loop {
        let change = next_reload(&mut events).await;
        if change["changed"] == json!(["b"]) {
            break change;
        }
    };
    assert_eq!(change["changed"], json!(["b"]));
    assert_ne!(hash_of_b(), first, "the edited version is in force");

    std::fs::remove_file(&file).unwrap();
    let change = loop {
        let change = next_reload(&mut events).await;
        if change["removed"] == json!(["b"]) {
            break change;
        }
    };
    assert_eq!(change["removed"], json!(["b"]));
    assert_eq!(agent.cli(&["run", "b"]).status.code(), Some(1), "a deleted file's task is disabled");
}

const TEMPLATED_URL: &str = r#"task: health
params:
  port: {default: "8080"}
steps:
  - name: health
    plugin: http
    params:
      url: "http://127.0.0.1:{{ params.port }}/health"
      expect_code: [200]
"#;

const EXTERNAL: &str = r#"task: ext
steps:
  - name: register
    plugin: inventory
    params:
      host: "{{ task_id }}"
      hots: web-1
"#;

#[test]
fn check_refuses_a_param_the_plugin_does_not_take_beside_a_template() {
    let agent = Agent::builder()
        .task("health.yaml", TEMPLATED_URL)
        .plugin(
            "inventory",
            "#!/bin/sh\ncase \"$1\" in describe) echo '{\"version\": \"1.0.0\", \"params\": [{\"name\": \"host\", \"type\": \"string\", \"required\": true}]}' ;; validate) echo '{\"ok\": true}' ;; *) cat >/dev/null; echo '{}' ;; esac\n",
        )
        .task("ext.yaml", EXTERNAL)
        .start();
    let out = std::process::Command::new(agent_bin()).current_dir(agent.path()).arg("check").output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains("health.yaml: line 5: steps[0].params: unknown parameter \"expect_code\" of the http plugin (did you mean \"expect_status\"?"),
        "{report}"
    );
    assert!(report.contains("unknown parameter \"hots\" of the inventory plugin (did you mean \"host\"?"), "{report}");
    // The running agent refused the same files: nothing can start half-way.
    let run = agent.cli(&["run", "health"]);
    assert_eq!(run.status.code(), Some(1));
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(said.contains("expect_code"), "{said}");
}

#[test]
fn dry_run_prints_a_script_as_its_lines_and_an_approval_with_its_own_timeout() {
    let task = "task: heal\nsteps:\n  - name: gate\n    plugin: approval\n    params:\n      message: restart?\n      \
                timeout: 1h\n  - name: restart\n    plugin: shell\n    params:\n      command: |\n        \
                echo one\n        echo two\n  - name: open\n    plugin: approval\n    params: {message: ok?}\n";
    let agent = Agent::builder().task("heal.yaml", task).start();
    let out = agent.cli(&["dry-run", "heal"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("      timeout: 3600s (the approval's timeout: it waits this long for a decision, then denies)"),
        "{text}"
    );
    assert!(text.contains("      timeout: none (the approval waits until someone decides"), "{text}");
    assert!(text.contains("      params:\n        command: |\n          echo one\n          echo two\n"), "{text}");
    assert!(!text.contains("\\n"), "no escaped newline: {text}");
}

#[test]
fn a_failed_http_step_writes_its_request_status_headers_and_body_to_its_log() {
    let port =
        http_responder("404 Not Found", "application/json", "{\"error\": \"no such host\",\n\"host\": \"web-7\"}");
    let task = format!(
        "task: probe\nsteps:\n  - name: health\n    plugin: http\n    params:\n      url: http://127.0.0.1:{port}/health\n"
    );
    let agent = Agent::builder().task("probe.yaml", &task).start();
    let (_, inst) = agent.cli_json(&["run", "probe", "--wait"]);
    assert_eq!(inst["state"], "ROLLED_BACK", "the step failed: {inst}");
    let id = inst["id"].as_str().unwrap();
    let out = agent.cli(&["logs", id, "--step", "health"]);
    let log = String::from_utf8_lossy(&out.stdout);
    for line in [
        &format!("> GET http://127.0.0.1:{port}/health") as &str,
        "< HTTP 404 Not Found",
        "< content-type: application/json",
        "< {\"error\": \"no such host\",",
        "< \"host\": \"web-7\"}",
    ] {
        assert!(log.contains(line), "{line:?} not in the step log:\n{log}");
    }
}

/// Three steps that each append to the witness, and undo by appending too.
fn undoable(w: &std::path::Path, last_undo: bool) -> String {
    let mut t = String::from("task: restart\nsteps:\n");
    for (n, name) in ["drain", "restart", "undrain"].iter().enumerate() {
        t.push_str(&format!(
            "  - name: {name}\n    plugin: shell\n    params:\n      command: echo do-{name} >> {w}\n",
            w = w.display()
        ));
        if n < 2 || last_undo {
            t.push_str(&format!("      rollback_command: echo undo-{name} >> {w}\n", w = w.display()));
        }
    }
    t
}

#[test]
fn a_success_is_rolled_back_step_by_step_in_reverse_with_a_reason_when_every_step_can_be_undone() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("witness");
    let agent = Agent::builder()
        .task("restart.yaml", &undoable(&w, true))
        .task("partial.yaml", &undoable(&dir.path().join("other"), false).replace("task: restart", "task: partial"))
        .start();
    let (_, inst) = agent.cli_json(&["run", "restart", "--wait"]);
    assert_eq!(inst["state"], "SUCCESS", "{inst}");
    let id = inst["id"].as_str().unwrap().to_string();

    // Undoing a success says why.
    let out = agent.cli(&["rollback", &id, "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("succeeded: undoing it needs a reason"), "{said}");

    let (code, done) = agent.cli_json(&["rollback", &id, "--yes", "--wait", "--reason", "the restart proved bad"]);
    assert_eq!((code, done["state"].as_str()), (0, Some("ROLLED_BACK")), "{done:#}");
    let lines: Vec<String> = std::fs::read_to_string(&w).unwrap().lines().map(String::from).collect();
    let undo: Vec<&str> = lines.iter().skip(3).map(String::as_str).collect();
    assert_eq!(undo, ["undo-undrain", "undo-restart", "undo-drain"], "in reverse: {lines:?}");
    let (_, shown) = agent.cli_json(&["show", &id]);
    let history = shown["transitions"].to_string();
    assert!(history.contains("rollback requested: the restart proved bad"), "{history}");
    assert!(shown["steps"].as_array().unwrap().iter().all(|s| s["state"] == "ROLLED_BACK"), "{shown:#}");

    // A success one of whose steps cannot be undone is refused, naming it, and left as it was.
    let (_, inst) = agent.cli_json(&["run", "partial", "--wait"]);
    let id = inst["id"].as_str().unwrap().to_string();
    let out = agent.cli(&["rollback", &id, "--yes", "--reason", "bad"]);
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("undrain (#2, shell: no rollback_command) cannot be rolled back"), "{said}");
    assert_eq!(agent.cli_json(&["show", &id]).1["state"], "SUCCESS");
    assert!(!std::fs::read_to_string(dir.path().join("other")).unwrap().contains("undo"));
}

#[test]
fn check_shows_a_misindented_key_with_a_caret_and_warns_of_an_unset_secret() {
    let bad = "task: heal\nsteps:\n  - plugin: shell\n    params:\n      command: echo a\n     retry: 2\n";
    let secret = "task: deploy\nsecrets:\n  token: {env: APOLLO_TEST_UNSET_TOKEN}\nsteps:\n  - plugin: shell\n    \
                  params:\n      command: \"echo {{ secrets.token }}\"\n";
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("tasks")).unwrap();
    std::fs::write(dir.path().join("tasks/heal.yaml"), bad).unwrap();
    std::fs::write(dir.path().join("tasks/deploy.yaml"), secret).unwrap();
    let out = std::process::Command::new(agent_bin())
        .current_dir(dir.path())
        .arg("check")
        .env_remove("APOLLO_CONFIG")
        .env_remove("APOLLO_TEST_UNSET_TOKEN")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("heal.yaml: line 6:") && text.contains("likely a key indented more or less"), "{text}");
    assert!(text.contains("\n  6 |      retry: 2\n    |      ^"), "the line and a caret under the key: {text}");
    let warning = "deploy.yaml: line 3: secrets.token: warning: secret token: environment variable \
                   APOLLO_TEST_UNSET_TOKEN is not set in the agent's environment: `apollo run deploy` is refused";
    assert!(text.contains(warning), "{text}");
    assert!(text.contains("1 problem(s), 1 warning(s)"), "a warning is not a problem: {text}");
}

#[test]
fn usage_errors_under_json_are_json_on_stdout() {
    let agent = Agent::builder().start();
    for args in [&["--json", "ls", "--state", "nope"][..], &["--json", "run"][..]] {
        let out = agent.cli(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let said: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
        assert!(said["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{said:#}");
    }
}

#[test]
fn run_wait_says_who_decides_an_approval_and_how() {
    let task =
        "task: gated\nsteps:\n  - name: gate\n    plugin: approval\n    params: {message: go?}\n  - plugin: sleep\n";
    let agent = Agent::builder().task("gated.yaml", task).start();
    let mut child = std::process::Command::new(cli_bin())
        .current_dir(agent.path())
        .args(["--socket", &agent.socket.display().to_string(), "run", "gated", "--wait"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut said = Vec::new();
    for line in std::io::BufRead::lines(stderr) {
        let line = line.unwrap();
        said.push(line.clone());
        if line.contains("decide with: apollo approve") {
            let id = line.split_whitespace().nth(4).unwrap().to_string();
            assert_eq!(agent.cli(&["approve", &id, "--reason", "go"]).status.code(), Some(0));
        }
    }
    assert!(child.wait().unwrap().success(), "{said:#?}");
    let text = said.join("\n");
    assert!(text.contains("waiting for approval of step gate"), "{text}");
    assert!(text.contains("decide with: apollo approve ") && text.contains("--reason TEXT"), "{text}");
}

#[test]
fn retry_and_rollback_wait_print_only_what_happens_now_and_every_attempt_has_its_heading() {
    let task = "task: flaky\non_failure: stop\nsteps:\n  - name: a\n    plugin: shell\n    params:\n      \
                command: echo a\n      rollback_command: echo undo-a\n  - name: b\n    plugin: shell\n    retry: 0\n    \
                params:\n      command: test -f ../../ok\n";
    let agent = Agent::builder().task("flaky.yaml", task).start();
    let (_, failed) = agent.cli_json(&["run", "flaky", "--wait"]);
    assert_eq!(failed["state"], "FAILED", "{failed}");
    let id = failed["id"].as_str().unwrap().to_string();
    std::fs::write(agent.path().join("data/ok"), "").unwrap();
    let out = agent.cli(&["retry", &id, "--wait"]);
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(!said.contains("FAILED"), "the old results are not replayed: {said}");
    let both = said.clone() + &String::from_utf8_lossy(&out.stdout);
    let ends = both.lines().filter(|l| l.starts_with("SUCCESS flaky")).count();
    assert_eq!(ends, 1, "the final state once: {both}");
    // The retried step printed nothing, and its attempt still has its heading.
    let logs = String::from_utf8_lossy(&agent.cli(&["logs", &id]).stdout).to_string();
    assert!(logs.contains("[apollo: step b, attempt 2]"), "{logs}");

    // A rollback's log names the step it undoes.
    std::fs::remove_file(agent.path().join("data/ok")).unwrap();
    let (_, failed) = agent.cli_json(&["run", "flaky", "--wait"]);
    let id = failed["id"].as_str().unwrap().to_string();
    let out = agent.cli(&["rollback", &id, "--wait", "--yes", "--reason", "undo"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let logs = String::from_utf8_lossy(&agent.cli(&["logs", &id, "--step", "a"]).stdout).to_string();
    assert!(logs.contains("[apollo: rollback of step a]") && logs.contains("undo-a"), "{logs}");
}

#[test]
fn a_step_whose_condition_is_false_is_skipped_with_it_and_a_true_one_runs() {
    let task = "task: heal\nparams:\n  force: {default: false}\nsteps:\n  - name: check\n    plugin: shell\n    \
                params: {command: 'echo healthy'}\n  - name: restart\n    plugin: shell\n    \
                when: \"{{ params.force or (steps.check.stdout_tail | trim) != 'healthy' }}\"\n    \
                params: {command: 'echo restarted >> ../../witness'}\n  - name: report\n    plugin: shell\n    \
                when: \"{{ steps.check.exit_code == 0 }}\"\n    params: {command: 'echo reported >> ../../witness'}\n";
    let agent = Agent::builder().task("heal.yaml", task).start();
    let (code, inst) = agent.cli_json(&["run", "heal", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (0, Some("SUCCESS")), "{inst:#}");
    let steps = inst["steps"].as_array().unwrap();
    assert_eq!(steps[1]["state"], "SKIPPED", "{inst:#}");
    assert_eq!(steps[2]["state"], "SUCCESS", "{inst:#}");
    let history = inst["transitions"].to_string();
    assert!(
        history.contains("when: {{ params.force or (steps.check.stdout_tail | trim) != 'healthy' }} was false"),
        "{history}"
    );
    let witness = std::fs::read_to_string(agent.path().join("data/witness")).unwrap();
    assert_eq!(witness, "reported\n");

    // With the param, the condition holds and the step runs.
    let (_, inst) = agent.cli_json(&["run", "heal", "-p", "force=true", "--wait"]);
    assert_eq!(inst["steps"][1]["state"], "SUCCESS", "{inst:#}");
    assert_eq!(std::fs::read_to_string(agent.path().join("data/witness")).unwrap(), "reported\nrestarted\nreported\n");

    // A condition that reads a step that does not come before is refused at load, on its line.
    let bad = task.replace("steps.check.exit_code", "steps.later.exit_code");
    std::fs::write(agent.path().join("tasks/bad.yaml"), bad.replace("task: heal", "task: bad")).unwrap();
    let out = std::process::Command::new(agent_bin()).current_dir(agent.path()).arg("check").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("bad.yaml: line 14: steps[2].when:") && text.contains("later"), "{text}");
}

#[test]
fn a_condition_that_is_neither_true_nor_false_fails_the_instance_naming_it_and_a_retry_keeps_a_skip() {
    // `params.mode` renders to text: neither true nor false.
    let task = "task: odd\nparams:\n  mode: {default: fast}\non_failure: stop\nsteps:\n  - name: first\n    plugin: sleep\n    \
                when: \"{{ params.mode == 'slow' }}\"\n  - name: second\n    plugin: sleep\n    \
                when: \"{{ params.mode }}\"\n";
    let agent = Agent::builder().task("odd.yaml", task).start();
    let (code, inst) = agent.cli_json(&["run", "odd", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    let error = inst["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("step \"second\" (#1): when: \"{{ params.mode }}\" rendered \"fast\", expected true or false"),
        "{error}"
    );
    assert_eq!(inst["steps"][0]["state"], "SKIPPED", "{inst:#}");
    // A retry does not decide the first step again: it stays SKIPPED, and the
    // second fails the same way.
    let id = inst["id"].as_str().unwrap();
    let (_, again) = agent.cli_json(&["retry", id, "--wait"]);
    assert_eq!(again["state"], "FAILED", "{again:#}");
    assert_eq!(again["steps"][0]["state"], "SKIPPED", "{again:#}");
    let skips = again["transitions"].as_array().unwrap().iter().filter(|t| t["to"] == "SKIPPED").count();
    assert_eq!(skips, 1, "decided once: {again:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_before_the_watch_starts_is_loaded_all_the_same() {
    // The watch starts 1.5 s after the agent answers: the file is written
    // in between, where no watcher can see it.
    let agent = Agent::builder()
        .task("a.yaml", "task: a\nsteps:\n  - plugin: sleep\n")
        .env("FAILPOINTS", "reload.before_watch=sleep(1500)")
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Defs]).await.unwrap();
    let mut events = c.take_events().unwrap();
    std::fs::write(agent.path().join("tasks/early.yaml"), "task: early\nsteps:\n  - plugin: sleep\n").unwrap();
    let change = next_reload(&mut events).await;
    assert_eq!(change["changed"], json!(["early"]), "{change:#}");
    assert_eq!(agent.cli(&["run", "early"]).status.code(), Some(0));
}

#[test]
fn a_success_whose_undo_fails_is_left_failed_with_the_step_named_and_no_other_write_fails_a_success() {
    let task = "task: restart\nsteps:\n  - name: a\n    plugin: shell\n    params:\n      command: echo a\n      \
                rollback_command: echo undo-a\n  - name: b\n    plugin: shell\n    params:\n      command: echo b\n      \
                rollback_command: exit 3\n";
    let agent = Agent::builder().task("restart.yaml", task).start();
    let (_, inst) = agent.cli_json(&["run", "restart", "--wait"]);
    let id = inst["id"].as_str().unwrap().to_string();
    let (code, done) = agent.cli_json(&["rollback", &id, "--yes", "--wait", "--reason", "bad"]);
    assert_eq!((code, done["state"].as_str()), (1, Some("FAILED")), "{done:#}");
    assert!(done["error"].as_str().unwrap_or_default().contains("rollback of step \"b\" (#1) failed"), "{done:#}");
    let history = done["transitions"].to_string();
    assert!(history.contains(r#""from":"SUCCESS","to":"FAILED""#), "{history}");
    // The table itself still refuses SUCCESS -> FAILED to anyone else.
    let e = apollo_shared::state::check_task(
        apollo_shared::state::TaskState::Success,
        apollo_shared::state::TaskState::Failed,
    );
    assert!(e.is_err());
}
