//! Costs that must not grow with history, and a socket that must not stall
//! behind a large download. The real `apollo-agent`, driven over the socket:
//!
//!     cargo run --release -p apollo-tests --example history_bench -- [FAILED] [N] [DOWNLOAD_GB]
//!
//! 1. Two agents, one with FAILED instances in its store (default 200,000),
//!    one empty, measured in turn three times each: N three-step no-op
//!    instances from 64 callers (instances/s), and 200 instances one at a time
//!    (milliseconds per step, each step being two commits: its start, and its
//!    SUCCESS with the context). Medians and their ratio.
//! 3. `agent.status` latency while a `file://` download of DOWNLOAD_GB
//!    (default 4) copies and hashes a sparse file.

use apollo_tests::*;
use apollo_tui::client::Client;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

const NOOP: &str =
    "task: noop\nsteps:\n  - {name: a, plugin: sleep}\n  - {name: b, plugin: sleep}\n  - {name: c, plugin: sleep}\n";
// Fails at once and for good: the rendered param is refused by validate.
const FAILS: &str =
    "task: fails\non_failure: stop\nsteps:\n  - plugin: sleep\n    params:\n      seconds: \"{{ params.x }}\"\n";
const DOWNLOAD: &str = "task: dl\non_failure: stop\nsteps:\n  - plugin: file_downloader\n    timeout: 3600\n    params:\n      source: file://big.bin\n      target: big.copy\n";

async fn count(c: &Client, state: &str) -> u64 {
    let s = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
    s.counts.get(state).and_then(serde_json::Value::as_u64).unwrap_or(0)
}

async fn wait_count(c: &Client, state: &str, n: u64) {
    while count(c, state).await < n {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn burst(agent: &Agent, task: &'static str, n: usize, params: serde_json::Value) -> Duration {
    let t = Instant::now();
    let per = n.div_ceil(64);
    let mut hs = Vec::new();
    for _ in 0..64 {
        let c = Arc::new(agent.client().await);
        let params = params.clone();
        hs.push(tokio::spawn(async move {
            for _ in 0..per {
                try_trigger(&c, task, params.clone()).await.unwrap();
            }
        }));
    }
    for h in hs {
        h.await.unwrap();
    }
    t.elapsed()
}

/// (instances/s for n from 64 callers, ms per step one instance at a time)
async fn engine(agent: &Agent, n: usize) -> (f64, f64) {
    let c = agent.client().await;
    let before = count(&c, "SUCCESS").await;
    let t = Instant::now();
    burst(agent, "noop", n, json!({})).await;
    wait_count(&c, "SUCCESS", before + (n.div_ceil(64) * 64) as u64).await;
    let rate = (n.div_ceil(64) * 64) as f64 / t.elapsed().as_secs_f64();
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let t = Instant::now();
    for _ in 0..200 {
        let id = trigger(&c, "noop", json!({})).await;
        wait_until(&c, &mut events, &id, "the end", ended).await;
    }
    let per_step = t.elapsed().as_secs_f64() * 1000.0 / (200.0 * 3.0);
    (rate, per_step)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let failed = args.first().copied().unwrap_or(200_000);
    let n = args.get(1).copied().unwrap_or(3000);
    let gb = args.get(2).copied().unwrap_or(4);
    let start = || Agent::builder().task("noop.yaml", NOOP).task("fails.yaml", FAILS).task("dl.yaml", DOWNLOAD).start();
    // Two agents side by side, one with the history and one empty, measured
    // in turn (empty, history, empty, …) so machine noise hits both alike.
    let history = start();
    let t = Instant::now();
    burst(&history, "fails", failed, json!({"x": "not a number"})).await;
    let c = history.client().await;
    wait_count(&c, "FAILED", (failed.div_ceil(64) * 64) as u64).await;
    println!("filled {} FAILED instances in {:.1}s", count(&c, "FAILED").await, t.elapsed().as_secs_f64());
    let empty = start();
    let (mut r0, mut s0, mut r1, mut s1) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 1..=3 {
        let (rate, step) = engine(&empty, n).await;
        println!("round {round}, empty store: {rate:.0} instances/s, {step:.3} ms per step (idle)");
        r0.push(rate);
        s0.push(step);
        let (rate, step) = engine(&history, n).await;
        println!("round {round}, {failed} FAILED: {rate:.0} instances/s, {step:.3} ms per step (idle)");
        r1.push(rate);
        s1.push(step);
    }
    let (r0, s0, r1, s1) = (median(&mut r0), median(&mut s0), median(&mut r1), median(&mut s1));
    println!(
        "medians: empty {r0:.0}/s {s0:.3} ms; with history {r1:.0}/s {s1:.3} ms; ratio instances/s {:.3}, ms per step {:.3}",
        r1 / r0,
        s1 / s0
    );
    drop(history);

    let agent = empty;
    let c = agent.client().await;
    let big = std::fs::File::create(agent.path().join("big.bin")).unwrap();
    big.set_len((gb as u64) << 30).unwrap();
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let id = trigger(&c, "dl", json!({})).await;
    let t = Instant::now();
    let mut lat = Vec::new();
    loop {
        let s = Instant::now();
        c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
        lat.push(s.elapsed().as_secs_f64() * 1000.0);
        if ended(&get(&c, &id).await) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let inst = wait_until(&c, &mut events, &id, "the download", ended).await;
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "{gb} GiB file:// download ({:?}) took {:.1}s; agent.status during it: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {} calls",
        inst.state,
        t.elapsed().as_secs_f64(),
        lat[lat.len() / 2],
        lat[lat.len() * 99 / 100],
        lat[lat.len() - 1],
        lat.len()
    );
    let _ = std::fs::remove_file(agent.path().join("big.bin"));
}
