//! A panic anywhere in a step — inside a plugin (a built-in's code or a
//! library's), or in the executor around it — is a failed step with the
//! panic's message, never an instance left RUNNING with nobody on it.

use apollo_tests::*;
use serde_json::Value;
use std::time::Duration;

const BOOM: &str = r#"task: boom
steps:
  - name: first
    plugin: shell
    params:
      command: echo first >> $APOLLO_WORK_DIR/../../witness
      rollback_command: echo undo first >> $APOLLO_WORK_DIR/../../witness
  - name: crash
    plugin: shell
    retry: 3
    params:
      command: echo crash >> $APOLLO_WORK_DIR/../../witness
"#;

fn witness(agent: &Agent) -> String {
    std::fs::read_to_string(agent.path().join("data/witness")).unwrap_or_default()
}

fn run_wait(agent: &Agent, task: &str) -> (i32, Value) {
    let out = agent.cli_within(&["run", task, "--wait", "--json"], Duration::from_secs(60));
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", String::from_utf8_lossy(&out.stdout), agent.log()));
    (out.status.code().unwrap_or(-1), v)
}

#[tokio::test]
async fn a_panicking_plugin_fails_its_step_once_and_the_instance_follows_its_policy() {
    let mut agent =
        Agent::builder().task("boom.yaml", BOOM).env("FAILPOINTS", "shell.execute=1*off->panic(disk on fire)").start();
    let (code, inst) = run_wait(&agent, "boom");
    assert_eq!(code, 1, "{inst:#}");
    // The default policy rolls back: the step that panicked was not retried
    // (retry: 3), and the step before it was undone.
    assert_eq!(inst["state"], "ROLLED_BACK", "{inst:#}");
    let crash = &inst["steps"][1];
    assert_eq!(crash["attempts"], 1, "a panic is a bug, not a transient fault: {inst:#}");
    let error = crash["error"].as_str().unwrap_or_default();
    assert!(error.contains("plugin shell panicked: disk on fire"), "{error}");
    assert!(inst["error"].as_str().unwrap_or_default().contains("plugin shell panicked: disk on fire"), "{inst:#}");
    assert_eq!(witness(&agent), "first\nundo first\n");
    let c = agent.client().await;
    let alerts = alerts_text(&c).await;
    assert!(alerts.contains("plugin_panicked") && alerts.contains("panicked: disk on fire"), "{alerts}");
    // The agent goes on: it answers, and runs the next instance's first step.
    assert!(status(&c).await.is_ok());
    drop(c);
    // A restart does not run the step again.
    let id = inst["id"].as_str().unwrap().to_string();
    agent.stop();
    agent.env.clear();
    agent.spawn();
    let c = agent.client().await;
    let after = get(&c, &id).await;
    assert_eq!(after.state, apollo_shared::state::TaskState::RolledBack);
    assert_eq!(after.steps.unwrap()[1].attempts, 1);
    assert_eq!(witness(&agent), "first\nundo first\n");
}

#[test]
fn a_panic_in_the_executor_fails_the_instance_instead_of_stranding_it() {
    let agent =
        Agent::builder().task("boom.yaml", BOOM).env("FAILPOINTS", "executor.after_step=panic(executor bug)").start();
    let (code, inst) = run_wait(&agent, "boom");
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    let error = inst["error"].as_str().unwrap_or_default();
    assert!(error.contains("the executor panicked: executor bug"), "{error}");
    let out = agent.cli(&["status"]);
    assert!(out.status.success(), "the agent still answers");
    let out = String::from_utf8_lossy(&agent.cli(&["alerts"]).stdout).to_string();
    assert!(out.contains("plugin_panicked"), "{out}");
}
