//! The chaos suite's kill loop: a five-step shell task with about 20
//! instances in flight, the agent killed with SIGKILL at random moments and
//! restarted, many times; then the promises I1–I5 (see `apollo_tests::chaos`).
//!
//! CI runs 25 kills; `APOLLO_CHAOS_KILLS=200 cargo test -p apollo-tests
//! --release --test chaos -- --nocapture` runs more and prints the figures.

use apollo_tests::chaos::{self, Rng};
use apollo_tests::*;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_kill9_loop_keeps_every_promise() {
    let kills: usize = std::env::var("APOLLO_CHAOS_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(25);
    let seed = std::env::var("APOLLO_CHAOS_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("chaos: {kills} kills, seed {seed} (APOLLO_CHAOS_SEED={seed} replays the same moments)");
    let mut rng = Rng::new(seed);
    let mut agent = Agent::builder()
        .config("scheduler:\n  concurrency: 8\n  lease: 3s\n  kill_grace: 200ms\n")
        .task("chain.yaml", &chaos::chain("chain", 5))
        .start();
    let started = Instant::now();
    let mut acked: Vec<String> = Vec::new();
    for k in 0..kills {
        let c = agent.client().await;
        if k > 0 {
            chaos::check_owners(&c, agent.pid()).await;
        }
        // Top up to about 20 in flight while the clock runs to a random moment:
        // triggers go on until the kill, so some are cut mid-call.
        let want = 20u64.saturating_sub(chaos::in_flight(&c).await) as usize;
        let delays: Vec<f64> = (0..want).map(|_| rng.below(40) as f64 / 1000.0).collect();
        let window = Duration::from_millis(50 + rng.below(400));
        let feeder = tokio::spawn(async move {
            let mut ids = Vec::new();
            for d in delays {
                match try_trigger(&c, "chain", serde_json::json!({"delay": d})).await {
                    Ok(id) => ids.push(id),
                    Err(_) => break,
                }
            }
            ids
        });
        // The random moment of the kill: chaos, not a wait for a condition.
        tokio::time::sleep(window).await;
        agent.kill9();
        acked.extend(feeder.await.unwrap());
        agent.spawn();
    }
    let c = agent.client().await;
    chaos::check_owners(&c, agent.pid()).await;
    let done = chaos::check_all(&agent, &c, &acked).await;
    let reruns: usize =
        done.iter().flat_map(|i| i.steps.iter().flatten()).map(|s| s.attempts.saturating_sub(1) as usize).sum();
    assert!(done.iter().all(|i| i.state == apollo_shared::TaskState::Success), "every chain instance succeeds");
    println!(
        "chaos: {kills} kills survived in {:.1}s; {} instances acknowledged and finished, {} step re-runs after kills, nothing lost",
        started.elapsed().as_secs_f64(),
        acked.len(),
        reruns
    );
    assert!(acked.len() >= kills, "the loop kept work in flight");
}
