//! A store as it grows: one-step instances go through the socket until the
//! store holds each checkpoint's number (default 10k, 100k, 1M), and at each
//! checkpoint the bench prints the fill rate, the median of five runs of
//! every CLI read an operator makes (as `apollo` prints it: process start,
//! socket, answer), the bytes per instance on disk, the agent's restart
//! time and its RSS. Every 1,000th instance is task `probe` in queue `rare`
//! and every 200th fails, so the filtered reads find a rare task, a rare
//! queue and a thousandth of failures.
//!
//! After the last checkpoint the retention is lowered to 1 s and the agent
//! restarted: the archive catches up with everything while a probe times
//! trigger → SUCCESS as its client sees it every 50 ms (idle before, then
//! during), and the reads of the archive are measured once it is done.
//!
//!     cargo run --release -p apollo-tests --example growth_bench -- [CHECKPOINTS] [--pg]
//!
//! CHECKPOINTS is a comma-separated list (`10000,100000,1000000`); `--pg`
//! puts the agent on a schema of its own on the test PostgreSQL.
//!
//! `--flow N [--rate R]` instead sends N instances (R a second) through a
//! store whose retention is 5 s and archive retention 10 s, and prints the
//! data directory's size at every tenth of the way and once the archive's
//! end has caught up: a store that stops growing is as large at the end as
//! half-way.

use apollo_tests::*;
use apollo_tui::client::Client;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NOOP: &str = "task: noop\nsteps:\n  - plugin: sleep\n";
const PROBE: &str = "task: probe\nqueue: rare\nsteps:\n  - plugin: sleep\n";
const FLAKY: &str =
    "task: flaky\non_failure: stop\nsteps:\n  - plugin: shell\n    retry: 0\n    params: {command: exit 3}\n";

fn config(retention: &str, pg: Option<&PgSchema>) -> String {
    let db = pg.map(PgSchema::config).unwrap_or_default();
    format!("{db}scheduler:\n  concurrency: 64\n  retention: {retention}\nlogging:\n  level: warn\n")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len().max(1) - 1) as f64 * q).round() as usize).copied().unwrap_or(f64::NAN)
}

