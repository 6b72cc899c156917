//! Console benchmark:
//!
//!     cargo run --release -p apollo-tests --example console_bench -- [INSTANCES]
//!
//! 1. Time from starting `apollo-tui` (in a pseudo-terminal) to its first full
//!    frame — the tasks view filled — on an agent holding INSTANCES
//!    (100,000) instances (5 runs).
//! 2. Render time of one frame of the tasks and timeline views at 200×60,
//!    in-process with ratatui's TestBackend (median of 5 batches of 500).
//! 3. The console's CPU while attached and idle, over 5 s.
//! 4. The agent's resident memory with those instances finished and 10,000
//!    more queued behind a queue limit of 1.

use apollo_shared::protocol::{Instance, StepRun, Transition};
use apollo_shared::state::{StepState, TaskState};
use apollo_tests::console::Console;
use apollo_tests::*;
use apollo_tui::console::app::{Action, App, News};
use apollo_tui::console::ui::{draw, Theme};
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = s.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn instance(n: usize, steps: usize) -> Instance {
    let t0 = chrono::Utc::now() - chrono::Duration::seconds(60);
    let at = |ms: i64| t0 + chrono::Duration::milliseconds(ms);
    let mut transitions = Vec::new();
    let step_runs: Vec<StepRun> = (0..steps)
        .map(|s| {
            for a in 0..2i64 {
                let base = (s as i64) * 1000 + a * 400;
                transitions.push(Transition {
                    at: at(base),
                    step: Some(s as u32),
                    from: None,
                    to: "RUNNING".into(),
                    reason: "attempt".into(),
                    actor: "agent".into(),
                });
                let to = if a == 0 { "FAILED" } else { "SUCCESS" };
                transitions.push(Transition {
                    at: at(base + 300),
                    step: Some(s as u32),
                    from: Some("RUNNING".into()),
                    to: to.into(),
                    reason: "r".into(),
                    actor: "agent".into(),
                });
            }
            StepRun {
                seq: s as u32,
                name: format!("step_{s}"),
                plugin: "shell".into(),
                plugin_version: Some("1.0.0".into()),
                state: StepState::Success,
                attempts: 2,
                failures: 1,
                params: Some(json!({"command": "true"})),
                output: Some(json!({"exit_code": 0})),
                error: None,
                started_at: Some(at(s as i64 * 1000 + 400)),
                finished_at: Some(at(s as i64 * 1000 + 700)),
                earlier: Vec::new(),
                passed: false,
                timeout: None,
                items: None,
            }
        })
        .collect();
    Instance {
        id: format!("01JBENCH{n:018}"),
        task: format!("task_{}", n % 17),
        def_hash: "h".into(),
        state: [TaskState::Success, TaskState::Failed, TaskState::Running][n % 3],
        attempt: 1,
        trace_id: "t".into(),
        priority: 50,
        queue: "default".into(),
        trigger: "manual".into(),
        dedup_key: None,
        params: json!({}),
        created_at: t0,
        started_at: Some(t0),
        finished_at: Some(at(steps as i64 * 1000)),
        next_run_at: None,
        error: Some("step \"x\" failed: exit code 1".into()),
        lease_owner: None,
        lease_expires_at: None,
        waiting: None,
        failed_steps: 0,
        pins: None,
        locks: Vec::new(),
        context: json!({"steps": {}}),
        steps: Some(step_runs),
        transitions: Some(transitions),
    }
}

fn render_ms(app: &App, frames: usize) -> f64 {
    let mut term = Terminal::new(TestBackend::new(200, 60)).unwrap();
    let theme = Theme { color: true };
    let start = Instant::now();
    for _ in 0..frames {
        term.draw(|f| draw(f, app, &theme)).unwrap();
    }
    start.elapsed().as_secs_f64() * 1000.0 / frames as f64
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 64\n  queues:\n    held: {limit: 1}\nlogging:\n  level: warn\n")
        .task("noop.yaml", "task: noop\nsteps:\n  - plugin: sleep\n")
        .task("held.yaml", "task: held\nqueue: held\nsteps:\n  - {plugin: sleep, params: {seconds: 3600}}\n")
        .start();
    let clients: Vec<Arc<apollo_tui::client::Client>> = {
        let mut v = Vec::new();
        for _ in 0..8 {
            v.push(Arc::new(agent.client().await));
        }
        v
    };
    let fill = Instant::now();
    let mut handles = Vec::new();
    for k in 0..64 {
        let c = clients[k % 8].clone();
        handles.push(tokio::spawn(async move {
            for _ in 0..(n / 64 + usize::from(k < n % 64)) {
                trigger(&c, "noop", json!({})).await;
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    // Measure against an idle agent: wait for every instance to finish.
    loop {
        let st = clients[0].request::<m::AgentStatus>(NoParams {}).await.unwrap();
        if st.counts.get("SUCCESS").and_then(serde_json::Value::as_u64).unwrap_or(0) >= n as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("{n} instances created and run in {:.1}s", fill.elapsed().as_secs_f64());

    let sock = agent.socket.display().to_string();
    let mut first = Vec::new();
    let mut idle_cpu = 0.0;
    for run in 0..5 {
        let start = Instant::now();
        let c = Console::start(agent.path(), &["--socket", &sock], None);
        c.wait_for(&["tasks (200+)", "● connected"]);
        first.push(start.elapsed().as_secs_f64() * 1000.0);
        if run == 4 {
            let pid = c.pid().unwrap();
            let t0 = cpu_ticks(pid);
            tokio::time::sleep(Duration::from_secs(5)).await;
            idle_cpu = (cpu_ticks(pid) - t0) as f64 / 100.0 / 5.0 * 100.0;
        }
        c.quit();
    }

    // 10,000 queued behind a queue limit of 1 (one of them runs).
    let mut handles = Vec::new();
    for k in 0..64 {
        let c = clients[k % 8].clone();
        handles.push(tokio::spawn(async move {
            for _ in 0..(10_000 / 64 + usize::from(k < 10_000 % 64)) {
                trigger(&c, "held", json!({})).await;
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let queues = clients[0].request::<m::QueuesStats>(NoParams {}).await.unwrap();
    let queued = queues.iter().find(|q| q.queue == "held").map(|q| q.pending).unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).unwrap_or_default();
    let rss_kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);

    let mut app = App::new("bench".into(), false);
    app.on_news(News::Tasks {
        items: (0..200).map(|i| instance(i, 3)).collect(),
        next_cursor: Some("x".into()),
        append: false,
    });
    let tasks: Vec<f64> = (0..5).map(|_| render_ms(&app, 500)).collect();
    let mut app = App::new("bench".into(), false);
    app.on_news(News::Tasks { items: vec![instance(0, 20)], next_cursor: None, append: false });
    app.update(Action::Enter);
    let timeline: Vec<f64> = (0..5).map(|_| render_ms(&app, 500)).collect();
    println!("console benchmark ({n} instances in the store)");
    println!(
        "  start → first full frame: median {:.0} ms, runs {:?}",
        median(first.clone()),
        first.iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>()
    );
    println!("  render, tasks view 200×60 (200 rows loaded): median {:.3} ms/frame", median(tasks));
    println!("  render, timeline 200×60 (20 steps × 2 attempts): median {:.3} ms/frame", median(timeline));
    println!("  console CPU attached and idle: {idle_cpu:.2}% of one core over 5 s");
    println!("  agent RSS, {n} finished and {queued} queued: {:.1} MB", rss_kib as f64 / 1024.0);
}
