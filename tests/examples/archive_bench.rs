//! How fast the archive drains: N one-step no-op instances finish, and once
//! they are past the retention window (30 s) the maintenance ticks move them
//! to the archive; the rate is archived instances per second from the first
//! `instance.archived` event to the last.
//!
//! Meanwhile a probe triggers one more instance every 50 ms and times its
//! trigger → SUCCESS as its client sees it, before the catch-up (idle) and
//! during it: tidying must not stall a start.
//!
//!     cargo run --release -p apollo-tests --example archive_bench -- [N]

use apollo_tests::*;
use serde_json::json;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let agent = Agent::builder()
        .config("scheduler:\n  retention: 30s\n  lease: 3s\n")
        .task("noop.yaml", "task: noop\nsteps:\n  - plugin: sleep\n")
        .task("probe.yaml", "task: probe\nsteps:\n  - plugin: sleep\n")
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
    // The probe starts once every instance has ended (the queue is empty).
    loop {
        let s = watcher.request::<m::AgentStatus>(NoParams {}).await.unwrap();
        if s.counts.get("SUCCESS").and_then(serde_json::Value::as_u64).unwrap_or(0) as usize >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // 0: before the catch-up, 1: during it, 2: done.
    let phase = Arc::new(AtomicU8::new(0));
    let probe = {
        let (phase, c) = (phase.clone(), agent.client().await);
        c.subscribe(&[Topic::Tasks]).await.unwrap();
        let mut events = c.take_events().unwrap();
        tokio::spawn(async move {
            let mut seen: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
            while phase.load(Ordering::SeqCst) < 2 {
                let at = phase.load(Ordering::SeqCst) as usize;
                let t0 = Instant::now();
                let id = trigger(&c, "probe", json!({})).await;
                // Woken by its own instance's events only (the archive's
                // thousands are not read as news of it).
                while get(&c, &id).await.state != apollo_shared::state::TaskState::Success {
                    loop {
                        let ev = events.recv().await.expect("events");
                        if ev.kind() == EventKind::Resync || ev.data.instance() == Some(id.as_str()) {
                            break;
                        }
                    }
                }
                seen[at.min(1)].push(t0.elapsed().as_secs_f64() * 1000.0);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            seen
        })
    };
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
            phase.store(1, Ordering::SeqCst);
            last = Instant::now();
            archived += 1;
        }
    }
    let secs = (last - first.unwrap()).as_secs_f64().max(0.001);
    phase.store(2, Ordering::SeqCst);
    let seen = probe.await.unwrap();
    println!("archived {total} instances in {secs:.2}s: {:.0} instances/s", total as f64 / secs);
    for (name, mut ms) in ["idle", "during the catch-up"].into_iter().zip(seen) {
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms.get(((ms.len().max(1) - 1) as f64 * q).round() as usize).copied().unwrap_or(f64::NAN);
        println!(
            "trigger → SUCCESS seen by a client, {name}: {} starts, p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            ms.len(),
            at(0.5),
            at(0.95),
            at(0.99),
            at(1.0)
        );
    }
}
