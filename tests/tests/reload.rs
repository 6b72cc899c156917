//! SIGHUP reads the config file again: scheduler limits, alert hooks and
//! metrics take effect in the running agent, each setting that needs a
//! restart is named in an alert, and a file that no longer parses changes
//! nothing and is reported with its line.

use apollo_shared::state::TaskState;
use apollo_tests::*;
use serde_json::json;
use std::time::Duration;

fn hangup(agent: &Agent) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.pid()), nix::sys::signal::Signal::SIGHUP).unwrap();
}

/// Connects to the metrics port once it is served (it is opened just after
/// the reload is announced), and returns the exposition.
fn scrape_when_served(port: u16) -> String {
    use std::io::{Read, Write};
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut s = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("metrics were not served on port {port}: {e}"),
        }
    };
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_limits_hooks_and_metrics_and_names_what_needs_a_restart() {
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 1\n  shutdown_grace: 1s\n")
        .task("hold.yaml", "task: hold\nsteps:\n  - plugin: shell\n    params:\n      command: sleep 30\n")
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks, Topic::Agent]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let ids = [
        trigger(&c, "hold", json!({})).await,
        trigger(&c, "hold", json!({})).await,
        trigger(&c, "hold", json!({})).await,
    ];
    wait_until(&c, &mut events, &ids[0], "the first to run", |i| i.state == TaskState::Running).await;
    assert_eq!(get(&c, &ids[2]).await.state, TaskState::Pending, "concurrency 1 runs one at a time");

    // The new file: room for three, a webhook, metrics, and a database setting.
    let (hook_port, received) = http_receiver();
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    std::fs::write(
        agent.path().join("apollo.yaml"),
        format!(
            "scheduler:\n  concurrency: 3\n  shutdown_grace: 1s\ndatabase:\n  synchronous: normal\n\
             metrics:\n  listen: 127.0.0.1:{metrics_port}\n\
             alerts:\n  hooks:\n    - webhook: http://127.0.0.1:{hook_port}/alerts\n      kinds: [restart_needed]\n"
        ),
    )
    .unwrap();
    hangup(&agent);
    let ev = wait_event(&mut events, "config.reloaded", |e| e.kind() == EventKind::ConfigReloaded).await;
    assert_eq!(ev.data.json()["applied"], json!(["scheduler", "alerts.hooks", "metrics"]), "{ev:?}");
    assert_eq!(ev.data.json()["need_restart"], json!(["database"]), "{ev:?}");

    // The limit: the two waiting instances start without anything else happening.
    for id in &ids[1..] {
        wait_until(&c, &mut events, id, "a queued instance to start", |i| i.state == TaskState::Running).await;
    }
    let status = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
    assert_eq!(status.concurrency, 3);

    // The hook added by the reload received the alert naming what waits.
    let (_, alert) = tokio::task::spawn_blocking(move || received.recv_timeout(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the webhook added by SIGHUP received the restart_needed alert");
    assert_eq!(alert["kind"], "restart_needed");
    assert!(alert["message"].as_str().unwrap().contains("database changed"), "{alert}");

    // Metrics are served on the new address.
    let text = tokio::task::spawn_blocking(move || scrape_when_served(metrics_port)).await.unwrap();
    assert!(text.contains("apollo_queue_running{queue=\"default\"} 3"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_that_no_longer_parses_changes_nothing_and_says_where() {
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 2\n")
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Alerts]).await.unwrap();
    let mut events = c.take_events().unwrap();
    std::fs::write(agent.path().join("apollo.yaml"), "scheduler:\n  concurrency: 5\n  concurency: 6\n").unwrap();
    hangup(&agent);
    let ev = wait_event(&mut events, "a config_error alert", |e| e.data.json()["kind"] == "config_error").await;
    let data = ev.data.json();
    let msg = data["message"].as_str().unwrap();
    assert!(msg.contains("apollo.yaml: line 3") && msg.contains("concurency"), "{msg}");
    assert!(msg.contains("the settings in force are kept"), "{msg}");
    let status = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
    assert_eq!(status.concurrency, 2, "nothing of the broken file was applied");
    let (code, inst) = agent.cli_json(&["run", "ok", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (0, Some("SUCCESS")), "{inst}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freeze_window_that_would_freeze_nothing_is_refused_by_a_reload() {
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 2\n")
        .task("ok.yaml", "task: ok\nqueue: q1\nsteps:\n  - plugin: sleep\n")
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Alerts]).await.unwrap();
    let mut events = c.take_events().unwrap();
    std::fs::write(
        agent.path().join("apollo.yaml"),
        "scheduler:\n  concurrency: 5\n  freezes:\n    - name: now\n      from: 2000-01-01T00:00:00Z\n      \
         until: 2100-01-01T00:00:00Z\n      queues: [q1x]\n      reason: typo\n",
    )
    .unwrap();
    hangup(&agent);
    let ev = wait_event(&mut events, "a config_error alert", |e| e.data.json()["kind"] == "config_error").await;
    let data = ev.data.json();
    let msg = data["message"].as_str().unwrap();
    assert!(
        msg.contains("line 7") && msg.contains("no queue \"q1x\"") && msg.contains("did you mean \"q1\"?"),
        "{msg}"
    );
    assert!(msg.contains("the settings in force are kept"), "{msg}");
    let status = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
    assert_eq!(status.concurrency, 2, "nothing of the refused file was applied");
}
