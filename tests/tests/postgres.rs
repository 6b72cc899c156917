//! Several agents on one PostgreSQL schema (the machine's server; each test
//! makes its own schema and drops it): work spread over every agent with no
//! step run twice, takeover after an agent's death, dedicated and ordered
//! queues, schedules and events exactly once, and the agents listed.

use apollo_shared::protocol::Instance;
use apollo_tests::*;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

/// A three-step task whose every step appends its idempotency key
/// (`instance:seq`) to `witness`.
fn chain(witness: &Path) -> String {
    let step = format!(
        "  - plugin: shell\n    params:\n      command: printf '%s\\n' \"$APOLLO_IDEMPOTENCY_KEY\" >> {}\n",
        witness.display()
    );
    format!("task: chain\nsteps:\n{step}{step}{step}")
}

/// Starts `n` agents named a, b, c… on `schema`, each with `tasks`.
fn agents(schema: &PgSchema, n: usize, extra: &str, tasks: &[(&str, &str)]) -> Vec<Agent> {
    (0..n)
        .map(|i| {
            let name = ["a", "b", "c", "d"][i];
            let mut b = Agent::builder().config(&format!("{}agent:\n  name: {name}\n{extra}", schema.config()));
            for (file, yaml) in tasks {
                b = b.task(file, yaml);
            }
            b.start()
        })
        .collect()
}

/// Waits, woken by `agent`'s subscription (which hears every agent's
/// changes), until `n` instances are SUCCESS.
async fn wait_successes(c: &apollo_tui::client::Client, n: u64, what: &str) {
    let mut events = c.take_events().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let status = c.call("agent.status", json!({})).await.unwrap();
        let done = status["counts"]["SUCCESS"].as_u64().unwrap_or(0);
        if done >= n {
            return;
        }
        // Many changes arrive at once; look again after the burst.
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(_)) => while events.try_recv().is_ok() {},
            Ok(None) => panic!("connection closed while waiting for {what}"),
            Err(_) => panic!("timed out waiting for {what}: {done} of {n} SUCCESS; status {status}"),
        }
    }
}

fn witness_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_agents_share_the_work_and_no_step_runs_twice() {
    let n: usize = std::env::var("APOLLO_PG_INSTANCES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let schema = PgSchema::new("share");
    let shared = tempfile::tempdir().unwrap();
    let witness = shared.path().join("witness");
    let chain = chain(&witness);
    let agents = agents(&schema, 3, "scheduler:\n  concurrency: 16\n", &[("chain.yaml", &chain)]);
    let watcher = agents[0].client().await;
    watcher.subscribe(&["tasks"]).await.unwrap();
    // Triggered through all three, concurrently.
    let clients = [agents[0].client().await, agents[1].client().await, agents[2].client().await];
    let mut calls = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let part = (n / 3) + usize::from(i < n % 3);
        calls.push(async move {
            for _ in 0..part {
                c.call("tasks.trigger", json!({"task": "chain"})).await.unwrap();
            }
        });
    }
    futures::future::join_all(calls).await;
    wait_successes(&watcher, n as u64, "every instance to succeed").await;

    let lines = witness_lines(&witness);
    let unique: BTreeSet<&String> = lines.iter().collect();
    assert_eq!(unique.len(), 3 * n, "every step ran");
    assert_eq!(lines.len(), 3 * n, "no step ran twice: {} runs for {} steps", lines.len(), 3 * n);
    let by_agent: BTreeMap<String, usize> = schema
        .sql("SELECT split_part(actor, ':', 2), COUNT(*) FROM transitions WHERE reason = 'claimed' GROUP BY 1")
        .into_iter()
        .map(|r| (r[0].clone().unwrap(), r[1].clone().unwrap().parse().unwrap()))
        .collect();
    assert_eq!(by_agent.keys().cloned().collect::<Vec<_>>(), ["a", "b", "c"], "all three claimed: {by_agent:?}");
    assert!(by_agent.values().all(|&k| k >= n / 20), "the work is spread: {by_agent:?}");
    let listed = agents[1].cli_json(&["agents"]).1;
    let names: BTreeSet<&str> = listed.as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(names, BTreeSet::from(["a", "b", "c"]), "{listed:#}");
    drop(agents);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agents_instances_are_taken_over_after_its_lease() {
    let schema = PgSchema::new("takeover");
    let shared = tempfile::tempdir().unwrap();
    let witness = shared.path().join("witness");
    // Each step marks its start, works a while, marks its end.
    let step = format!(
        "  - plugin: shell\n    params:\n      command: echo \"start $APOLLO_IDEMPOTENCY_KEY\" >> {w}; sleep 0.3; echo \"end $APOLLO_IDEMPOTENCY_KEY\" >> {w}\n",
        w = witness.display()
    );
    let task = format!("task: slow\nsteps:\n{step}{step}");
    let mut agents = agents(&schema, 3, "scheduler:\n  concurrency: 4\n  lease: 2s\n", &[("slow.yaml", &task)]);
    let c = agents[0].client().await;
    c.subscribe(&["tasks"]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mut ids = Vec::new();
    for _ in 0..24 {
        ids.push(trigger(&c, "slow", json!({})).await);
    }
    // Once agent b holds running instances, it dies.
    let held_by_b = || {
        schema.sql("SELECT COUNT(*) FROM task_instances WHERE state = 'RUNNING' AND lease_owner LIKE 'agent:b:%'")[0][0]
            .clone()
            .unwrap()
            .parse::<u32>()
            .unwrap()
    };
    wait_event(&mut events, "agent b to hold work", |_| held_by_b() > 0).await;
    let succeeded_before: BTreeSet<String> = schema
        .sql("SELECT instance_id || ':' || seq FROM step_runs WHERE state = 'SUCCESS'")
        .into_iter()
        .map(|r| r[0].clone().unwrap())
        .collect();
    agents[1].kill9();
    for id in &ids {
        let done = wait_until(&c, &mut events, id, "every instance to finish", ended).await;
        assert_eq!(done.state.as_str(), "SUCCESS", "{done:?}");
    }
    let lines = witness_lines(&witness);
    for key in &succeeded_before {
        let starts = lines.iter().filter(|l| **l == format!("start {key}")).count();
        assert_eq!(starts, 1, "step {key} recorded SUCCESS before the kill, yet started {starts} times");
    }
    let taken: Vec<Vec<Option<String>>> = schema.sql(
        "SELECT DISTINCT instance_id FROM transitions WHERE reason LIKE 'recovered%' AND actor NOT LIKE 'agent:b:%'",
    );
    assert!(!taken.is_empty(), "b's instances were taken over by a or c");
    let shown: Instance = get(&c, &taken[0][0].clone().unwrap()).await;
    let rows = shown.transitions.unwrap();
    assert!(rows.iter().any(|t| t.reason.starts_with("recovered") && !t.actor.starts_with("agent:b:")), "{rows:#?}");
    drop(agents);
}
