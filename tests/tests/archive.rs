//! Finished instances move to the archive after the retention window —
//! SUCCESS, ROLLED_BACK and FAILED alike — and stay browsable: `apollo ls
//! --archived` with the usual filters, `apollo show` by id, and their dedup
//! keys still refuse a duplicate.

use apollo_tests::*;
use serde_json::json;
use std::collections::BTreeSet;

async fn trigger_keyed(c: &apollo_tui::client::Client, task: &str, key: &str) -> TriggerResult {
    let p = TriggerParams { task: task.into(), params: Default::default(), dedup_key: Some(key.into()), reason: None };
    c.request::<m::TasksTrigger>(p).await.unwrap()
}

#[tokio::test]
async fn past_retention_every_finished_instance_is_archived_yet_browsable() {
    let agent = Agent::builder()
        .config("scheduler:\n  retention: 1s\n  lease: 3s\n")
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")
        .task("bad.yaml", "task: bad\non_failure: stop\nsteps:\n  - plugin: shell\n    retry: 0\n    params:\n      command: exit 3\n")
        .task("undo.yaml", "task: undo\nsteps:\n  - plugin: shell\n    retry: 0\n    params:\n      command: exit 3\n")
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mut ids = Vec::new();
    for task in ["ok", "bad", "undo"] {
        ids.push(trigger_keyed(&c, task, &format!("key-{task}")).await.id);
    }
    // Woken by the archive's own events.
    let mut archived = BTreeSet::new();
    while archived.len() < 3 {
        let ev =
            wait_event(&mut events, "an instance to be archived", |e| e.kind() == EventKind::InstanceArchived).await;
        archived.insert(ev.data.json()["id"].as_str().unwrap().to_string());
    }
    assert_eq!(archived, ids.iter().cloned().collect());
    let (code, live) = agent.cli_json(&["ls"]);
    assert_eq!((code, live), (0, json!([])), "moved out of the live table");
    let (code, list) = agent.cli_json(&["ls", "--archived"]);
    assert_eq!(code, 0, "{list:#}");
    let states: BTreeSet<&str> = list.as_array().unwrap().iter().map(|i| i["state"].as_str().unwrap()).collect();
    assert_eq!(states, BTreeSet::from(["FAILED", "ROLLED_BACK", "SUCCESS"]), "{list:#}");
    let (_, failed) = agent.cli_json(&["ls", "--archived", "--state", "FAILED"]);
    assert_eq!(failed.as_array().unwrap().len(), 1);
    assert_eq!(failed[0]["id"], json!(ids[1]));
    for id in &ids {
        let (code, shown) = agent.cli_json(&["show", id]);
        assert_eq!(code, 0, "{shown:#}");
        assert!(shown["transitions"].as_array().is_some_and(|t| t.len() >= 4), "{shown:#}");
    }
    // The dedup key of an archived instance still refuses a duplicate.
    let again = trigger_keyed(&c, "ok", "key-ok").await;
    assert_eq!((again.created, again.id.as_str()), (false, ids[0].as_str()));
}
