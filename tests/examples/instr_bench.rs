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
//! start-up and shut-down taken out. `INSTR_BENCH_OUT=DIR` keeps the two
//! callgrind files there, for `callgrind_annotate`.

use apollo_tests::*;
use serde_json::json;

const NOOP: &str =
    "task: noop\nsteps:\n  - {name: a, plugin: sleep}\n  - {name: b, plugin: sleep}\n  - {name: c, plugin: sleep}\n";

/// Total instructions the agent ran for `n` instances.
async fn count(n: usize) -> u64 {
    let out = tempfile::tempdir().unwrap();
    // INSTR_BENCH_OUT=DIR keeps the callgrind files, for callgrind_annotate.
    let file = match std::env::var_os("INSTR_BENCH_OUT") {
        Some(dir) => {
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("INSTR_BENCH_OUT {}: {e}", dir.display()));
            std::path::PathBuf::from(dir).join(format!("callgrind.{n}.out"))
        }
        None => out.path().join("callgrind.out"),
    };
    let wrap = format!("valgrind --tool=callgrind --callgrind-out-file={} --dump-instr=no", file.display());
    std::env::set_var("APOLLO_AGENT_WRAP", &wrap);
    let mut agent = Agent::builder().config("logging:\n  level: warn\n").task("noop.yaml", NOOP).start();
    std::env::remove_var("APOLLO_AGENT_WRAP");
    {
        let c = agent.client().await;
        for _ in 0..n {
            trigger(&c, "noop", json!({})).await;
        }
        // Polled a few times a second, so the agent's count is of the
        // instances' work, not of answering a watcher.
        loop {
            let s = status(&c).await.expect("status");
            let done = s.counts.get("SUCCESS").and_then(|v| v.as_u64()).unwrap_or(0);
            if done as usize == n {
                break;
            }
            assert!(s.counts.get("FAILED").is_none_or(|v| v.as_u64() == Some(0)), "{:?}", s.counts);
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
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
