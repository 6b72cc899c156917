//! Approval gates: an instance at an approval step waits, holding no slot,
//! until a permitted operator approves or denies it, or its timeout decides;
//! the request goes out once (an `approval_requested` alert with the command
//! that decides it), survives kill -9 and a restart, and on PostgreSQL can
//! be decided through another agent. Every decision is in the audit.

use apollo_shared::protocol::Instance;
use apollo_shared::state::TaskState;
use apollo_tests::*;
use serde_json::{json, Value};
use std::path::Path;

fn failover(w: &Path, gate: &str) -> String {
    let w = w.display();
    format!(
        r#"task: failover
on_failure: stop
steps:
  - name: prepare
    plugin: shell
    params: {{command: "echo prepared >> {w}/witness"}}
  - name: gate
    plugin: approval
    params:
      message: "fail over db-eu to db-us?"
{gate}
  - name: act
    plugin: shell
    params: {{command: "echo acted >> {w}/witness"}}
"#
    )
}

const SLEEPY: &str = "task: other\nsteps:\n  - plugin: shell\n    params: {command: 'echo other'}\n";

fn text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn parked(i: &Instance) -> bool {
    i.state == TaskState::Pending && i.waiting.as_deref().is_some_and(|w| w.starts_with("waiting for approval"))
}

fn witness(w: &Path) -> String {
    std::fs::read_to_string(w.join("witness")).unwrap_or_default()
}

async fn requests(c: &apollo_tui::client::Client) -> Vec<String> {
    let alerts = c.request::<apollo_shared::protocol::methods::AlertsList>(Default::default()).await.unwrap();
    alerts.into_iter().filter(|a| a.kind.as_str() == "approval_requested").map(|a| a.message).collect()
}

#[tokio::test]
async fn an_approval_waits_without_a_slot_is_approved_by_a_permitted_operator_and_audited() {
    let w = tempfile::tempdir().unwrap();
    let gate = "      approvers: {users: [root]}";
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 1\n")
        .task("failover.yaml", &failover(w.path(), gate))
        .task("other.yaml", SLEEPY)
        .start();
    let (c, mut events) = agent.watch().await;
    let id = trigger(&c, "failover", json!({})).await;
    let waiting = wait_until(&c, &mut events, &id, "the approval's wait", parked).await;
    let why = waiting.waiting.unwrap();
    assert!(why.contains("step gate by root since") && why.ends_with("fail over db-eu to db-us?"), "{why}");
    // It holds no slot: with concurrency 1, another instance runs meanwhile.
    let other = trigger(&c, "other", json!({})).await;
    wait_until(&c, &mut events, &other, "another instance", |i| i.state == TaskState::Success).await;
    let asked = requests(&c).await;
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].contains(&format!("decide with: apollo approve {id} --reason")), "{asked:?}");
    let listed = text(&agent.cli(&["approvals"]));
    assert!(listed.contains("WAITING") && listed.contains(&format!("apollo approve {id}")), "{listed}");
    assert!(text(&agent.cli(&["ls"])).contains("waiting for approval of step gate"));
    let out = agent.cli(&["approve", &id, "--reason", "CHG-7 go"]);
    assert!(out.status.success() && text(&out).contains("step gate of"), "{}", text(&out));
    let done = wait_until(&c, &mut events, &id, "the approved instance", ended).await;
    assert_eq!(done.state, TaskState::Success, "{done:?}");
    assert_eq!(witness(w.path()), "prepared\nacted\n");
    let gate_out = done.steps.as_ref().unwrap()[1].output.clone().unwrap_or(Value::Null);
    assert_eq!((gate_out["decision"].as_str(), gate_out["reason"].as_str()), (Some("approved"), Some("CHG-7 go")));
    // A second decision is refused, saying what the first was.
    let out = agent.cli(&["approve", &id, "--deny", "--reason", "late"]);
    assert!(!out.status.success() && text(&out).contains("waits for no approval"), "{}", text(&out));
    let (_, audit) = agent.cli_json(&["audit", "--limit", "100"]);
    let row = audit
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["instance"] == id.as_str() && r["reason"] == "step gate approved: CHG-7 go");
    assert!(row.is_some_and(|r| r["actor"].as_str().unwrap_or("").starts_with("root")), "{audit:#}");
}

