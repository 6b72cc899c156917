//! PostgreSQL benchmark: the real `apollo-agent` binaries on the machine's
//! PostgreSQL (`APOLLO_TEST_DATABASE_URL`; each round in a fresh schema,
//! dropped afterwards), beside the same agent on SQLite.
//!
//!     cargo run --release -p apollo-tests --example pg_bench -- [N] [ROUNDS] [PARTS]
//!
//! PARTS picks what to run, e.g. `14` (default `1234`).
//!
//! 1. One agent, three-step no-op instances (concurrency 64): instances/s on
//!    SQLite and on PostgreSQL, interleaved, median of ROUNDS; idle trigger →
//!    first step p99 on each.
//! 2. Scale-out on work that waits: 1, 2 and 4 agents (concurrency 16 each)
//!    on instances of three 50 ms steps; instances/s and the ratio to one.
//! 3. Scale-out on no-op steps: 1, 2 and 4 agents.
//! 4. Claim latency across agents: instances triggered through agent A, whose
//!    queue only agent B serves, started by idle B: p50/p99.

use apollo_tests::*;
use apollo_tui::client::Client;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

const NOOP: &str =
    "task: noop\nqueue: work\nsteps:\n  - {name: a, plugin: sleep}\n  - {name: b, plugin: sleep}\n  - {name: c, plugin: sleep}\n";
const WAITS: &str = "task: waits\nqueue: work\nsteps:\n  - {name: a, plugin: sleep, params: {seconds: 0.05}}\n  - {name: b, plugin: sleep, params: {seconds: 0.05}}\n  - {name: c, plugin: sleep, params: {seconds: 0.05}}\n";

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    percentile(&mut v, 0.5)
}

/// Agents named a, b, … on `schema` (or one on SQLite when `schema` is None).
fn start(schema: Option<&PgSchema>, n: usize, scheduler: &str, queues: &str) -> Vec<Agent> {
    (0..n)
        .map(|i| {
            let name = ["a", "b", "c", "d"][i];
            let db = schema.map(|s| s.config()).unwrap_or_default();
            Agent::builder()
                .config(&format!(
                    "{db}agent:\n  name: {name}\nscheduler:\n{scheduler}  queues:\n{queues}logging:\n  level: warn\n"
                ))
                .task("noop.yaml", NOOP)
                .task("waits.yaml", WAITS)
                .start()
        })
        .collect()
}

async fn successes(c: &Client) -> u64 {
    let s = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
    s.counts.get("SUCCESS").and_then(serde_json::Value::as_u64).unwrap_or(0)
}

