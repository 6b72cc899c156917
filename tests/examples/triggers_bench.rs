//! Triggers benchmark on the real agent:
//!
//!     cargo run --release -p apollo-tests --example triggers_bench -- [DEFS] [EVENTS]
//!
//! 1. Reload of a directory of DEFS (1,000) definitions, all changed, by
//!    SIGHUP: time from the signal to the `defs.reloaded` notice (5 runs).
//! 2. A burst of EVENTS (10,000) published from 64 concurrent callers, each
//!    matching one definition: events turned into instances per second.

use apollo_tests::*;
use apollo_tui::client::Client;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn write_defs(dir: &std::path::Path, n: usize, version: usize) {
    for i in 0..n {
        let yaml = format!(
            "task: t{i}\nqueue: q{}\nschedule: '{} 3 * * *'\nsteps:\n  - name: a\n    plugin: shell\n    params:\n      command: echo v{version} {{{{ params.x }}}}\n  - name: b\n    plugin: sleep\n",
            i % 10,
            i % 60
        );
        std::fs::write(dir.join(format!("t{i}.yaml")), yaml).unwrap();
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let defs: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let n_events: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let builder = Agent::builder()
        .config("watch_tasks: false\nscheduler:\n  concurrency: 64\nlogging:\n  level: warn\n")
        .task("listener.yaml", "task: listener\non_event: bench.event\nsteps:\n  - plugin: sleep\n");
    let tasks = builder.path().join("tasks");
    write_defs(&tasks, defs, 0);
    let agent = builder.start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Defs]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mut reloads = Vec::new();
    for round in 1..=5 {
        write_defs(&tasks, defs, round);
        let start = Instant::now();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.pid()), nix::sys::signal::Signal::SIGHUP).unwrap();
        loop {
            let ev = tokio::time::timeout(Duration::from_secs(60), events.recv()).await.unwrap().unwrap();
            if ev.kind() == EventKind::DefsReloaded {
                assert_eq!(ev.data.json()["changed"].as_array().unwrap().len(), defs);
                break;
            }
        }
        reloads.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    let mut sorted = reloads.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());

    let clients: Vec<Arc<Client>> = {
        let mut v = Vec::new();
        for _ in 0..8 {
            v.push(Arc::new(agent.client().await));
        }
        v
    };
    let start = Instant::now();
    let mut handles = Vec::new();
    for k in 0..64 {
        let c = clients[k % clients.len()].clone();
        let share = n_events / 64 + usize::from(k < n_events % 64);
        handles.push(tokio::spawn(async move {
            for i in 0..share {
                let r = publish(&c, "bench.event", json!({"k": k, "i": i}), None).await.unwrap();
                assert_eq!(r.instances.len(), 1);
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let created = start.elapsed().as_secs_f64();
    loop {
        let s = clients[0].request::<m::AgentStatus>(NoParams {}).await.unwrap();
        if s.counts.get("SUCCESS").and_then(serde_json::Value::as_u64).unwrap_or(0) >= n_events as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let done = start.elapsed().as_secs_f64();
    println!("triggers benchmark");
    println!(
        "  reload of {defs} changed definitions (SIGHUP → defs.reloaded): median {:.0} ms, runs {:?}",
        sorted[2],
        reloads.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>()
    );
    println!(
        "  {n_events} published events → instances: {:.0} events/s (created in {created:.2}s)",
        n_events as f64 / created
    );
    println!(
        "  ... and all {n_events} instances ran to SUCCESS in {done:.2}s ({:.0} instances/s end to end)",
        n_events as f64 / done
    );
}
