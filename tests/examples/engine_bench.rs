//! Engine benchmark: the real `apollo-agent` binary, its scheduler and store,
//! driven over the socket.
//!
//!     cargo run --release -p apollo-tests --example engine_bench -- [N] [CONCURRENCY]
//!
//! Prints instances/s and steps/s for N three-step no-op instances, p50/p99
//! latency from trigger to first step start (under load and idle), peak RSS,
//! RSS with 10,000 queued instances, and idle CPU. `ENGINE_BENCH_SYNC=normal`
//! runs the store with `database.synchronous: normal` (no fsync per
//! commit), to tell the commit's fsync from the rest of a latency.

use apollo_tests::*;
use apollo_tui::client::Client;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

const NOOP: &str =
    "task: noop\nsteps:\n  - {name: a, plugin: sleep}\n  - {name: b, plugin: sleep}\n  - {name: c, plugin: sleep}\n";
const HELD: &str = "task: held\nqueue: held\nsteps:\n  - {plugin: sleep, params: {seconds: 3600}}\n";

fn proc_status(pid: i32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn cpu_ticks(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

async fn latencies(c: &Client, ids: &[String]) -> Vec<f64> {
    let mut out = Vec::new();
    for id in ids {
        let i = get(c, id).await;
        let s0 = i.steps.unwrap()[0].started_at.unwrap();
        out.push((s0 - i.created_at).num_microseconds().unwrap() as f64 / 1000.0);
    }
    out
}

async fn wait_done(c: &Client, n: u64) {
    loop {
        let s = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
        if s.counts.get("SUCCESS").and_then(serde_json::Value::as_u64).unwrap_or(0) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5000);
    let concurrency: u32 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(64);
    let normal = std::env::var("ENGINE_BENCH_SYNC").is_ok_and(|v| v == "normal");
    let sync = if normal { "database:\n  synchronous: normal\n" } else { "" };
    let agent = Agent::builder()
        .config(&format!(
            "scheduler:\n  concurrency: {concurrency}\n  queues:\n    held: {{limit: 1}}\nlogging:\n  level: warn\n{sync}"
        ))
        .task("noop.yaml", NOOP)
        .task("held.yaml", HELD)
        .start();
    let pid = agent.pid();
    let clients: Vec<Arc<Client>> = {
        let mut v = Vec::new();
        for _ in 0..8 {
            v.push(Arc::new(agent.client().await));
        }
        v
    };
    let c0 = clients[0].clone();

    // Idle latency: one instance at a time. Measured twice: inside the agent
    // (the stored creation time to the first step's stored start), and as a
    // client sees it (sending the trigger to receiving the event that the
    // first step's start is committed).
    let watcher = agent.client().await;
    watcher.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = watcher.take_events().unwrap();
    let mut idle_ids = Vec::new();
    let mut seen = Vec::new();
    let mut answers = Vec::new();
    for i in 0..200u64 {
        while events.try_recv().is_ok() {}
        let sent = Instant::now();
        let started = async {
            loop {
                let e = events.recv().await.expect("event stream");
                let step = match &e.data {
                    apollo_tests::EventData::InstanceUpdated { step, .. } => *step,
                    _ => None,
                };
                if step.is_some_and(|s| s.seq == 0 && s.state == apollo_shared::state::StepState::Running) {
                    return sent.elapsed();
                }
            }
        };
        let answered = async {
            let id = trigger(&c0, "noop", json!({})).await;
            (id, sent.elapsed())
        };
        let ((id, answer), started) = tokio::join!(answered, started);
        idle_ids.push(id);
        seen.push(started.as_secs_f64() * 1000.0);
        answers.push(answer.as_secs_f64() * 1000.0);
        wait_done(&c0, i + 1).await;
    }
    let mut idle = latencies(&c0, &idle_ids).await;

    // Throughput: N instances triggered from 8 connections × 8 in flight each.
    let start = Instant::now();
    let mut handles = Vec::new();
    for k in 0..64 {
        let c = clients[k % clients.len()].clone();
        let share = n / 64 + usize::from(k < n % 64);
        handles.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..share {
                ids.push(trigger(&c, "noop", json!({})).await);
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for h in handles {
        ids.extend(h.await.unwrap());
    }
    let triggered = start.elapsed();
    wait_done(&c0, 200 + n as u64).await;
    let elapsed = start.elapsed().as_secs_f64();
    let mut loaded = latencies(&c0, &ids[..ids.len().min(2000)]).await;
    let peak_rss = proc_status(pid, "VmHWM:");

    // Idle CPU over 5 s.
    let t0 = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_cpu = (cpu_ticks(pid) - t0) as f64 / 100.0 / 5.0 * 100.0;

    // 10,000 queued instances behind a queue limit of 1.
    let mut handles = Vec::new();
    for k in 0..64 {
        let c = clients[k % clients.len()].clone();
        handles.push(tokio::spawn(async move {
            for _ in 0..(10_000 / 64 + usize::from(k < 10_000 % 64)) {
                trigger(&c, "held", json!({})).await;
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let q = c0.request::<m::QueuesStats>(NoParams {}).await.unwrap();
    let held = q.into_iter().find(|s| s.queue == "held").unwrap();
    let queued_rss = proc_status(pid, "VmRSS:");

    let sync = if normal { "NORMAL" } else { "FULL" };
    println!("apollo engine benchmark: {n} instances of a 3-step no-op task, scheduler.concurrency {concurrency}, synchronous={sync}");
    println!("  triggered in            {:.2}s", triggered.as_secs_f64());
    println!("  instances/s             {:.0}", n as f64 / elapsed);
    println!("  steps/s                 {:.0}", 3.0 * n as f64 / elapsed);
    println!("  trigger→first step p50  {:.2} ms (under load)", percentile(&mut loaded, 0.5));
    println!("  trigger→first step p99  {:.2} ms (under load)", percentile(&mut loaded, 0.99));
    println!("  trigger→first step p50  {:.2} ms (idle)", percentile(&mut idle, 0.5));
    println!("  trigger→first step p99  {:.2} ms (idle)", percentile(&mut idle, 0.99));
    println!("  trigger→start seen p50  {:.2} ms (idle, by a client)", percentile(&mut seen, 0.5));
    println!("  trigger→start seen p99  {:.2} ms (idle, by a client)", percentile(&mut seen, 0.99));
    println!("  trigger answered p50    {:.2} ms (idle, by a client)", percentile(&mut answers, 0.5));
    println!("  trigger answered p99    {:.2} ms (idle, by a client)", percentile(&mut answers, 0.99));
    println!("  agent peak RSS          {:.1} MB", peak_rss as f64 / 1024.0);
    println!("  agent idle CPU          {idle_cpu:.2}% over 5 s");
    println!("  agent RSS, {} queued  {:.1} MB", held.pending, queued_rss as f64 / 1024.0);
}