async fn wait_done(c: &Client, n: u64) {
    while successes(c).await < n {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Triggers `n` instances of `task` spread over `clients` (64 in flight in
/// all, as engine_bench: the triggers never hold the agents back), waits for
/// them, and returns instances/s.
async fn throughput(clients: &[Arc<Client>], task: &'static str, n: usize, before: u64) -> f64 {
    let start = Instant::now();
    let mut handles = Vec::new();
    let lanes = 64;
    for k in 0..lanes {
        let c = clients[k % clients.len()].clone();
        let share = n / lanes + usize::from(k < n % lanes);
        handles.push(tokio::spawn(async move {
            for _ in 0..share {
                trigger(&c, task, json!({})).await;
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    wait_done(&clients[0], before + n as u64).await;
    n as f64 / start.elapsed().as_secs_f64()
}

/// Trigger → first step start of `n` instances triggered one at a time
/// through `via`, in ms (the store's times of both).
async fn idle_latency(via: &Client, n: u64, before: u64) -> Vec<f64> {
    idle_latency_split(via, n, before).await.into_iter().map(|(all, _)| all).collect()
}

/// As [`idle_latency`], each with the part from creation to the claim (the
/// history row of the move to RUNNING).
async fn idle_latency_split(via: &Client, n: u64, before: u64) -> Vec<(f64, f64)> {
    let ms = |d: chrono::TimeDelta| d.num_microseconds().unwrap() as f64 / 1000.0;
    let mut out = Vec::new();
    for i in 0..n {
        let id = trigger(via, "noop", json!({})).await;
        wait_done(via, before + i + 1).await;
        let inst = get(via, &id).await;
        let s0 = inst.steps.unwrap()[0].started_at.unwrap();
        let claimed = inst.transitions.unwrap().iter().find(|h| h.step.is_none() && h.to == "RUNNING").unwrap().at;
        out.push((ms(s0 - inst.created_at), ms(claimed - inst.created_at)));
    }
    out
}

/// The writers' group commits so far: their mean size in writes and mean
/// time, from the agent's metrics (what limits a run shows here).
async fn commits(c: &Client) -> String {
    let text = c.request::<m::AgentMetrics>(NoParams {}).await.unwrap().text;
    let get =
        |name: &str| -> f64 { text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0.0) };
    let n = get("apollo_store_commit_seconds_count").max(1.0);
    format!(
        "{:.0} commits, {:.1} writes each, {:.2} ms each; {:.0} SUCCESS writes made together, {:.0} batches run again",
        n,
        get("apollo_store_batch_writes_sum") / n,
        get("apollo_store_commit_seconds_sum") / n * 1000.0,
        get("apollo_store_merged_writes_total"),
        get("apollo_store_batch_retries_total"),
    )
}

/// Eight connections to each agent, the agents' in turn.
async fn clients(agents: &[Agent]) -> Vec<Arc<Client>> {
    let mut v = Vec::new();
    for _ in 0..8 {
        for a in agents {
            v.push(Arc::new(a.client().await));
        }
    }
    v
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(3000);
    let rounds: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(3);
    let parts = args.get(3).cloned().unwrap_or_else(|| "1234".into());
    let one = "  concurrency: 64\n";
    let shared = "    work: {}\n";

    println!("apollo PostgreSQL benchmark ({rounds} interleaved rounds; medians)");
    // 1. One agent: SQLite and PostgreSQL, interleaved.
    if parts.contains('1') {
        let (mut lite, mut pg, mut lite_p99, mut pg_p99) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            for on_pg in [false, true] {
                let schema = on_pg.then(|| PgSchema::new(&format!("bench1_{round}")));
                let agents = start(schema.as_ref(), 1, one, shared);
                let cs = clients(&agents).await;
                let mut idle = idle_latency(&cs[0], 200, 0).await;
                let rate = throughput(&cs, "noop", n, 200).await;
                let p99 = percentile(&mut idle, 0.99);
                println!(
                    "   round {round} {}: {rate:.0}/s; {}",
                    if on_pg { "PostgreSQL" } else { "SQLite" },
                    commits(&cs[0]).await
                );
                if on_pg {
                    pg.push(rate);
                    pg_p99.push(p99);
                } else {
                    lite.push(rate);
                    lite_p99.push(p99);
                }
            }
        }
        println!("1. one agent, {n} three-step no-op instances, concurrency 64:");
        println!(
            "   SQLite      {:>7.0} instances/s   idle trigger→first step p99 {:.2} ms",
            median(lite.clone()),
            median(lite_p99)
        );
        println!(
            "   PostgreSQL  {:>7.0} instances/s   idle trigger→first step p99 {:.2} ms",
            median(pg.clone()),
            median(pg_p99)
        );
        println!("   rounds: SQLite {lite:.0?}, PostgreSQL {pg:.0?}");
    }

    // 2 and 3. Scale-out.
    for (task, label, per_agent) in [("waits", "three 50 ms steps", 600), ("noop", "three no-op steps", n / 2)] {
        if !parts.contains(if task == "waits" { '2' } else { '3' }) {
            continue;
        }
        let mut base = 0.0;
        println!("{}. scale-out on {label}, concurrency 16 per agent:", if task == "waits" { 2 } else { 3 });
        for count in [1usize, 2, 4] {
            let mut rates = Vec::new();
            for round in 0..rounds {
                let schema = PgSchema::new(&format!("bench_{task}_{count}_{round}"));
                let agents = start(Some(&schema), count, "  concurrency: 16\n", shared);
                let cs = clients(&agents).await;
                rates.push(throughput(&cs, task, per_agent * count, 0).await);
            }
            let rate = median(rates.clone());
            if count == 1 {
                base = rate;
            }
            println!(
                "   {count} agent(s): {rate:>7.0} instances/s  ({:.2}× one agent)  rounds {rates:.0?}",
                rate / base
            );
        }
    }

    // 4. Claim latency across agents: A cannot claim from `work`, idle B does.
    if !parts.contains('4') {
        return;
    }
    let mut all = Vec::new();
    for round in 0..rounds {
        let schema = PgSchema::new(&format!("bench4_{round}"));
        let agents = start(Some(&schema), 2, "  concurrency: 16\n", "    work: {agents: [b]}\n");
        let cs = clients(&agents).await;
        all.extend(idle_latency_split(&cs[0], 200, 0).await);
    }
    println!("4. triggered through agent A, started by idle agent B ({} instances):", all.len());
    let (mut total, mut claimed): (Vec<f64>, Vec<f64>) = all.into_iter().unzip();
    let show = |v: &mut Vec<f64>| {
        format!(
            "p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            percentile(v, 0.5),
            percentile(v, 0.9),
            percentile(v, 0.99),
            percentile(v, 1.0)
        )
    };
    println!("   {}", show(&mut total));
    println!("   of which created → claimed: {}", show(&mut claimed));
}
