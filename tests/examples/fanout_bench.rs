//! Fan-out benchmark: one instance of one `foreach:` step over N no-op
//! items at `max_parallel: P`, on the real agent (SQLite, `synchronous:
//! full`), driven over the socket.
//!
//!     cargo build --release --bins
//!     cargo run --release -p apollo-tests --example fanout_bench -- [N] [P] [RUNS]
//!
//! Prints, for each run: items/s from the trigger to the instance's
//! SUCCESS, the agent's peak RSS, and the median of five `apollo show ID`
//! and five `apollo show ID --items` wall times on the finished instance.

use apollo_tests::*;
use serde_json::json;
use std::time::{Duration, Instant};

fn task(p: usize) -> String {
    format!(
        "task: fleet\nparams:\n  n: {{default: 10}}\nsteps:\n  - name: each\n    plugin: sleep\n    foreach: \"{{{{ range(params.n) | list }}}}\"\n    as: host\n    max_parallel: {p}\n    params: {{seconds: 0}}\n"
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn timed(agent: &Agent, args: &[&str]) -> f64 {
    let mut runs = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let out = agent.cli(args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        runs.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    median(runs)
}

#[tokio::main]
async fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let n = args.first().copied().unwrap_or(10_000);
    let p = args.get(1).copied().unwrap_or(64);
    let runs = args.get(2).copied().unwrap_or(3);
    let mut rates = Vec::new();
    for run in 1..=runs {
        let agent = Agent::builder()
            .config(&format!(
                "logging:\n  level: warn\ndatabase:\n  synchronous: full\nscheduler:\n  concurrency: {p}\n  max_items: {}\n",
                n.max(10)
            ))
            .task("fleet.yaml", &task(p))
            .start();
        let (c, mut events) = agent.watch().await;
        let t = Instant::now();
        let id = trigger(&c, "fleet", json!({"n": n})).await;
        let done = wait_until(&c, &mut events, &id, "the fan-out", ended).await;
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(done.state.as_str(), "SUCCESS", "{done:?}");
        let rss = peak_rss_kib(agent.pid());
        let show = timed(&agent, &["show", &id]);
        let items = timed(&agent, &["show", &id, "--items"]);
        let rate = n as f64 / secs;
        rates.push(rate);
        println!(
            "run {run}: {n} items at max_parallel {p}: {secs:.2} s, {rate:.0} items/s, peak RSS {:.1} MB, \
             show {show:.1} ms, show --items {items:.1} ms",
            rss as f64 / 1024.0
        );
        drop(c);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("median: {:.0} items/s over {runs} runs", median(rates));
}