#[tokio::test]
async fn a_denial_and_a_timeout_fail_the_step_and_a_timeout_may_approve() {
    let w = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .config("scheduler:\n  lease: 1s\n")
        .task("failover.yaml", &failover(w.path(), ""))
        .task(
            "quick.yaml",
            "task: quick\non_failure: stop\nsteps:\n  - name: gate\n    plugin: approval\n    params:\n      \
             message: ok?\n      timeout: 1s\n      on_timeout: \"{{ params.then }}\"\n",
        )
        .start();
    let (c, mut events) = agent.watch().await;
    let id = trigger(&c, "failover", json!({})).await;
    wait_until(&c, &mut events, &id, "the approval's wait", parked).await;
    let out = agent.cli(&["approve", &id, "--deny", "--reason", "not during the sale"]);
    assert!(out.status.success(), "{}", text(&out));
    let done = wait_until(&c, &mut events, &id, "the denied instance", ended).await;
    assert_eq!(done.state, TaskState::Failed, "{done:?}");
    let err = done.error.unwrap_or_default();
    assert!(err.contains("approval denied by root") && err.contains("not during the sale"), "{err}");
    assert_eq!(witness(w.path()), "prepared\n", "the step after the gate never ran");

    let denied = trigger(&c, "quick", json!({"then": "deny"})).await;
    let approved = trigger(&c, "quick", json!({"then": "approve"})).await;
    let d = wait_until(&c, &mut events, &denied, "a timeout that denies", ended).await;
    assert_eq!(d.state, TaskState::Failed, "{d:?}");
    assert!(d.error.unwrap_or_default().contains("approval timed out"), "timed out");
    let a = wait_until(&c, &mut events, &approved, "a timeout that approves", ended).await;
    assert_eq!(a.state, TaskState::Success, "{a:?}");
}

#[tokio::test]
async fn only_the_listed_approvers_decide_and_never_the_trigger_when_distinct() {
    let w = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .task("failover.yaml", &failover(w.path(), "      approvers: {users: [nobody], groups: [nogroup]}"))
        .task(
            "self.yaml",
            "task: self_check\nsteps:\n  - plugin: approval\n    params: {message: mine?, distinct_approver: true}\n",
        )
        .start();
    let (c, mut events) = agent.watch().await;
    let id = trigger(&c, "failover", json!({})).await;
    wait_until(&c, &mut events, &id, "the approval's wait", parked).await;
    let out = agent.cli(&["approve", &id, "--reason", "me"]);
    let said = text(&out);
    assert!(
        !out.status.success() && said.contains("root may not decide this approval (approvers: nobody, group nogroup)"),
        "{said}"
    );
    let own = trigger(&c, "self_check", json!({})).await;
    wait_until(&c, &mut events, &own, "the second approval's wait", parked).await;
    let said = text(&agent.cli(&["approve", &own, "--reason", "me"]));
    assert!(said.contains("root triggered instance") && said.contains("distinct_approver"), "{said}");
    assert!(parked(&get(&c, &id).await) && parked(&get(&c, &own).await), "refusals decide nothing");
}

#[tokio::test]
async fn an_agent_killed_while_an_approval_waits_asks_once_and_the_decision_holds_after_the_restart() {
    let w = tempfile::tempdir().unwrap();
    let mut agent = Agent::builder().task("failover.yaml", &failover(w.path(), "")).start();
    let id = {
        let (c, mut events) = agent.watch().await;
        let id = trigger(&c, "failover", json!({})).await;
        wait_until(&c, &mut events, &id, "the approval's wait", parked).await;
        id
    };
    agent.kill9();
    agent.spawn();
    let (c, mut events) = agent.watch().await;
    assert!(parked(&get(&c, &id).await));
    let out = agent.cli(&["approve", &id, "--reason", "after the crash"]);
    assert!(out.status.success(), "{}", text(&out));
    let done = wait_until(&c, &mut events, &id, "the approved instance", ended).await;
    assert_eq!(done.state, TaskState::Success, "{done:?}");
    assert_eq!(witness(w.path()), "prepared\nacted\n", "prepare ran once, act once");
    assert_eq!(requests(&c).await.len(), 1, "asked once");
}

#[tokio::test]
async fn on_postgresql_an_approval_parked_on_one_agent_is_decided_through_the_other() {
    let schema = PgSchema::new("approvals");
    let w = tempfile::tempdir().unwrap();
    let start = |name: &str| {
        let conf = format!("{}agent:\n  name: {name}\nscheduler:\n  lease: 2s\n", schema.config());
        Agent::builder().config(&conf).task("failover.yaml", &failover(w.path(), "")).start()
    };
    let a = start("a");
    let b = start("b");
    let (ca, mut events) = a.watch().await;
    let id = trigger(&ca, "failover", json!({})).await;
    wait_until(&ca, &mut events, &id, "the approval's wait", parked).await;
    let out = b.cli(&["approve", &id, "--reason", "through b"]);
    assert!(out.status.success(), "{}", text(&out));
    let done = wait_until(&ca, &mut events, &id, "the approved instance", ended).await;
    assert_eq!(done.state, TaskState::Success, "{done:?}\n{}\n{}", a.log(), b.log());
    assert_eq!(witness(w.path()), "prepared\nacted\n");
    assert_eq!(requests(&ca).await.len(), 1, "asked once");
}
