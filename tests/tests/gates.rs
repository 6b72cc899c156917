//! An approval between a fan-out's batches (`approve_after_batch`): the
//! canary runs, the instance parks until an approver decides — holding no
//! slot, surviving a restart of the agent — and only an approval lets the
//! batches after it start. A denial fails the step (the rest recorded not
//! started), is not skipped past, and a retry asks again; an approval in an
//! earlier attempt stands. A cancel while parked fails the step as
//! cancelled.

use super::fanout::{check, counts, rolling};
use apollo_shared::state::TaskState;
use apollo_tests::*;

const GATE: &str = "    approve_after_batch: {batch: 1, message: \"canary {{ params.hosts[0] }} looks good?\"}\n";

fn parked(i: &Instance) -> bool {
    i.state == TaskState::Pending && i.waiting.as_deref().is_some_and(|w| w.starts_with("waiting for approval"))
}

fn said(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[tokio::test]
async fn the_canary_runs_then_the_fan_out_waits_for_an_approval_that_survives_a_restart() {
    let mut agent =
        Agent::builder().config("scheduler:\n  concurrency: 4\n").task("rolling.yaml", &rolling(10, GATE)).start();
    std::fs::create_dir_all(agent.path().join("data")).unwrap();
    let (c, mut events) = agent.watch().await;
    let id = trigger(&c, "rolling", serde_json::json!({})).await;
    let waiting = wait_until(&c, &mut events, &id, "the park at the gate", parked).await;
    // The canary alone ran; the step is RUNNING with its ledger, the
    // instance parked on the request.
    assert_eq!(data_lines(&agent, "witness"), ["web-00"]);
    let step = &waiting.steps.as_ref().unwrap()[0];
    assert_eq!((step.state.as_str(), step.attempts), ("RUNNING", 1), "{step:?}");
    let why = waiting.waiting.clone().unwrap();
    assert!(
        why.contains("step restart") && why.contains("canary web-00 looks good? (batch 1: 1 of 1 items ok)"),
        "{why}"
    );
    let (_, asked) = agent.cli_json(&["approvals"]);
    let open = asked.as_array().unwrap().iter().find(|a| a["instance"] == id.as_str()).expect("listed").clone();
    assert_eq!((open["step"].as_str(), open["decision"].as_str()), (Some("restart"), None), "{asked:#}");
    let status = status(&c).await.unwrap();
    assert_eq!(status.counts.get("RUNNING").and_then(|v| v.as_u64()), Some(0), "it holds no slot");

    // A restart while it waits changes nothing.
    drop((c, events));
    agent.kill9();
    agent.spawn();
    let (c, mut events) = agent.watch().await;
    assert!(parked(&get(&c, &id).await));
    assert_eq!(data_lines(&agent, "witness"), ["web-00"]);

    let out = agent.cli(&["approve", &id, "--reason", "dashboards green"]);
    assert!(out.status.success(), "{}", said(&out));
    let done = wait_until(&c, &mut events, &id, "the end", ended).await;
    assert_eq!(done.state, TaskState::Success, "{done:?}");
    let ran = counts(&data_lines(&agent, "witness"));
    assert_eq!(ran.len(), 10, "{ran:?}");
    assert!(ran.values().all(|n| *n == 1), "each host once, the canary not again: {ran:?}");
    let step = &done.steps.as_ref().unwrap()[0];
    assert_eq!((step.state.as_str(), step.attempts), ("SUCCESS", 1), "one attempt through the gate: {step:?}");
    // The timeline has the request and the decision, with its reason.
    let (_, t) = agent.cli_json(&["timeline", &id]);
    let decided = t["events"].as_array().unwrap().iter().any(|e| {
        e["operator"] == true
            && e["step"] == "restart"
            && e["reason"].as_str().unwrap_or("").contains("dashboards green")
    });
    assert!(decided, "{t:#}");
}

#[tokio::test]
async fn a_denial_stops_the_fan_out_is_not_skipped_past_and_a_retry_asks_again() {
    let agent =
        Agent::builder().config("scheduler:\n  concurrency: 4\n").task("rolling.yaml", &rolling(10, GATE)).start();
    std::fs::create_dir_all(agent.path().join("data")).unwrap();
    let (c, mut events) = agent.watch().await;
    let id = trigger(&c, "rolling", serde_json::json!({})).await;
    wait_until(&c, &mut events, &id, "the park at the gate", parked).await;
    let out = agent.cli(&["approve", &id, "--deny", "--reason", "canary is slow"]);
    assert!(out.status.success(), "{}", said(&out));
    let failed = wait_until(&c, &mut events, &id, "the denial's end", ended).await;
    assert_eq!(failed.state, TaskState::Failed, "{failed:?}");
    let error = failed.steps.as_ref().unwrap()[0].error.clone().unwrap_or_default();
    assert!(error.contains("after batch 1: approval denied by") && error.contains("canary is slow"), "{error}");
    assert_eq!(data_lines(&agent, "witness"), ["web-00"], "nothing after the canary ran");
    let (_, doc) = agent.cli_json(&["show", &id, "--items"]);
    let items = doc[0]["items"].as_array().unwrap();
    let not_started =
        items.iter().filter(|i| i["error"].as_str().unwrap_or("").starts_with("not started: approval denied")).count();
    assert_eq!(not_started, 9, "{doc:#}");

    let out = agent.cli(&["skip", &id, "restart", "--reason", "skip it"]);
    assert!(!out.status.success() && said(&out).contains("stopped by its approval between batches"), "{}", said(&out));

    // A retry asks again, and runs only what did not succeed.
    let out = agent.cli(&["retry", &id, "--reason", "canary fixed"]);
    assert!(out.status.success(), "{}", said(&out));
    let again = wait_until(&c, &mut events, &id, "the second park", parked).await;
    assert!(again.attempt >= 2, "{again:?}");
    assert_eq!(data_lines(&agent, "witness"), ["web-00"]);
    assert!(agent.cli(&["approve", &id, "--reason", "go"]).status.success());
    let done = wait_until(&c, &mut events, &id, "the end", ended).await;
    assert_eq!(done.state, TaskState::Success, "{done:?}");
    let ran = counts(&data_lines(&agent, "witness"));
    assert!(ran.len() == 10 && ran.values().all(|n| *n == 1), "{ran:?}");

    // A cancel while parked fails the step as cancelled.
    let id = trigger(&c, "rolling", serde_json::json!({})).await;
    wait_until(&c, &mut events, &id, "the third park", parked).await;
    assert!(agent.cli(&["cancel", &id, "--reason", "change freeze"]).status.success());
    let cancelled = wait_until(&c, &mut events, &id, "the cancel", ended).await;
    assert_eq!(cancelled.state, TaskState::Failed);
    let step = &cancelled.steps.as_ref().unwrap()[0];
    assert_eq!(step.state.as_str(), "FAILED", "{step:?}");
    assert!(step.error.as_deref().unwrap_or("").contains("cancelled: change freeze"), "{step:?}");
    let (_, asked) = agent.cli_json(&["approvals"]);
    let gone = asked.as_array().unwrap().iter().find(|a| a["instance"] == id.as_str()).unwrap().clone();
    assert_eq!(gone["decision"], "cancelled", "{asked:#}");
}

#[test]
fn a_gate_is_refused_at_load_where_nothing_follows_it_or_it_is_misspelled_and_a_dry_run_shows_it() {
    let agent = Agent::builder().task("rolling.yaml", &rolling(4, GATE)).start();
    let cases = [
        ("approve_after_batch: 3", "batches: [1, \"25%\", \"100%\"]", "batch 3 is the last of the 3"),
        ("approve_after_batch: 1", "", "the step has one batch"),
        ("approve_after_batch: {batch: 1, mesage: hi}", "batches: [1, \"100%\"]", "did you mean \"message\"?"),
        (
            "approve_after_batch: {batch: 1, approvers: {users: [nosuchuser9]}}",
            "batches: [1, \"100%\"]",
            "no user \"nosuchuser9\"",
        ),
        ("approve_after_batch: 0", "batches: [1, \"100%\"]", "expected the number of the batch"),
    ];
    for (gate, batches, says) in cases {
        let yaml = format!(
            "task: bad\nsteps:\n  - name: s\n    plugin: sleep\n    foreach: [a, b]\n    {batches}\n    {gate}\n"
        );
        let file = agent.path().join("bad.yaml");
        std::fs::write(&file, &yaml).unwrap();
        let out = check(&file);
        let text = said(&out);
        assert!(!out.status.success() && text.contains("approve_after_batch") && text.contains(says), "{yaml}\n{text}");
    }
    let out = agent.cli(&["dry-run", "rolling"]);
    assert!(said(&out).contains("items: 4 in 3 batch(es) (1, 1, 2), an approval after batch 1"), "{}", said(&out));
}
