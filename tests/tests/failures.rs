//! Failure handling: retries with growing delays, rollback in reverse order,
//! timeouts that kill a whole process group, permanent errors, cancel.

use apollo_shared::state::{StepState, TaskState};
use apollo_tests::*;
use serde_json::json;

const FAST_RETRIES: &str = "scheduler:\n  backoff_base: 200ms\n  kill_grace: 500ms\n";

#[tokio::test]
async fn a_failing_step_is_tried_one_plus_retry_times_then_everything_rolls_back_in_reverse() {
    let witness = "$APOLLO_WORK_DIR/../../witness";
    let agent = Agent::builder()
        .config(FAST_RETRIES)
        .task(
            "doomed.yaml",
            &format!(
                r#"task: doomed
steps:
  - name: a
    plugin: shell
    params:
      command: echo "run a" >> {witness}
      rollback_command: echo "rollback a" >> {witness}
  - name: b
    plugin: shell
    params:
      command: echo "run b" >> {witness}
      rollback_command: echo "rollback b" >> {witness}
  - name: c
    plugin: shell
    retry: 2
    params:
      command: echo "run c" >> {witness}; exit 3
      rollback_command: echo "rollback c" >> {witness}
"#
            ),
        )
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let id = trigger(&c, "doomed", json!({})).await;
    let inst = wait_until(&c, &mut events, &id, "the end", ended).await;
    assert_eq!(inst.state, TaskState::RolledBack, "{inst:#?}");
    let w = std::fs::read_to_string(agent.path().join("data/witness")).unwrap();
    let lines: Vec<&str> = w.lines().collect();
    assert_eq!(lines, ["run a", "run b", "run c", "run c", "run c", "rollback c", "rollback b", "rollback a"]);
    let steps = inst.steps.unwrap();
    assert_eq!(steps[2].attempts, 3);
    assert!(steps.iter().all(|s| s.state == StepState::RolledBack));
    // The delays between attempts of c grow.
    let starts: Vec<_> =
        inst.transitions.unwrap().iter().filter(|t| t.step == Some(2) && t.to == "RUNNING").map(|t| t.at).collect();
    assert_eq!(starts.len(), 3);
    let (d1, d2) = (starts[1] - starts[0], starts[2] - starts[1]);
    assert!(d1.num_milliseconds() >= 160, "first retry after {d1}");
    assert!(d2 > d1, "delays do not grow: {d1} then {d2}");
    assert!(inst.error.unwrap().contains("step \"c\" (#2) failed: command ended with exit code 3"));
}

fn processes_matching(pattern: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(pattern) {
                found.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
            }
        }
    }
    found
}

#[tokio::test]
async fn a_hanging_step_is_killed_at_its_timeout_with_everything_it_started() {
    // Unique durations let the test find the processes it caused.
    let agent = Agent::builder()
        .config(FAST_RETRIES)
        .task(
            "hang.yaml",
            r#"task: hang
on_failure: stop
steps:
  - plugin: shell
    timeout: 1
    retry: 0
    params:
      command: sh -c 'sleep 4321.5' & sleep 4321.25; echo never
"#,
        )
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let id = trigger(&c, "hang", json!({})).await;
    wait_until(&c, &mut events, &id, "the step to run", |i| i.steps.as_ref().unwrap()[0].state == StepState::Running)
        .await;
    let inst = wait_until(&c, &mut events, &id, "the end", ended).await;
    assert_eq!(inst.state, TaskState::Failed);
    let err = inst.steps.unwrap()[0].error.clone().unwrap();
    assert!(err.contains("timed out after 1s"), "{err}");
    let left = processes_matching("sleep 4321.");
    assert!(left.is_empty(), "processes survived the timeout: {left:?}");
}

#[tokio::test]
async fn a_permanent_error_is_not_retried() {
    let agent = Agent::builder()
        .config(FAST_RETRIES)
        .task(
            "perm.yaml",
            "task: perm\non_failure: stop\nsteps:\n  - plugin: data_parser\n    retry: 5\n    params:\n      input: /nonexistent/file.csv\n",
        )
        .start();
    let (code, inst) = agent.cli_json(&["run", "perm", "--wait"]);
    assert_eq!(code, 1);
    assert_eq!(inst["state"], "FAILED");
    assert_eq!(inst["steps"][0]["attempts"], 1);
    assert!(inst["error"].as_str().unwrap().contains("permanent error, not retried"), "{inst:#}");
}

