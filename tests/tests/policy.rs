//! Per-step failure policy (`on_failure: continue | stop | rollback` on a
//! step as well as on the task): a notification step that fails after its
//! retries does not roll back the restart before it; the instance ends
//! SUCCESS and says it has a failed step wherever it is listed; a crash right
//! after the let-through does not run the failed step again.

use apollo_shared::state::{StepState, TaskState};
use apollo_tests::*;
use serde_json::json;
use std::time::Duration;

fn restart(task: &str, retry: u32) -> String {
    let w = "$APOLLO_WORK_DIR/../../witness";
    format!(
        r#"task: {task}
steps:
  - name: restart
    plugin: shell
    params:
      command: echo restart >> {w}
      rollback_command: echo undo restart >> {w}
  - name: notify
    plugin: shell
    retry: {retry}
    on_failure: continue
    params:
      command: echo notify >> {w}; echo pager down >&2; exit 1
  - name: verify
    plugin: shell
    params:
      command: echo verify >> {w}
"#
    )
}

fn witness(agent: &Agent) -> String {
    std::fs::read_to_string(agent.path().join("data/witness")).unwrap_or_default()
}

#[test]
fn a_failing_step_with_on_failure_continue_leaves_the_instance_success_with_one_failed_step() {
    let agent = Agent::builder()
        .config("scheduler:\n  backoff_base: 50ms\n")
        .task("restart.yaml", &restart("restart", 1))
        .start();
    let (code, inst) = agent.cli_json(&["run", "restart", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (0, Some("SUCCESS")), "{inst:#}");
    assert_eq!(inst["failed_steps"], 1, "{inst:#}");
    let notify = &inst["steps"][1];
    assert_eq!((notify["state"].as_str(), notify["attempts"].as_u64()), (Some("FAILED"), Some(2)), "{inst:#}");
    assert_eq!(notify["passed"], true);
    assert!(notify["error"].as_str().unwrap_or_default().contains("pager down"), "{notify:#}");
    assert_eq!(inst["steps"][2]["state"], "SUCCESS");
    // Retried once, then let through; nothing rolled back.
    assert_eq!(witness(&agent), "restart\nnotify\nnotify\nverify\n");
    let id = inst["id"].as_str().unwrap();
    let listed = String::from_utf8_lossy(&agent.cli(&["ls"]).stdout).to_string();
    assert!(listed.contains("1 failed step let through (on_failure: continue)"), "{listed}");
    let shown = String::from_utf8_lossy(&agent.cli(&["show", id]).stdout).to_string();
    assert!(
        shown.contains("1 failed step let through") && shown.contains("let through (on_failure: continue)"),
        "{shown}"
    );
}

#[tokio::test]
async fn a_crash_right_after_a_let_through_does_not_run_the_failed_step_again() {
    let mut agent = Agent::builder().task("restart.yaml", &restart("restart", 0)).start();
    agent.kill9();
    agent.spawn_with(&[("FAILPOINTS", "executor.after_failure_commit=return")]);
    let id = {
        let c = agent.client().await;
        trigger(&c, "restart", json!({})).await
    };
    let status = agent.wait_exit(Duration::from_secs(60));
    assert!(!status.success() && agent.log().contains("crashing at fail point"), "{}", agent.log());
    assert_eq!(witness(&agent), "restart\nnotify\n");
    agent.spawn();
    let (c, mut events) = agent.watch().await;
    let inst = wait_until(&c, &mut events, &id, "the resumed instance", ended).await;
    assert_eq!((inst.state, inst.failed_steps), (TaskState::Success, 1), "{inst:?}");
    let steps = inst.steps.unwrap();
    assert_eq!((steps[1].state, steps[1].attempts, steps[1].passed), (StepState::Failed, 1, true));
    assert_eq!(witness(&agent), "restart\nnotify\nverify\n", "notify ran once");
}

const HALTS: &str = r#"task: halts
on_failure: stop
steps:
  - name: drain
    plugin: shell
    params:
      command: echo drain >> $APOLLO_WORK_DIR/../../witness
  - name: flaky
    plugin: shell
    retry: 0
    params:
      command: echo flaky >> $APOLLO_WORK_DIR/../../witness; exit 1
  - name: undrain
    plugin: shell
    params:
      command: echo undrain >> $APOLLO_WORK_DIR/../../witness
"#;

#[tokio::test]
async fn skip_marks_a_failed_step_done_by_hand_and_the_instance_continues_from_the_next() {
    let agent = Agent::builder().task("halts.yaml", HALTS).start();
    let (code, inst) = agent.cli_json(&["run", "halts", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    let id = inst["id"].as_str().unwrap().to_string();
    // Refused where the table does not allow it, saying why.
    let refused = agent.cli(&["skip", &id, "drain", "--reason", "x"]);
    let err = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(!refused.status.success() && err.contains("step #0 cannot be skipped") && err.contains("SUCCESS"), "{err}");
    let refused = agent.cli(&["skip", &id, "nope", "--reason", "x"]);
    let err = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(err.contains("has no step \"nope\" (its steps: drain (#0), flaky (#1), undrain (#2))"), "{err}");
    assert!(!agent.cli(&["skip", &id, "flaky"]).status.success(), "a reason is required");

    let (c, mut events) = agent.watch().await;
    let out = agent.cli(&["skip", &id, "flaky", "--reason", "ran it by hand"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let done = wait_until(&c, &mut events, &id, "the instance to resume", ended).await;
    assert_eq!(done.state, TaskState::Success, "{done:?}");
    let steps = done.steps.as_ref().unwrap();
    assert_eq!((steps[1].state, steps[1].attempts, steps[2].state), (StepState::Skipped, 1, StepState::Success));
    assert_eq!(witness(&agent), "drain\nflaky\nundrain\n", "flaky did not run again");
    let row = done.transitions.as_ref().unwrap().iter().find(|t| t.step == Some(1) && t.to == "SKIPPED").cloned();
    let row = row.expect("the skip is in the history");
    assert!(row.reason == "skipped by hand: ran it by hand" && !row.actor.starts_with("agent:"), "{row:?}");
    let audit = String::from_utf8_lossy(&agent.cli(&["audit"]).stdout).to_string();
    assert!(audit.contains("skipped by hand: ran it by hand"), "{audit}");
    // Once SUCCESS, there is nothing to skip.
    let err = String::from_utf8_lossy(&agent.cli(&["skip", &id, "flaky", "--reason", "x"]).stderr).to_string();
    assert!(err.contains("only a FAILED instance's failed step can be skipped"), "{err}");
}

const HOLD: &str = r#"task: failover
steps:
  - name: promote
    plugin: shell
    on_interrupt: hold
    params:
      command: echo promote >> $APOLLO_WORK_DIR/../../witness; [ -f $APOLLO_WORK_DIR/../../again ] || sleep 60
      rollback_command: echo undo >> $APOLLO_WORK_DIR/../../witness
"#;

#[tokio::test]
async fn a_hold_step_interrupted_by_kill_9_is_not_run_again_until_an_operator_retries() {
    let mut agent = Agent::builder().task("failover.yaml", HOLD).start();
    let id = {
        let (c, mut events) = agent.watch().await;
        let id = trigger(&c, "failover", json!({})).await;
        let running =
            |i: &apollo_shared::protocol::Instance| i.steps.as_ref().is_some_and(|s| s[0].state == StepState::Running);
        wait_until(&c, &mut events, &id, "the step to run", running).await;
        id
    };
    while witness(&agent).is_empty() {
        std::thread::sleep(Duration::from_millis(20));
    }
    agent.kill9();
    agent.spawn();
    let (c, mut events) = agent.watch().await;
    let inst = wait_until(&c, &mut events, &id, "the hold", ended).await;
    assert_eq!(inst.state, TaskState::Failed, "{inst:?}\n{}", agent.log());
    let error = inst.error.clone().unwrap_or_default();
    assert!(
        error.contains("was interrupted while it ran and has on_interrupt: hold, so it was not run again")
            && error.contains(&format!("`apollo retry {id}` runs it again")),
        "{error}"
    );
    assert!(inst.steps.as_ref().unwrap()[0].error.as_deref().unwrap_or_default().starts_with("held: "), "{inst:?}");
    assert_eq!(witness(&agent), "promote\n", "not run again, not rolled back");
    // The operator's retry runs it.
    std::fs::write(agent.path().join("data/again"), "").unwrap();
    let out = agent.cli(&["retry", &id, "--reason", "checked the replica"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let inst = wait_until(&c, &mut events, &id, "the retry", |i| i.state == TaskState::Success).await;
    assert_eq!(inst.steps.unwrap()[0].state, StepState::Success);
    assert_eq!(witness(&agent), "promote\npromote\n");
}

#[tokio::test]
async fn on_postgresql_a_hold_step_whose_agent_died_is_not_run_again_by_the_agent_that_takes_it_over() {
    let schema = PgSchema::new("hold");
    let w = tempfile::tempdir().unwrap();
    let wd = w.path().display();
    let def = format!(
        "task: failover\nsteps:\n  - name: promote\n    plugin: shell\n    on_interrupt: hold\n    params:\n      \
         command: echo promote >> {wd}/witness; [ -f {wd}/again ] || sleep 60\n"
    );
    let start = |name: &str| {
        let conf = format!("{}agent:\n  name: {name}\nscheduler:\n  lease: 1s\n", schema.config());
        Agent::builder().config(&conf).task("failover.yaml", &def).start()
    };
    let mut a = start("a");
    let b = start("b");
    let id = {
        let (c, mut events) = a.watch().await;
        let id = trigger(&c, "failover", json!({})).await;
        let running =
            |i: &apollo_shared::protocol::Instance| i.steps.as_ref().is_some_and(|s| s[0].state == StepState::Running);
        wait_until(&c, &mut events, &id, "the step to run", running).await;
        id
    };
    let witnessed = || std::fs::read_to_string(w.path().join("witness")).unwrap_or_default();
    while witnessed().is_empty() {
        std::thread::sleep(Duration::from_millis(20));
    }
    a.kill9();
    // b takes the instance over once a's lease runs out, and holds it.
    let (c, mut events) = b.watch().await;
    let inst = wait_until(&c, &mut events, &id, "the hold on b", ended).await;
    assert_eq!(inst.state, TaskState::Failed, "{inst:?}\n{}", b.log());
    let error = inst.error.clone().unwrap_or_default();
    assert!(error.contains("has on_interrupt: hold, so it was not run again"), "{error}");
    assert_eq!(witnessed(), "promote\n", "b did not run it again");
    std::fs::write(w.path().join("again"), "").unwrap();
    let out = b.cli(&["retry", &id, "--reason", "replica checked"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_until(&c, &mut events, &id, "the retry on b", |i| i.state == TaskState::Success).await;
    assert_eq!(witnessed(), "promote\npromote\n");
}

#[test]
fn skip_takes_only_the_failed_step_and_a_later_step_named_is_refused_naming_it() {
    let agent = Agent::builder().task("halts.yaml", HALTS).start();
    let (code, inst) = agent.cli_json(&["run", "halts", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    let id = inst["id"].as_str().unwrap().to_string();
    // undrain is PENDING (the table would let it be SKIPPED): it is not the
    // failed step, and nothing runs.
    let refused = agent.cli(&["skip", &id, "undrain", "--reason", "x"]);
    let err = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(!refused.status.success(), "{err}");
    assert!(
        err.contains("step \"undrain\" is not the failed step; the step that can be skipped is \"flaky\""),
        "{err}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(witness(&agent), "drain\nflaky\n", "flaky did not run again");
    let (_, now) = agent.cli_json(&["show", &id]);
    assert_eq!(now["state"], "FAILED", "{now:#}");
    let states = (now["steps"][1]["state"].as_str(), now["steps"][2]["state"].as_str());
    assert_eq!(states, (Some("FAILED"), Some("PENDING")), "{now:#}");
}

/// An approval nobody listed may decide, denied by its timeout, before a
/// risky step.
const GATED: &str = r#"task: gated
on_failure: stop
steps:
  - name: gate
    plugin: approval
    params:
      message: go?
      approvers: {users: [nobody]}
      timeout: 1s
      on_timeout: deny
  - name: risky
    plugin: shell
    params:
      command: echo risky >> $APOLLO_WORK_DIR/../../witness
"#;

#[test]
fn an_approval_denied_by_its_timeout_is_never_skipped_past() {
    let agent = Agent::builder().config("scheduler:\n  lease: 1s\n").task("gated.yaml", GATED).start();
    let (code, inst) = agent.cli_json(&["run", "gated", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    assert!(inst["error"].as_str().unwrap_or_default().contains("approval timed out"), "{inst:#}");
    let id = inst["id"].as_str().unwrap().to_string();
    let said = |step: &str| {
        let out = agent.cli(&["skip", &id, step, "--reason", "it is fine"]);
        assert!(!out.status.success(), "skip {step} was made");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = said("gate");
    assert!(
        err.contains("step \"gate\" is an approval: it is decided by its approvers or its timeout, not skipped"),
        "{err}"
    );
    let err = said("risky");
    assert!(err.contains("step \"risky\" is not the failed step") && err.contains("\"gate\" is an approval"), "{err}");
    std::thread::sleep(Duration::from_millis(500));
    assert!(!agent.path().join("data/witness").exists(), "the risky step ran");
    let (_, now) = agent.cli_json(&["show", &id]);
    assert_eq!(now["state"], "FAILED", "{now:#}");
}
