//! External-plugin overhead: the same three-step task run with a no-op
//! external plugin in one-shot mode (a shell script), a no-op in worker mode
//! (a Python worker), and the built-in no-op (`sleep` 0), one instance at a
//! time on the real agent.
//!
//!     cargo run --release -p apollo-tests --example plugin_bench -- [N]
//!
//! Prints, for each, the median time of one step's execute (from the ledger's
//! started_at/finished_at) and of one whole step (an instance's run time / 3,
//! which includes the external plugin's validate call), and their ratio.

use apollo_tests::*;
use apollo_tui::client::Client;
use serde_json::json;

const NOOP: &str = "#!/bin/sh\ncase \"$1\" in describe) echo '{\"version\": \"1.0.0\"}' ;; *) echo '{}' ;; esac\n";

/// The same no-op as a worker: one process serves every call.
const WORKER: &str = r#"#!/usr/bin/env python3
import json, sys
if sys.argv[1] == "describe":
    print(json.dumps({"version": "1.0.0", "mode": "worker"}))
    sys.exit(0)
for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.write('{"id": %d, "result": {}}\n' % req["id"])
    sys.stdout.flush()
"#;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

async fn measure(c: &Client, task: &str, n: usize) -> (f64, f64) {
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap_or_else(|| panic!("one subscription per client"));
    let (mut exec, mut whole) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let id = trigger(c, task, json!({})).await;
        let inst = wait_until(c, &mut events, &id, "the end", ended).await;
        let steps = inst.steps.unwrap();
        for s in &steps {
            exec.push((s.finished_at.unwrap() - s.started_at.unwrap()).num_microseconds().unwrap() as f64 / 1000.0);
        }
        let run = inst.finished_at.unwrap() - inst.started_at.unwrap();
        whole.push(run.num_microseconds().unwrap() as f64 / 1000.0 / steps.len() as f64);
    }
    (median(exec), median(whole))
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(300);
    let agent = Agent::builder()
        .config("logging:\n  level: warn\n")
        .plugin("noop.sh", NOOP)
        .plugin("wnoop.py", WORKER)
        .task("ext.yaml", "task: ext\nsteps:\n  - {name: a, plugin: noop}\n  - {name: b, plugin: noop}\n  - {name: c, plugin: noop}\n")
        .task("worker.yaml", "task: worker\nsteps:\n  - {name: a, plugin: wnoop}\n  - {name: b, plugin: wnoop}\n  - {name: c, plugin: wnoop}\n")
        .task("builtin.yaml", "task: builtin\nsteps:\n  - {name: a, plugin: sleep}\n  - {name: b, plugin: sleep}\n  - {name: c, plugin: sleep}\n")
        .start();
    let (ext_exec, ext_step) = measure(&agent.client().await, "ext", n).await;
    let (w_exec, w_step) = measure(&agent.client().await, "worker", n).await;
    let (bi_exec, bi_step) = measure(&agent.client().await, "builtin", n).await;
    println!("external-plugin overhead, {n} instances × 3 steps each, one at a time");
    println!(
        "  execute median:   one-shot {ext_exec:.2} ms, worker {w_exec:.3} ms, built-in {bi_exec:.3} ms; ratios to built-in {:.1}× and {:.2}×",
        ext_exec / bi_exec.max(0.001),
        w_exec / bi_exec.max(0.001)
    );
    println!(
        "  whole step median (validate + execute + commits): one-shot {ext_step:.2} ms, worker {w_step:.3} ms, built-in {bi_step:.3} ms; ratios {:.2}× and {:.2}×",
        ext_step / bi_step,
        w_step / bi_step
    );
}
