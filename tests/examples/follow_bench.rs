//! Following output, measured:
//!
//!     cargo run --release -p apollo-tests --example follow_bench -- [INSTANCES] [LINES]
//!
//! 1. Latency: INSTANCES (50) instances run at once, each three steps that
//!    write LINES (20) lines 100 ms apart (bash: no process a line), each
//!    line the time it was written; every instance is followed by `apollo logs ID --follow` (a
//!    process each), and by the client call the console's logs pane makes
//!    (`steps.logs` with `wait_ms`, one per instance). The time from a
//!    line's writing to its arrival, p50 / p99 / max, for each.
//! 2. Cost while silent: one instance whose step sleeps 10 s without a word,
//!    followed by 10 `apollo logs --follow`; the agent's CPU time over 8 s,
//!    against the same 8 s with no follower.

use apollo_shared::protocol::{methods as m, IdParams, LogsParams, TriggerParams};
use apollo_shared::state::StepState;
use apollo_tests::*;
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn now_ns() -> i128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i128
}

fn cpu_ticks(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = s.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

fn percentiles(mut v: Vec<f64>) -> String {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    format!("{} lines: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms", v.len(), at(0.5), at(0.99), at(1.0))
}

/// The delay of each line `text` holds that is a time written by a step
/// (bash's `$EPOCHREALTIME`: seconds, with microseconds).
fn delays(text: &str, arrived: i128) -> Vec<f64> {
    text.lines().filter_map(|l| l.trim().parse::<f64>().ok()).map(|t| (arrived as f64 / 1e6) - t * 1e3).collect()
}

/// What the console's worker does for its logs pane, for one instance:
/// reads every step's log past its offset, and waits on the running one.
async fn follow_like_the_console(c: &apollo_tui::client::Client, id: &str) -> Vec<f64> {
    let mut offsets = std::collections::HashMap::<u32, u64>::new();
    let mut out = Vec::new();
    loop {
        let inst = c.request::<m::TasksGet>(IdParams { id: id.into(), reason: None }).await.unwrap();
        let steps = inst.steps.clone().unwrap_or_default();
        let mut text = String::new();
        for s in steps.iter().filter(|s| s.attempts > 0) {
            let p = LogsParams {
                id: id.into(),
                step: s.seq.into(),
                offset: offsets.get(&s.seq).copied(),
                wait_ms: None,
                item: None,
            };
            let r = c.request::<m::StepsLogs>(p).await.unwrap();
            offsets.insert(s.seq, r.next_offset);
            text.push_str(&r.text);
        }
        out.extend(delays(&text, now_ns()));
        if let (Some(s), true) = (steps.iter().find(|s| s.state == StepState::Running), text.is_empty()) {
            // While the step runs, wait on it again without reading the instance.
            loop {
                let offset = offsets.get(&s.seq).copied();
                let p = LogsParams { id: id.into(), step: s.seq.into(), offset, wait_ms: Some(10_000), item: None };
                let r = c.request::<m::StepsLogs>(p).await.unwrap();
                offsets.insert(s.seq, r.next_offset);
                out.extend(delays(&r.text, now_ns()));
                if r.step_state != Some(StepState::Running) {
                    break;
                }
            }
            continue;
        }
        if ended(&inst) && text.is_empty() {
            return out;
        }
    }
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (instances, lines) = (args.first().copied().unwrap_or(50), args.get(1).copied().unwrap_or(20));
    // bash's clock and a read with a timeout: no process per line, so what
    // is measured is the path from the step to its follower.
    let step = format!(
        "  - plugin: shell\n    params:\n      command: [bash, -c, 'exec 9<><(:); for i in $(seq 1 {lines}); do \
         echo \"$EPOCHREALTIME\"; read -t 0.1 -u 9; done; true']\n"
    );
    let agent = Agent::builder()
        .config(&format!("scheduler:\n  concurrency: {}\n", instances + 1))
        .task("chatty.yaml", &format!("task: chatty\nsteps:\n{step}{step}{step}"))
        .task("silent.yaml", "task: silent\nsteps:\n  - plugin: shell\n    params:\n      command: sleep 10\n")
        .start();
    let rt = tokio::runtime::Runtime::new().unwrap();

    // 1. Latency. Instances start over one step's length (LINES × 100 ms),
    // as work arrives rather than in lockstep (50 steps ending and starting
    // in one millisecond are a burst of 50 process starts on two cores),
    // each followed from its trigger on, by the CLI and as the console does.
    // FOLLOWED=N follows only the first N (all of them run); LOCKSTEP=1
    // starts them together.
    let followed: usize = std::env::var("FOLLOWED").ok().and_then(|v| v.parse().ok()).unwrap_or(instances);
    let (tx, rx) = mpsc::channel::<f64>();
    let (followers, console_like) = rt.block_on(async {
        let c = std::sync::Arc::new(agent.client().await);
        // LOCKSTEP=1 starts them all at once instead.
        let lockstep = std::env::var_os("LOCKSTEP").is_some();
        let gap = if lockstep { Duration::ZERO } else { Duration::from_millis(100 * lines as u64 / instances as u64) };
        let (mut children, mut tasks) = (Vec::new(), Vec::new());
        for n in 0..instances {
            let p = TriggerParams { task: "chatty".into(), params: Default::default(), dedup_key: None, reason: None };
            let id = c.request::<m::TasksTrigger>(p).await.unwrap().id;
            if n < followed {
                let mut child = Command::new(cli_bin())
                    .arg("--socket")
                    .arg(&agent.socket)
                    .args(["logs", &id, "--follow"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                let out = child.stdout.take().unwrap();
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                        for d in delays(&line, now_ns()) {
                            let _ = tx.send(d);
                        }
                    }
                });
                children.push(child);
                let c = c.clone();
                tasks.push(tokio::spawn(async move { follow_like_the_console(&c, &id).await }));
            }
            tokio::time::sleep(gap).await;
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        (children, all)
    });
    drop(tx);
    for mut f in followers {
        f.wait().unwrap();
    }
    let cli: Vec<f64> = rx.into_iter().collect();
    let expected = followed * lines * 3;
    println!("latency, {instances} instances running, {} lines each:", lines * 3);
    println!("  apollo logs --follow   {} (of {expected} written)", percentiles(cli));
    println!("  steps.logs wait_ms     {} (of {expected} written; the console's logs pane)", percentiles(console_like));

    // 2. Cost while silent.
    let pid = agent.pid();
    let id = rt.block_on(async {
        let c = agent.client().await;
        let p = TriggerParams { task: "silent".into(), params: Default::default(), dedup_key: None, reason: None };
        c.request::<m::TasksTrigger>(p).await.unwrap().id
    });
    std::thread::sleep(Duration::from_millis(500));
    let hz = 100.0;
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(4));
    let alone = cpu_ticks(pid) - before;
    let followers: Vec<_> = (0..10)
        .map(|_| {
            Command::new(cli_bin())
                .arg("--socket")
                .arg(&agent.socket)
                .args(["logs", &id, "--follow"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let before = cpu_ticks(pid);
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(4));
    let followed = cpu_ticks(pid) - before;
    println!(
        "silent step: agent CPU {:.0} ms in 4 s with no follower, {:.0} ms in {:.1} s with 10 followers",
        alone as f64 * 1000.0 / hz,
        followed as f64 * 1000.0 / hz,
        t.elapsed().as_secs_f64()
    );
    for mut f in followers {
        let _ = f.kill();
        let _ = f.wait();
    }
}
