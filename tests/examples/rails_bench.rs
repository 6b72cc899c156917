//! Safety rails benchmark: locks and approvals at volume, on the real
//! `apollo-agent` over the socket (SQLite).
//!
//!     cargo run --release -p apollo-tests --example rails_bench -- [N] [LOCKS] [STEP_SECS]
//!
//! 1. N instances (default 1,000) contend for LOCKS lock names (default 10),
//!    each holding its lock for one step of STEP_SECS (default 0.2): the
//!    locks allow LOCKS / STEP_SECS instances a second; prints the rate
//!    achieved, and that no two holders of a lock ever overlapped.
//! 2. N instances parked at an approval step: the agent's RSS before and
//!    after, and its CPU over 5 s while they wait.

use apollo_tests::*;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn rss_kib(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

fn cpu_ticks(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = s.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

async fn count(c: &apollo_tui::client::Client, state: &str) -> u64 {
    let s = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
    s.counts.get(state).and_then(serde_json::Value::as_u64).unwrap_or(0)
}

async fn trigger_all(clients: &[Arc<apollo_tui::client::Client>], task: &str, n: usize, locks: usize) {
    let mut handles = Vec::new();
    for k in 0..16 {
        let c = clients[k % clients.len()].clone();
        let task = task.to_string();
        handles.push(tokio::spawn(async move {
            let mut i = k;
            while i < n {
                trigger(&c, &task, json!({"r": i % locks.max(1)})).await;
                i += 16;
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let locks: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(10);
    let step: f64 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(0.2);
    let w = tempfile::tempdir().unwrap();
    let wd = w.path().display();
    let locked = format!(
        "task: locked\nparams: {{r: 0}}\nlocks: [\"res:{{{{ params.r }}}}\"]\nsteps:\n  - plugin: shell\n    params:\n      \
         command: 'mkdir {wd}/l{{{{ params.r }}}} || echo overlap >> {wd}/overlaps; sleep {step}; rmdir {wd}/l{{{{ params.r }}}}'\n"
    );
    let gated = "task: gated\nsteps:\n  - plugin: approval\n    params: {message: go?}\n";
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 64\nlogging:\n  level: warn\n")
        .task("locked.yaml", &locked)
        .task("gated.yaml", gated)
        .start();
    let pid = agent.pid();
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(Arc::new(agent.client().await));
    }
    let c0 = clients[0].clone();

    // 1. Contention for the locks.
    let start = Instant::now();
    trigger_all(&clients, "locked", n, locks).await;
    while count(&c0, "SUCCESS").await < n as u64 {
        assert_eq!(count(&c0, "FAILED").await, 0, "an instance failed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = start.elapsed().as_secs_f64();
    let allowed = locks as f64 / step;
    // What the locks were held for: each step's own run (its process's
    // start and end included), against the locks' whole time.
    let mut held = 0.0;
    let mut cursor = None;
    loop {
        let page = c0
            .request::<m::TasksList>(apollo_shared::protocol::ListParams {
                task: Some("locked".into()),
                limit: Some(1000),
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        for i in &page.items {
            let full = get(&c0, &i.id).await;
            let s0 = &full.steps.unwrap()[0];
            held += (s0.finished_at.unwrap() - s0.started_at.unwrap()).num_microseconds().unwrap() as f64 / 1e6;
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    let busy = held / (locks as f64 * took);
    let overlaps = std::fs::read_to_string(w.path().join("overlaps")).unwrap_or_default().lines().count();

    // 2. Waiting approvals.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_kib(pid);
    trigger_all(&clients, "gated", n, 1).await;
    let parked_by = Instant::now() + Duration::from_secs(120);
    loop {
        let page = c0.request::<m::ApprovalsList>(NoParams {}).await.unwrap();
        if page.iter().filter(|a| a.decision.is_none()).count() >= n {
            break;
        }
        assert!(Instant::now() < parked_by, "not all parked");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kib(pid);
    let t0 = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_cpu = (cpu_ticks(pid) - t0) as f64 / 100.0 / 5.0 * 100.0;

    println!("apollo rails benchmark: {n} instances, {locks} locks held {step}s each; {n} waiting approvals");
    println!("  locks: finished in       {took:.2}s");
    println!(
        "  locks: instances/s       {:.1} (the locks allow {allowed:.1}: {:.0}%)",
        n as f64 / took,
        100.0 * n as f64 / took / allowed
    );
    println!(
        "  locks: held              {:.0}% of the time (each step's run {:.3}s on average)",
        100.0 * busy,
        held / n as f64
    );
    println!("  locks: overlaps          {overlaps}");
    println!(
        "  approvals: agent RSS     {:.1} MB before, {:.1} MB with {n} waiting (+{:.1} MB)",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        (after as f64 - before as f64) / 1024.0
    );
    println!("  approvals: idle CPU      {idle_cpu:.2}% over 5 s");
}