#[tokio::test]
async fn cancel_stops_running_and_queued_instances_and_a_cancelled_one_can_be_retried() {
    let agent = Agent::builder()
        .config(FAST_RETRIES)
        .task(
            "slow.yaml",
            r#"task: slow
max_active: 1
params:
  seconds: {default: 30}
steps:
  - plugin: sleep
    params:
      seconds: "{{ params.seconds }}"
"#,
        )
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let id = trigger(&c, "slow", json!({})).await;
    wait_until(&c, &mut events, &id, "the step to run", |i| i.steps.as_ref().unwrap()[0].state == StepState::Running)
        .await;
    let (code, inst) = agent.cli_json(&["cancel", &id, "--reason", "wrong window"]);
    assert_eq!(code, 0, "{inst:#}");
    assert_eq!(inst["state"], "FAILED");
    assert!(inst["error"].as_str().unwrap().contains("wrong window"), "{inst:#}");
    // While one runs, max_active 1 keeps the next one queued; cancelling it
    // means it never runs.
    let (code, inst) = agent.cli_json(&["retry", &id]);
    assert_eq!(code, 0, "a cancelled instance is FAILED, so it may be retried: {inst:#}");
    assert_eq!(inst["state"], "RETRYING");
    wait_until(&c, &mut events, &id, "the retry to run", |i| i.state == TaskState::Running).await;
    let queued = trigger(&c, "slow", json!({"seconds": 0})).await;
    let q = operate(&c, OperatorAction::Cancel, &queued).await.unwrap();
    assert_eq!(q.state, TaskState::Failed);
    // Its step never ran and keeps its place, so a retry can resume it.
    assert_eq!(q.steps.unwrap()[0].state, StepState::Pending);
    assert!(q.transitions.unwrap().iter().all(|t| t.step.is_none()), "a step of the cancelled instance ran");
    let out = agent.cli(&["cancel", &id]);
    assert_eq!(out.status.code(), Some(0));
    // A FAILED instance cannot be cancelled again; the message says why.
    let out = agent.cli(&["cancel", &queued]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("only PENDING, RETRYING and RUNNING instances can be cancelled")
    );
    // Cancelled while queued, then retried: it runs to the end (it used to
    // stay RUNNING with no executor and block its task's max_active for good).
    let (code, inst) = agent.cli_json(&["retry", &queued]);
    assert_eq!(code, 0, "{inst:#}");
    let done = wait_until(&c, &mut events, &queued, "the retried instance to end", ended).await;
    assert_eq!(done.state, TaskState::Success, "{done:#?}");
    let next = trigger(&c, "slow", json!({"seconds": 0})).await;
    let done = wait_until(&c, &mut events, &next, "the next instance to end", ended).await;
    assert_eq!(done.state, TaskState::Success, "max_active is free again: {done:#?}");
    let alerts = alerts_text(&c).await;
    assert!(!alerts.to_string().contains("illegal_transition"), "no refused transition on the way: {alerts:#}");
}

#[test]
fn a_chatty_shell_step_is_not_blocked_by_its_own_output() {
    // More than a pipe's buffer on both streams: the agent must read while the command runs.
    let agent = Agent::builder()
        .config("logging:\n  step_log_bytes: 100000\n")
        .task(
            "chatty.yaml",
            "task: chatty\nsteps:\n  - plugin: shell\n    timeout: 20\n    params:\n      command: |\n        seq 1 500000; seq 1 500000 >&2; echo '{\"ok\": true}'\n",
        )
        .start();
    let (code, inst) = agent.cli_json(&["run", "chatty", "--wait"]);
    assert_eq!(code, 0, "{inst:#}");
    assert_eq!(inst["steps"][0]["output"]["result"]["ok"], true);
    assert!(inst["steps"][0]["output"]["stdout_tail"].as_str().unwrap().len() <= 4096);
}

