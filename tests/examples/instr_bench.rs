//! CPU instructions per three-step no-op instance in the agent, counted by
//! valgrind's callgrind: a figure machine noise does not move.
//!
//!     cargo build --release -p apollo-agent -p apollo-tui
//!     cargo run --release -p apollo-tests --example instr_bench -- [N]
//!
//! Runs the real agent under `valgrind --tool=callgrind` twice, once for N/5
//! and once for N instances (triggered over the socket, then waited for), and
//! prints the difference of the two runs' instruction totals divided by the
//! difference of their instance counts: what one more instance costs, with
//! start-up and shut-down taken out.

use apollo_tests::*;
use serde_json::json;

const NOOP: &str =
    "task: noop\nsteps:\n  - {name: a, plugin: sleep}\n  - {name: b, plugin: sleep}\n  - {name: c, plugin: sleep}\n";

/// Total instructions the agent ran for `n` instances.
async fn count(n: usize) -> u64 {
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("callgrind.out");
    let wrap = format!("valgrind --tool=callgrind --callgrind-out-file={} --dump-instr=no", file.display());
    std::env::set_var("APOLLO_AGENT_WRAP", &wrap);
    let mut agent = Agent::builder().config("logging:\n  level: warn\n").task("noop.yaml", NOOP).start();
    std::env::remove_var("APOLLO_AGENT_WRAP");
    {
        let c = agent.client().await;
        c.subscribe(&[Topic::Tasks]).await.unwrap();
        let mut events = c.take_events().unwrap();
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            ids.push(trigger(&c, "noop", json!({})).await);
        }
        for id in &ids {
            let inst = wait_until(&c, &mut events, id, "the instance to end", ended).await;
            assert_eq!(inst.state, apollo_shared::state::TaskState::Success);
        }
    }
    let status = agent.stop();
    assert!(status.success(), "agent under valgrind ended with {status}:\n{}", agent.log());
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}\n{}", file.display(), agent.log()));
    text.lines()
        .find_map(|l| l.strip_prefix("totals: ").or_else(|| l.strip_prefix("summary: ")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no totals in {}", file.display()))
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let small = n / 5;
    let a = count(small).await;
    let b = count(n).await;
    let per = (b.saturating_sub(a)) as f64 / (n - small) as f64;
    println!("instructions: {a} for {small} instances, {b} for {n}");
    println!("instructions per three-step instance: {per:.0}");
}
