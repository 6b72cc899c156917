//! Claims that check what the claiming agent can run (the original design's
//! §4.3), on PostgreSQL: agent a has plugin `ver` 1.0.0, agent b 2.0.0, and
//! each agent's copy of the definition pins its own major. Instances made
//! through b run only on b, none fail on a; with b gone they wait, saying
//! why, with one `no_capable_agent` alert, and run when b is back.

use apollo_shared::state::TaskState;
use apollo_tests::*;
use serde_json::json;
use std::time::Duration;

fn ver(version: &str) -> String {
    ver_plugin(version, &format!("sleep 0.3\necho '{{\"version\": \"{version}\"}}'"))
}

fn pinned(major: u32) -> String {
    format!("task: pinned\nsteps:\n  - plugin: ver\n    version: \"^{major}\"\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_version_runs_only_where_it_is_registered_and_waits_saying_why_when_none_has_it() {
    let schema = PgSchema::new("capable");
    let conf =
        |name: &str| format!("{}agent:\n  name: {name}\nscheduler:\n  concurrency: 4\n  lease: 2s\n", schema.config());
    let a = Agent::builder().config(&conf("a")).plugin("ver.sh", &ver("1.0.0")).task("pinned.yaml", &pinned(1)).start();
    let mut b =
        Agent::builder().config(&conf("b")).plugin("ver.sh", &ver("2.0.0")).task("pinned.yaml", &pinned(2)).start();
    // Each agent publishes what it can run.
    let (_, agents) = a.cli_json(&["agents"]);
    let caps = |name: &str| -> Vec<String> {
        let agent = agents.as_array().unwrap().iter().find(|x| x["name"] == name).unwrap();
        agent["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["name"] == "ver")
            .map(|p| p["version"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!((caps("a"), caps("b")), (vec!["1.0.0".to_string()], vec!["2.0.0".to_string()]), "{agents:#}");
    let (_, plugins) = b.cli_json(&["plugins"]);
    let v2 = plugins.as_array().unwrap().iter().find(|p| p["name"] == "ver").unwrap().clone();
    assert_eq!(v2["agents"], json!(["b"]), "{v2:#}");

    let (c, mut events) = b.watch().await;
    let mut ids = Vec::new();
    for _ in 0..40 {
        ids.push(trigger(&c, "pinned", json!({})).await);
    }
    for id in &ids {
        let done = wait_until(&c, &mut events, id, "every instance", ended).await;
        assert_eq!(done.state, TaskState::Success, "{done:?}\n{}", a.log());
    }
    let claimed_by = schema.sql(
        "SELECT DISTINCT split_part(actor, ':', 2) FROM transitions WHERE step_seq IS NULL AND to_state = 'RUNNING'",
    );
    assert_eq!(claimed_by, vec![vec![Some("b".to_string())]], "only b can run ^2");

    // b dies with work queued: nothing fails on a; the work waits, saying why.
    let mut more = Vec::new();
    for _ in 0..8 {
        more.push(trigger(&c, "pinned", json!({})).await);
    }
    b.kill9();
    drop(c);
    let (c, mut events) = a.watch().await;
    c.subscribe(&[apollo_shared::protocol::Topic::Tasks, apollo_shared::protocol::Topic::Alerts]).await.unwrap();
    let waiting =
        wait_event(&mut events, "the no_capable_agent alert", |e| e.data.json()["kind"] == "no_capable_agent").await;
    let msg = waiting.data.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains("waiting: no live agent can run plugin ver ^2 (a has 1.0.0)"), "{msg}");
    let waits: Vec<String> = schema
        .sql("SELECT id FROM task_instances WHERE state = 'PENDING' AND waiting IS NOT NULL")
        .into_iter()
        .map(|r| r[0].clone().unwrap())
        .collect();
    assert!(!waits.is_empty(), "some of b's instances were still queued");
    let shown = String::from_utf8_lossy(&a.cli(&["show", &waits[0]]).stdout).to_string();
    assert!(shown.contains("waiting: no live agent can run plugin ver ^2"), "{shown}");
    let listed = String::from_utf8_lossy(&a.cli(&["ls", "--state", "PENDING"]).stdout).to_string();
    assert!(listed.contains("waiting: no live agent"), "{listed}");
    // Once, however many ticks pass.
    let tick = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < tick {
        let _ = tokio::time::timeout_at(tick, events.recv()).await;
    }
    let alerts = schema.sql("SELECT COUNT(*) FROM alerts WHERE kind = 'no_capable_agent'");
    assert_eq!(alerts[0][0].as_deref(), Some("1"));
    let failed = schema.sql("SELECT COUNT(*) FROM task_instances WHERE state = 'FAILED'");
    assert_eq!(failed[0][0].as_deref(), Some("0"), "{}", a.log());

    // b is back: everything runs there, and nothing says it waits.
    b.spawn();
    for id in &more {
        let done = wait_until(&c, &mut events, id, "b's queued work", ended).await;
        assert_eq!(done.state, TaskState::Success, "{done:?}");
        assert_eq!(done.waiting, None);
    }
    let claimed_by = schema.sql(
        "SELECT DISTINCT split_part(actor, ':', 2) FROM transitions WHERE step_seq IS NULL AND to_state = 'RUNNING'",
    );
    assert_eq!(claimed_by, vec![vec![Some("b".to_string())]], "a never took b's work");
}
