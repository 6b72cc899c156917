//! Fleet view benchmark:
//!
//!     cargo run --release -p apollo-tests --example fleet_bench -- [CONTEXTS]
//!
//! CONTEXTS (10) contexts: CONTEXTS-1 real agents and one whose socket does
//! not exist. `apollo-tui --context c0` runs in a pseudo-terminal; the time is
//! measured from typing `:fleet` to the first frame with every context's state
//! known (each reachable one connected with its counts, the other marked
//! unreachable). 5 runs, each a new console; the median is printed.

use apollo_tests::console::Console;
use apollo_tests::*;
use std::time::Instant;

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10);
    let agents: Vec<Agent> = (0..n - 1)
        .map(|_| {
            Agent::builder()
                .config("logging:\n  level: warn\n")
                .task("noop.yaml", "task: noop\nsteps:\n  - plugin: sleep\n")
                .start()
        })
        .collect();
    let config = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(config.path().join("apollo")).unwrap();
    let mut yaml = String::from("contexts:\n");
    for (i, a) in agents.iter().enumerate() {
        yaml.push_str(&format!("  - name: c{i}\n    socket: {}\n", a.socket.display()));
    }
    let gone = config.path().join("gone.sock");
    yaml.push_str(&format!("  - name: c{}\n    socket: {}\n", n - 1, gone.display()));
    std::fs::write(config.path().join("apollo/contexts.yaml"), yaml).unwrap();
    let xdg = config.path().to_str().unwrap().to_string();
    let mut runs = Vec::new();
    for _ in 0..5 {
        let mut c = Console::start_with_env(agents[0].path(), &["--context", "c0"], None, &[("XDG_CONFIG_HOME", &xdg)]);
        c.wait_for(&["[c0]", "connected"]);
        let start = Instant::now();
        c.keys(":fleet\r");
        c.wait_until("every context's state", |s| {
            s.contains("<fleet>") && s.matches("connected").count() == n && s.contains("unreachable")
        });
        runs.push(start.elapsed().as_secs_f64() * 1000.0);
        c.quit();
    }
    let mut sorted = runs.clone();
    sorted.sort_by(f64::total_cmp);
    println!("fleet benchmark ({n} contexts, one unreachable)");
    println!(
        "  :fleet → every context's state on screen: median {:.0} ms, runs {:?}",
        sorted[sorted.len() / 2],
        runs.iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>()
    );
}
