//! The store on a real SQLite file: group commit, savepoint isolation,
//! claims by priority then age within limits, dedup keys, recovery.

use apollo_agent::bus::Bus;
use apollo_agent::store::{NewInstance, Store, StoreError};
use apollo_shared::state::TaskState;
use serde_json::{json, Map};
use std::collections::HashMap;

fn open(dir: &tempfile::TempDir) -> Store {
    Store::open(&dir.path().join("apollo.db"), true, Bus::default(), "agent:test".into()).unwrap()
}

fn new(id: &str, task: &str, queue: &str, priority: u8, max_active: Option<u32>, dedup: Option<&str>) -> NewInstance {
    NewInstance {
        id: id.into(),
        task: task.into(),
        def_hash: "h1".into(),
        queue: queue.into(),
        priority,
        max_active,
        params: Map::new(),
        context: json!({}),
        trace_id: format!("trace-{id}"),
        trigger: "test".into(),
        dedup_key: dedup.map(str::to_string),
        steps: vec![("a".into(), "sleep".into())],
        expected_secs: 1.0,
    }
}

fn lease() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now() + chrono::Duration::seconds(30)
}

#[tokio::test]
async fn one_failing_write_does_not_fail_its_batch_mates() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    // Many concurrent writes land in shared batches; the illegal ones are
    // refused alone and the rest commit.
    let mut handles = Vec::new();
    for i in 0..200 {
        let s = store.clone();
        handles.push(tokio::spawn(async move {
            let id = format!("I{i:04}");
            s.create(new(&id, "t", "q", 50, None, None), "test").await.unwrap();
            if i % 2 == 0 {
                // PENDING -> SUCCESS is illegal.
                s.finish_success(&id).await
            } else {
                Ok(())
            }
        }));
    }
    let mut refused = 0;
    for h in handles {
        match h.await.unwrap() {
            Err(StoreError::Illegal(e)) => {
                assert!(e.to_string().contains("PENDING -> SUCCESS"));
                refused += 1;
            }
            other => other.unwrap(),
        }
    }
    assert_eq!(refused, 100);
    let counts = store.counts().await.unwrap();
    assert_eq!(counts["PENDING"], 200, "{counts:?}");
    let alerts = store.alerts(500).await.unwrap();
    assert_eq!(alerts.iter().filter(|a| a.kind == "illegal_transition").count(), 100);
    store.close();
}

#[tokio::test]
async fn claims_go_by_priority_then_age_within_queue_and_task_limits() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    store.create(new("A1", "low", "q", 25, None, None), "test").await.unwrap();
    store.create(new("A2", "high", "q", 75, None, None), "test").await.unwrap();
    store.create(new("A3", "high", "q", 75, None, None), "test").await.unwrap();
    store.create(new("B1", "one", "r", 90, Some(1), None), "test").await.unwrap();
    store.create(new("B2", "one", "r", 90, Some(1), None), "test").await.unwrap();
    store.create(new("C1", "c", "limited", 100, None, None), "test").await.unwrap();
    store.create(new("C2", "c", "limited", 100, None, None), "test").await.unwrap();
    let limits: HashMap<String, u32> = [("limited".to_string(), 1)].into();
    let claimed: Vec<String> =
        store.claim(10, lease(), limits.clone()).await.unwrap().into_iter().map(|i| i.id).collect();
    // C2 waits for the queue limit, B2 for max_active; the rest by priority, then age.
    assert_eq!(claimed, ["C1", "B1", "A2", "A3", "A1"]);
    assert!(store.claim(10, lease(), limits.clone()).await.unwrap().is_empty());
    store.step_start("C1", 0, "1.0.0", &json!({})).await.unwrap();
    store.step_success("C1", 0, &json!({}), &json!({})).await.unwrap();
    store.finish_success("C1").await.unwrap();
    let next: Vec<String> = store.claim(10, lease(), limits).await.unwrap().into_iter().map(|i| i.id).collect();
    assert_eq!(next, ["C2"]);
    store.close();
}

#[tokio::test]
async fn a_dedup_key_creates_one_instance() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    let (a, created_a) = store.create(new("D1", "t", "q", 50, None, Some("k")), "test").await.unwrap();
    let (b, created_b) = store.create(new("D2", "t", "q", 50, None, Some("k")), "test").await.unwrap();
    assert_eq!((a.as_str(), created_a, b.as_str(), created_b), ("D1", true, "D1", false));
    assert_eq!(store.counts().await.unwrap()["PENDING"], 1);
    store.close();
}

#[tokio::test]
async fn recovery_takes_running_instances_and_marks_interrupted_steps() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(&dir);
        store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
        store.create(new("R1", "t", "q", 50, None, None), "test").await.unwrap();
        store.claim(1, lease(), HashMap::new()).await.unwrap();
        store.step_start("R1", 0, "1.0.0", &json!({})).await.unwrap();
        store.close();
    }
    // A new store on the same file, as after a crash.
    let store = open(&dir);
    // Expired-only recovery leaves a live lease alone.
    assert!(store.recover(lease(), true, Vec::new()).await.unwrap().is_empty());
    let found = store.recover(lease(), false, Vec::new()).await.unwrap();
    assert_eq!(found.len(), 1);
    let inst = store.get("R1").await.unwrap();
    assert_eq!(inst.state, TaskState::Running);
    let step = &inst.steps.unwrap()[0];
    assert_eq!(step.state, apollo_shared::StepState::Failed);
    assert_eq!(step.failures, 0, "an interruption is not a failure");
    assert!(step.error.as_deref().unwrap().starts_with("interrupted"));
    store.close();
}

#[tokio::test]
async fn the_history_is_append_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    store.create(new("H1", "t", "q", 50, None, None), "test").await.unwrap();
    store.close();
    let conn = rusqlite::Connection::open(dir.path().join("apollo.db")).unwrap();
    let e = conn.execute("UPDATE transitions SET reason = 'rewritten'", []).unwrap_err();
    assert!(e.to_string().contains("append-only"), "{e}");
    let e = conn.execute("DELETE FROM transitions", []).unwrap_err();
    assert!(e.to_string().contains("append-only"), "{e}");
}

#[tokio::test]
async fn finished_instances_past_retention_move_to_the_archive_and_stay_readable() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    store.create(new("OLD", "t", "q", 50, None, None), "test").await.unwrap();
    store.create(new("LIVE", "t", "q", 50, None, None), "test").await.unwrap();
    store.claim(1, lease(), HashMap::new()).await.unwrap();
    let first = store.list(apollo_agent::store::ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    let running = first.iter().find(|i| i.state == TaskState::Running).unwrap().id.clone();
    store.step_start(&running, 0, "1.0.0", &json!({})).await.unwrap();
    store.step_success(&running, 0, &json!({"ok": true}), &json!({})).await.unwrap();
    store.finish_success(&running).await.unwrap();
    // Everything finished before "now + 1s" is past a zero retention window.
    let moved = store.archive(chrono::Utc::now() + chrono::Duration::seconds(1), 100).await.unwrap();
    assert_eq!(moved, 1);
    let counts = store.counts().await.unwrap();
    assert_eq!((counts["SUCCESS"], counts["PENDING"]), (0, 1), "only the finished one moved");
    let archived = store.get(&running).await.unwrap();
    assert_eq!(archived.state, TaskState::Success);
    assert_eq!(archived.steps.unwrap()[0].output, Some(json!({"ok": true})));
    assert!(archived.transitions.unwrap().len() >= 5, "the history moved with it");
    store.close();
}