/// The median wall time of five runs of `apollo ARGS`, in ms; a failing run
/// is reported, not timed.
fn timed(agent: &Agent, args: &[&str]) -> f64 {
    let mut ms = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        let out = agent.cli(args);
        ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        if !out.status.success() && args[0] != "retry" {
            eprintln!("apollo {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    median(ms)
}

/// The store's bytes in use: on SQLite the pages of its tables and indexes
/// (`dbstat`, free pages aside, read with `sqlite3` beside the running
/// agent) with the largest of them, on PostgreSQL the schema's relations
/// with their indexes and TOAST.
fn store_bytes(agent: &Agent, pg: Option<&PgSchema>) -> (u64, Vec<(String, u64)>) {
    let rows: Vec<(String, u64)> = match pg {
        Some(s) => s
            .sql(&format!(
                "SELECT c.relname, pg_total_relation_size(c.oid)::text FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '{}' AND c.relkind = 'r'",
                s.name
            ))
            .into_iter()
            .map(|r| (r[0].clone().unwrap_or_default(), r[1].as_deref().unwrap_or("0").parse().unwrap_or(0)))
            .collect(),
        None => {
            let out = std::process::Command::new("sqlite3")
                .arg("-readonly")
                .arg(agent.path().join("data/apollo.db"))
                .arg("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")
                .output()
                .expect("sqlite3 (on the image) reads the store's page counts");
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.split_once('|'))
                .map(|(n, b)| (n.to_string(), b.trim().parse().unwrap_or(0)))
                .collect()
        }
    };
    let total = rows.iter().map(|r| r.1).sum();
    let mut top = rows;
    top.sort_by_key(|t| std::cmp::Reverse(t.1));
    top.truncate(12);
    (total, top)
}

fn print_bytes(agent: &Agent, pg: Option<&PgSchema>, n: usize, what: &str) {
    let (bytes, top) = store_bytes(agent, pg);
    println!("{what}: {} bytes per instance ({:.1} MB in use)", bytes / n.max(1) as u64, bytes as f64 / 1e6);
    for (name, b) in top {
        println!("    {name:<40} {:6} B per instance", b / n.max(1) as u64);
    }
}

fn rss_kib(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

/// Triggers instances until `to` were made in all (`made` counts them),
/// from 64 clients, and waits until every one has ended.
async fn fill(agent: &Agent, made: &Arc<AtomicUsize>, to: usize) {
    let mut hs = Vec::new();
    for _ in 0..64 {
        let (c, made) = (Arc::new(agent.client().await), made.clone());
        hs.push(tokio::spawn(async move {
            loop {
                let n = made.fetch_add(1, Ordering::SeqCst) + 1;
                if n > to {
                    made.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
                // A flow's pace: no more than RATE a second since it began.
                let rate = RATE.load(Ordering::SeqCst);
                if rate > 0 {
                    let due = START.get_or_init(Instant::now).elapsed().as_secs_f64() * rate as f64;
                    if (n as f64) > due {
                        tokio::time::sleep(Duration::from_secs_f64((n as f64 - due) / rate as f64)).await;
                    }
                }
                let task = match n {
                    n if n % 1000 == 0 => "probe",
                    n if n % 200 == 0 => "flaky",
                    _ => "noop",
                };
                try_trigger(&c, task, json!({})).await.unwrap();
            }
        }));
    }
    for h in hs {
        h.await.unwrap();
    }
    let c = agent.client().await;
    while !settled(&c, to).await {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the `to` instances made have all ended: counted as ended (the
/// store keeps them all), or none left to run (a flow's store archives and
/// deletes them as they go).
async fn settled(c: &Client, to: usize) -> bool {
    let s = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
    let n = |k: &str| s.counts.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    let ended = n("SUCCESS") + n("FAILED") + n("ROLLED_BACK");
    let idle = n("PENDING") + n("RUNNING") + n("RETRYING") == 0;
    ended >= to as u64 || (idle && FLOWING.load(Ordering::SeqCst))
}

/// A flow's instances a second (0: as fast as they go), from START.
static RATE: AtomicUsize = AtomicUsize::new(0);
static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Set in `--flow`: ended instances leave the store as they go.
static FLOWING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Every read an operator makes, each as its median, in ms.
fn reads(agent: &Agent, archived: bool) -> Vec<(String, f64)> {
    let (_, page) = agent.cli_json(&["ls", "--limit", "1", "--archived"]);
    let oldest = {
        let (_, v) = agent.cli_json(&["ls", "--state", "FAILED", "--limit", "1"]);
        v.as_array().and_then(|a| a.first()).and_then(|i| i["id"].as_str()).map(str::to_string)
    };
    let mut shapes: Vec<Vec<String>> = vec![
        vec!["ls".into()],
        vec!["ls".into(), "--state".into(), "FAILED".into()],
        vec!["ls".into(), "--task".into(), "probe".into()],
        vec!["ls".into(), "--queue".into(), "rare".into()],
        vec!["ls".into(), "--state".into(), "RETRYING".into()],
        vec!["retry".into(), "--task".into(), "nosuch".into(), "--state".into(), "FAILED".into(), "--dry-run".into()],
        vec!["status".into()],
        vec!["queues".into()],
        vec!["metrics".into()],
        vec!["audit".into()],
        vec!["events".into()],
        vec!["alerts".into()],
        vec!["locks".into()],
        vec!["timeline".into(), "--since".into(), "24h".into(), "--queue".into(), "rare".into()],
    ];
    if let Some(id) = oldest {
        shapes.insert(5, vec!["show".into(), id]);
    }
    if archived {
        let first = page.as_array().and_then(|a| a.first()).and_then(|i| i["id"].as_str()).map(str::to_string);
        shapes.extend([
            vec!["ls".into(), "--archived".into()],
            vec!["ls".into(), "--archived".into(), "--task".into(), "probe".into()],
            vec!["ls".into(), "--archived".into(), "--state".into(), "FAILED".into()],
            vec!["ls".into(), "--archived".into(), "--queue".into(), "rare".into()],
        ]);
        if let Some(id) = first {
            shapes.push(vec!["show".into(), id]);
        }
    }
    shapes
        .iter()
        .map(|s| {
            let args: Vec<&str> = s.iter().map(String::as_str).collect();
            let name = args.iter().map(|a| if a.len() == 26 { "ID" } else { a }).collect::<Vec<_>>().join(" ");
            (name, timed(agent, &args))
        })
        .collect()
}

/// Restarts the agent (SIGTERM, start): the time until its socket answers.
fn restart(agent: &mut Agent) -> f64 {
    agent.stop();
    let t0 = Instant::now();
    agent.spawn();
    t0.elapsed().as_secs_f64()
}

/// Probes trigger → SUCCESS every 50 ms until `stop` is set: the times in ms.
async fn probe(agent: &Agent, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<f64>> {
    let c = agent.client().await;
    tokio::spawn(async move {
        c.subscribe(&[Topic::Tasks]).await.unwrap();
        let mut events = c.take_events().unwrap();
        let mut seen = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let t0 = Instant::now();
            let id = trigger(&c, "noop", json!({})).await;
            while get(&c, &id).await.state != apollo_shared::state::TaskState::Success {
                loop {
                    let ev = events.recv().await.expect("events");
                    if ev.kind() == EventKind::Resync || ev.data.instance() == Some(id.as_str()) {
                        break;
                    }
                }
            }
            seen.push(t0.elapsed().as_secs_f64() * 1000.0);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen
    })
}

fn print_starts(name: &str, ms: &mut [f64]) {
    println!(
        "  start seen by a client, {name}: {} starts, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        ms.len(),
        percentile(ms, 0.5),
        percentile(ms, 0.99),
        percentile(ms, 1.0)
    );
}

/// The disk a directory takes, as `du` counts it: the blocks of every
/// file and directory under it (an empty directory left per instance counts).
fn du(p: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut n = std::fs::metadata(p).map(|m| m.blocks() * 512).unwrap_or(0);
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        let Ok(m) = e.metadata() else { continue };
        n += if m.is_dir() { du(&e.path()) } else { m.blocks() * 512 };
    }
    n
}

/// `--flow N`: see the module.
async fn flow(n: usize) {
    FLOWING.store(true, Ordering::SeqCst);
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 64\n  retention: 5s\n  archive_retention: 10s\nlogging:\n  level: warn\n")
        .task("noop.yaml", NOOP)
        .task("probe.yaml", PROBE)
        .task("flaky.yaml", FLAKY)
        .start();
    let data = agent.path().join("data");
    let made = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    for tenth in 1..=10 {
        fill(&agent, &made, n * tenth / 10).await;
        let c = agent.client().await;
        let s = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
        let hot: u64 = s.counts.values().filter_map(serde_json::Value::as_u64).sum();
        println!(
            "{:>8} instances, {:6.1} s: data dir {:6.1} MB, {hot} hot",
            n * tenth / 10,
            t0.elapsed().as_secs_f64(),
            du(&data) as f64 / 1e6
        );
    }
    // The archive and its end catch up: nothing hot, nothing archived.
    let c = agent.client().await;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let s = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
        let hot: u64 = s.counts.values().filter_map(serde_json::Value::as_u64).sum();
        let archived = agent.cli_json(&["ls", "--archived", "--limit", "1"]).1.as_array().map_or(0, Vec::len);
        if (hot == 0 && archived == 0) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!("caught up, {:6.1} s: data dir {:6.1} MB", t0.elapsed().as_secs_f64(), du(&data) as f64 / 1e6);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--rate") {
        RATE.store(args.get(i + 1).and_then(|a| a.parse().ok()).unwrap_or(1000), Ordering::SeqCst);
    }
    if let Some(i) = args.iter().position(|a| a == "--flow") {
        return flow(args.get(i + 1).and_then(|a| a.parse().ok()).unwrap_or(200_000)).await;
    }
    let pg = args.iter().any(|a| a == "--pg").then(|| PgSchema::new("growth"));
    let checkpoints: Vec<usize> = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(|a| a.split(',').map(|n| n.parse().expect("a number")).collect())
        .unwrap_or_else(|| vec![10_000, 100_000, 1_000_000]);
    let mut agent = Agent::builder()
        .config(&config("30d", pg.as_ref()))
        .task("noop.yaml", NOOP)
        .task("probe.yaml", PROBE)
        .task("flaky.yaml", FLAKY)
        .start();
    println!("backend: {}", if pg.is_some() { "PostgreSQL" } else { "SQLite (synchronous: full)" });
    let made = Arc::new(AtomicUsize::new(0));
    let mut table: Vec<(usize, Vec<(String, f64)>)> = Vec::new();
    for &n in &checkpoints {
        let (from, t0) = (made.load(Ordering::SeqCst), Instant::now());
        fill(&agent, &made, n).await;
        let rate = (n - from) as f64 / t0.elapsed().as_secs_f64();
        let secs = restart(&mut agent);
        let rss = rss_kib(agent.pid());
        let r = reads(&agent, false);
        println!("\n{n} instances: fill {rate:.0}/s, restart {secs:.2} s, RSS {:.1} MB", rss as f64 / 1024.0);
        print_bytes(&agent, pg.as_ref(), n, "  hot");
        for (name, ms) in &r {
            println!("  {name:<60} {ms:8.1} ms");
        }
        table.push((n, r));
    }
    if table.len() > 1 {
        let (first, last) = (&table[0], &table[table.len() - 1]);
        println!("\nratio of each read's median at {} to its median at {}:", last.0, first.0);
        for ((name, a), (_, b)) in first.1.iter().zip(&last.1) {
            println!("  {name:<60} {:6.2}×", b / a);
        }
    }

    // The archive catches up with everything: starts timed for 5 s idle,
    // then during the catch-up.
    let total = made.load(Ordering::SeqCst);
    let stop = Arc::new(AtomicBool::new(false));
    let idle = probe(&agent, stop.clone()).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::SeqCst);
    let mut idle = idle.await.unwrap();
    std::fs::write(agent.path().join("apollo.yaml"), config("1s", pg.as_ref())).unwrap();
    agent.stop();
    agent.spawn();
    let watcher = agent.client().await;
    watcher.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = watcher.take_events().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let during = probe(&agent, stop.clone()).await;
    let (mut first, mut last, mut archived) = (None, Instant::now(), 0usize);
    // Everything made (the probes' too) is past the retention now.
    let total = total + idle.len();
    while archived < total {
        let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(60), events.recv()).await else {
            println!("the archive stopped moving at {archived} of {total}");
            break;
        };
        if ev.kind() == EventKind::Resync {
            let s = watcher.request::<m::AgentStatus>(NoParams {}).await.unwrap();
            let hot: u64 = s.counts.values().filter_map(serde_json::Value::as_u64).sum();
            archived = total.saturating_sub(hot as usize);
            last = Instant::now();
            continue;
        }
        if ev.kind() == EventKind::InstanceArchived {
            first.get_or_insert_with(Instant::now);
            last = Instant::now();
            archived += 1;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let secs = (last - first.unwrap_or(last)).as_secs_f64().max(0.001);
    let mut during = during.await.unwrap();
    println!("\narchive catch-up: {archived} instances in {secs:.1} s, {:.0}/s", archived as f64 / secs);
    print_starts("idle", &mut idle);
    print_starts("during the catch-up", &mut during);
    print_bytes(&agent, pg.as_ref(), total, "archived");
    for (name, ms) in reads(&agent, true) {
        println!("  {name:<60} {ms:8.1} ms");
    }
}
