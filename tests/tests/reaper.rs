//! The zombie reaper (the original design's §4.1): an instance RUNNING
//! longer than twice its expected time — its steps' p99 from history when
//! there is enough, else their timeouts — is marked FAILED, not retried,
//! with a `zombie_reaped` alert; one inside its expected time is left alone.

use apollo_shared::state::{StepState, TaskState};
use apollo_tests::*;
use serde_json::json;

/// Leases of 1 s: the reaper looks every third of a second; nothing is
/// reaped before it ran 1 s.
const FAST_REAPER: &str = "scheduler:\n  lease: 1s\n  zombie_min: 1s\n";

const STUCK: &str = r#"task: stuck
steps:
  - name: hang
    plugin: shell
    retry: 3
    timeout: 1
    params:
      command: echo $$ > $APOLLO_WORK_DIR/../../pid; exec sleep 60
"#;

#[tokio::test]
async fn a_step_whose_watchdog_never_fires_is_reaped_failed_and_not_retried() {
    let agent = Agent::builder()
        .config(FAST_REAPER)
        .task("stuck.yaml", STUCK)
        .env("FAILPOINTS", "step.no_watchdog=return")
        .start();
    let (c, mut events) = agent.watch().await;
    let id = trigger(&c, "stuck", json!({})).await;
    let inst = wait_until(&c, &mut events, &id, "the reaper", ended).await;
    // Not RETRYING (retry: 3): a zombie's step did who knows what.
    assert_eq!(inst.state, TaskState::Failed, "{inst:?}\n{}", agent.log());
    let step = &inst.steps.as_ref().unwrap()[0];
    assert_eq!((step.state, step.attempts), (StepState::Failed, 1), "{inst:?}");
    let error = inst.error.clone().unwrap_or_default();
    assert!(
        error.contains("reaped: RUNNING for")
            && error.contains("more than 2 × its expected 1s (the sum of its step timeouts)"),
        "{error}"
    );
    assert!(step.error.as_deref().unwrap_or_default().contains("reaped"), "{step:?}");
    let alerts = alerts_text(&c).await;
    assert!(alerts.contains("zombie_reaped") && alerts.contains(&id), "{alerts}");
    // Its process was stopped with it.
    let pid: i32 = std::fs::read_to_string(agent.path().join("data/pid")).unwrap().trim().parse().unwrap();
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err(),
        "the step's process {pid} still runs"
    );
    let out = String::from_utf8_lossy(&agent.cli(&["show", &id]).stdout).to_string();
    assert!(out.contains("reaped"), "{out}");
}

/// One step of `seconds`, with a timeout of 5 s.
fn paced(task: &str) -> String {
    format!(
        "task: {task}\nparams:\n  secs: {{default: 0}}\nsteps:\n  - name: work\n    plugin: sleep\n    timeout: 5\n    params:\n      seconds: \"{{{{ params.secs }}}}\"\n"
    )
}

#[tokio::test]
async fn a_slow_run_inside_its_expected_time_is_left_alone_and_history_sets_the_expectation() {
    let agent = Agent::builder()
        .config(FAST_REAPER)
        .task("fresh.yaml", &paced("fresh"))
        .task("learned.yaml", &paced("learned"))
        .start();
    let (c, mut events) = agent.watch().await;
    // No history: expected 5 s (the timeout), reaped after 10 s. A run of
    // 3 s, three times the floor, is healthy and left alone.
    let id = trigger(&c, "fresh", json!({"secs": 3})).await;
    let inst = wait_until(&c, &mut events, &id, "the slow run", ended).await;
    assert_eq!(inst.state, TaskState::Success, "{inst:?}\n{}", agent.log());
    assert!(!alerts_text(&c).await.contains("zombie_reaped"));
    // Twenty quick runs make a history: its p99 is a few milliseconds, so
    // the same 3 s run is now far beyond twice what is expected of it.
    let quick: Vec<String> = {
        let mut ids = Vec::new();
        for _ in 0..20 {
            ids.push(trigger(&c, "learned", json!({"secs": 0})).await);
        }
        ids
    };
    for id in &quick {
        let inst = wait_until(&c, &mut events, id, "a quick run", ended).await;
        assert_eq!(inst.state, TaskState::Success, "{inst:?}");
    }
    let id = trigger(&c, "learned", json!({"secs": 3})).await;
    let inst = wait_until(&c, &mut events, &id, "the reaper", ended).await;
    assert_eq!(inst.state, TaskState::Failed, "{inst:?}\n{}", agent.log());
    let error = inst.error.clone().unwrap_or_default();
    assert!(error.contains("(the sum of its steps' p99 over their recent runs)"), "{error}");
    let alerts = alerts_text(&c).await;
    assert!(alerts.contains("zombie_reaped") && alerts.contains(&id), "{alerts}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_an_instance_another_agent_holds_past_its_time_is_reaped_by_any_agent() {
    let schema = PgSchema::new("reaper");
    let task =
        "task: held\nsteps:\n  - name: hang\n    plugin: sleep\n    timeout: 1\n    params:\n      seconds: 60\n";
    let conf = |name: &str| format!("{}agent:\n  name: {name}\n{FAST_REAPER}", schema.config());
    // Agent a runs the step with neither its watchdog nor its reaper: the
    // instance stays RUNNING there, its lease renewed.
    let a = Agent::builder()
        .config(&conf("a"))
        .task("held.yaml", task)
        .env("FAILPOINTS", "step.no_watchdog=return;reaper.off=return")
        .start();
    let (c, mut events) = a.watch().await;
    let id = trigger(&c, "held", json!({})).await;
    let running =
        |i: &apollo_shared::protocol::Instance| i.steps.as_ref().is_some_and(|s| s[0].state == StepState::Running);
    wait_until(&c, &mut events, &id, "the step to run on a", running).await;
    let b = Agent::builder().config(&conf("b")).task("held.yaml", task).start();
    let inst = wait_until(&c, &mut events, &id, "b's reaper", ended).await;
    assert_eq!(inst.state, TaskState::Failed, "{inst:?}\n{}\n{}", a.log(), b.log());
    let error = inst.error.clone().unwrap_or_default();
    assert!(
        error.contains("more than 2 × its expected 1s") && error.contains(&format!("held by agent:a:{}", a.pid())),
        "{error}"
    );
    assert_eq!(inst.lease_owner, None, "{inst:?}");
    let reaper = inst.transitions.as_ref().unwrap().iter().rev().find(|t| t.to == "FAILED" && t.step.is_none());
    assert!(reaper.is_some_and(|t| t.actor.starts_with("agent:b:")), "{inst:?}");
    let alerts = alerts_text(&c).await;
    assert!(alerts.contains("zombie_reaped") && alerts.contains(&id), "{alerts}");
    // A's stuck executor cannot take it back: its lease is not renewed.
    let row = schema.sql(&format!("SELECT state, lease_owner FROM task_instances WHERE id = '{id}'"));
    assert_eq!(row, vec![vec![Some("FAILED".to_string()), None]]);
}
