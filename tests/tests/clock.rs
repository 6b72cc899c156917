//! The wall clock moved an hour back and then forward under a running agent
//! (libfaketime, Debian's `faketime`, which `.ci/run` installs): a retry
//! still runs after its backoff, a running step's lease is not broken (it is
//! not taken over or run twice), and no schedule fires twice or skips a fire
//! without saying so.

use apollo_shared::protocol::Instance;
use apollo_shared::state::TaskState;
use apollo_tests::*;
use serde_json::json;
use std::path::Path;
use std::time::Duration;

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

fn fire_time(i: &Instance) -> String {
    // "cron <fire time> by scheduler"
    i.trigger.split_whitespace().nth(1).unwrap_or_default().to_string()
}

async fn ticks(c: &apollo_tui::client::Client) -> Vec<Instance> {
    let query = ListParams { task: Some("tick".into()), limit: Some(1000), ..Default::default() };
    let page = c.request::<m::TasksList>(query).await.unwrap();
    let mut items = page.items;
    items.reverse(); // oldest first
    items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_clock_jumps_break_no_retry_lease_or_schedule() {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: install Debian's faketime package (.ci/run does)"
    );
    let builder = Agent::builder()
        .config("scheduler:\n  lease: 3s\n  backoff_base: 2s\n  kill_grace: 200ms\n")
        .task(
            "flaky.yaml",
            "task: flaky\non_failure: stop\nsteps:\n  - plugin: shell\n    retry: 1\n    params:\n      command: test -e ../../once || { touch ../../once; exit 5; }\n",
        )
        .task("long.yaml", "task: long\nsteps:\n  - plugin: sleep\n    timeout: 60\n    params:\n      seconds: 6\n")
        .task(
            "tick.yaml",
            "task: tick\nschedule: \"*/2 * * * * *\"\ncatchup: latest\nsteps:\n  - plugin: sleep\n    params:\n      seconds: 0\n",
        );
    let offset = builder.path().join("faketime");
    std::fs::write(&offset, "+0\n").unwrap();
    let mut agent = builder.start();
    agent.kill9();
    let offset_s = offset.display().to_string();
    agent.spawn_with(&[
        ("LD_PRELOAD", LIBFAKETIME),
        ("FAKETIME_TIMESTAMP_FILE", &offset_s),
        ("FAKETIME_CACHE_DURATION", "1"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ]);
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let t0 = std::time::Instant::now();
    let long = trigger(&c, "long", json!({})).await;
    wait_until(&c, &mut events, &long, "long to run", |i| i.state == TaskState::Running).await;
    let flaky = trigger(&c, "flaky", json!({})).await;
    wait_until(&c, &mut events, &flaky, "flaky to wait for its retry", |i| i.state == TaskState::Retrying).await;
    let before = ticks(&c).await.len();
    println!("clock: retry waiting after {:.1}s", t0.elapsed().as_secs_f64());

    // An hour back, while the retry waits and the long step runs.
    std::fs::write(&offset, "-1h\n").unwrap();
    let done = wait_until(&c, &mut events, &flaky, "the retry to run", ended).await;
    assert_eq!(done.state, TaskState::Success, "the retry ran after its backoff: {done:#?}");
    println!("clock: retry done after {:.1}s", t0.elapsed().as_secs_f64());

    // Two hours forward (an hour ahead of the real time): the schedule catches
    // up once, as `catchup: latest` says, and goes on.
    std::fs::write(&offset, "+1h\n").unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while ticks(&c).await.iter().filter(|t| fire_time(t) > chrono::Utc::now().to_rfc3339()).count() < 2 {
        tokio::time::timeout_at(deadline, events.recv()).await.expect("fires after the forward jump").unwrap();
    }
    println!("clock: fires after the jump forward at {:.1}s", t0.elapsed().as_secs_f64());
    let long_done = wait_until(&c, &mut events, &long, "long to finish", ended).await;
    println!("clock: long done at {:.1}s", t0.elapsed().as_secs_f64());
    assert_eq!(long_done.state, TaskState::Success);
    assert_eq!(long_done.steps.as_ref().unwrap()[0].attempts, 1, "the lease held: the step ran once");

    let all = ticks(&c).await;
    let fires: Vec<String> = all.iter().map(fire_time).collect();
    let mut sorted = fires.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, fires, "each fire once, in order: {fires:#?}");
    assert!(all.len() > before);
    let alerts = alerts_text(&c).await;
    let text = alerts.to_string();
    assert!(text.contains("clock_jump"), "{alerts:#}");
    assert!(!text.contains("lease_expired"), "a lease was broken: {alerts:#}");
    let log = agent.log();
    assert!(log.contains("the clock went back") || log.contains("fires were missed"), "the schedule said what it did");
}