#[tokio::test]
async fn a_hanging_rollback_is_stopped_at_the_timeout_and_leaves_the_instance_failed_with_an_alert() {
    let agent = Agent::builder()
        .config(FAST_RETRIES)
        .task(
            "stuck.yaml",
            r#"task: stuck
steps:
  - plugin: shell
    timeout: 1
    retry: 0
    params:
      command: exit 1
      rollback_command: sh -c 'sleep 4322.75' & sleep 4322.875
"#,
        )
        .start();
    let (code, inst) = agent.cli_json(&["run", "stuck", "--wait"]);
    assert_eq!(code, 1);
    assert_eq!(inst["state"], "FAILED", "{inst:#}");
    let err = inst["error"].as_str().unwrap();
    assert!(err.contains("rollback of step") && err.contains("rollback timed out after 1s"), "{err}");
    let (_, alerts) = agent.cli_json(&["alerts"]);
    assert!(alerts.as_array().unwrap().iter().any(|a| a["kind"] == "rollback_failed"), "{alerts:#}");
    // Its own durations: the other timeout test in this file looks for 4321.
    let left = processes_matching("sleep 4322.");
    assert!(left.is_empty(), "rollback processes survived: {left:?}");
}

#[tokio::test]
async fn a_retry_that_falls_due_while_every_slot_is_busy_runs_when_one_frees() {
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 1\n  backoff_base: 300ms\n")
        .task(
            "flaky.yaml",
            "task: flaky\nsteps:\n  - plugin: shell\n    retry: 1\n    params:\n      command: test -f tried || { touch tried; exit 1; }\n",
        )
        .task("busy.yaml", "task: busy\nsteps:\n  - plugin: sleep\n    params: {seconds: 1}\n")
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let flaky = trigger(&c, "flaky", json!({})).await;
    wait_until(&c, &mut events, &flaky, "the first failure", |i| i.state == TaskState::Retrying).await;
    // The only slot goes to a one-second task; the retry falls due meanwhile.
    let busy = trigger(&c, "busy", json!({})).await;
    wait_until(&c, &mut events, &busy, "the busy task to run", |i| i.state == TaskState::Running).await;
    let f = wait_until(&c, &mut events, &flaky, "the retry", ended).await;
    let b = get(&c, &busy).await;
    assert_eq!((f.state, b.state), (TaskState::Success, TaskState::Success));
    assert_eq!(f.steps.unwrap()[0].attempts, 2);
    assert!(f.finished_at.unwrap() >= b.finished_at.unwrap(), "the retry ran while the only slot was busy");
}

#[test]
fn the_work_dir_is_made_for_the_steps_that_use_it_and_a_failure_to_make_it_names_it() {
    let agent = Agent::builder()
        .task("quiet.yaml", "task: quiet\nsteps:\n  - plugin: sleep\n")
        .task(
            "files.yaml",
            "task: files\nsteps:\n  - {name: wait, plugin: sleep}\n  - {name: touch, plugin: shell, params: {command: touch here}}\n",
        )
        .start();
    let work = agent.path().join("data").join("work");
    let id = |inst: &serde_json::Value| inst["id"].as_str().unwrap().to_string();
    // Steps that never touch files get no work dir.
    let (code, quiet) = agent.cli_json(&["run", "quiet", "--wait"]);
    assert_eq!(code, 0, "{quiet:#}");
    assert!(!work.join(id(&quiet)).exists(), "an instance of sleep steps has no work dir");
    // A shell step runs in its instance's work dir, made before it.
    let (code, files) = agent.cli_json(&["run", "files", "--wait"]);
    assert_eq!(code, 0, "{files:#}");
    assert!(work.join(id(&files)).join("here").is_file());
    // A work dir that cannot be made fails the step that needs it, for good,
    // and says which dir; the step before it stays SUCCESS.
    std::fs::remove_dir_all(&work).unwrap();
    std::fs::write(&work, "not a directory").unwrap();
    let (_, failed) = agent.cli_json(&["run", "files", "--wait"]);
    let (_, inst) = agent.cli_json(&["show", &id(&failed)]);
    assert_eq!(inst["state"], "FAILED", "{inst:#}");
    assert_eq!(
        (inst["steps"][0]["state"].as_str(), inst["steps"][1]["state"].as_str()),
        (Some("SUCCESS"), Some("FAILED"))
    );
    let error = inst["steps"][1]["error"].as_str().unwrap();
    assert!(error.contains("cannot create the work dir") && error.contains(&work.display().to_string()), "{error}");
}
