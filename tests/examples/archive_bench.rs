//! How fast the archive drains: N one-step no-op instances finish, and once
//! they are past the retention window (20 s) the maintenance ticks move them
//! to the archive; the rate is archived instances per second from the first
//! `instance.archived` event to the last.
//!
//!     cargo run --release -p apollo-tests --example archive_bench -- [N]

use apollo_tests::*;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let agent = Agent::builder()
        .config("scheduler:\n  retention: 20s\n  lease: 3s\n")
        .task("noop.yaml", "task: noop\nsteps:\n  - plugin: sleep\n")
        .start();
    let watcher = agent.client().await;
    watcher.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = watcher.take_events().unwrap();
    let per = n.div_ceil(64);
    let mut hs = Vec::new();
    for _ in 0..64 {
        let c = Arc::new(agent.client().await);
        hs.push(tokio::spawn(async move {
            for _ in 0..per {
                try_trigger(&c, "noop", json!({})).await.unwrap();
            }
        }));
    }
    for h in hs {
        h.await.unwrap();
    }
    let total = per * 64;
    let (mut first, mut last, mut archived) = (None, Instant::now(), 0usize);
    while archived < total {
        let ev = tokio::time::timeout(Duration::from_secs(120), events.recv()).await.expect("progress").unwrap();
        if ev.kind() == EventKind::Resync {
            // Fell behind: count from the store instead.
            let page = watcher.request::<m::AgentStatus>(NoParams {}).await.unwrap();
            archived = total - page.counts.get("SUCCESS").and_then(serde_json::Value::as_u64).unwrap_or(0) as usize;
            last = Instant::now();
            continue;
        }
        if ev.kind() == EventKind::InstanceArchived {
            first.get_or_insert_with(Instant::now);
            last = Instant::now();
            archived += 1;
        }
    }
    let secs = (last - first.unwrap()).as_secs_f64().max(0.001);
    println!("archived {total} instances in {secs:.2}s: {:.0} instances/s", total as f64 / secs);
}
