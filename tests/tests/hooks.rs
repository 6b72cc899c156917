//! Alert hooks: a command hook and a webhook (to an HTTP server inside the
//! test) receive a failed instance's alert, filtered by kind and task, with a
//! header taken from the environment; a webhook that is down is retried and
//! then reported as a `hook_failed` alert, while the scheduler keeps running.

use apollo_tests::*;
use serde_json::{json, Value};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_reach_a_command_and_a_webhook_and_a_dead_webhook_is_reported() {
    let (port, received) = http_receiver();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = format!(
        r#"alerts:
  hooks:
    - command: ["./hook.sh"]
      kinds: [instance_failed]
    - webhook: http://127.0.0.1:{port}/alerts
      headers: {{Authorization: HOOK_TOKEN}}
      tasks: [bad]
    - webhook: http://127.0.0.1:{dead}/alerts
      kinds: [instance_failed]
"#
    );
    let mut agent = Agent::builder()
        .config(&config)
        .task("bad.yaml", "task: bad\non_failure: stop\nsteps:\n  - plugin: shell\n    retry: 0\n    params:\n      command: exit 3\n")
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")
        .start();
    let hook = agent.path().join("hook.sh");
    std::fs::write(
        &hook,
        format!("#!/bin/sh\ncat >> {0}/received.jsonl\necho >> {0}/received.jsonl\n", agent.path().display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    agent.kill9();
    agent.spawn_with(&[("HOOK_TOKEN", "Bearer s3cret")]);
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks, Topic::Alerts]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let bad = trigger(&c, "bad", json!({})).await;

    // The webhook got it, with the header from the environment.
    let (head, body) = tokio::task::spawn_blocking(move || received.recv_timeout(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the webhook received the alert");
    assert!(head.starts_with("POST /alerts"), "{head}");
    assert!(head.to_ascii_lowercase().contains("authorization: bearer s3cret"), "{head}");
    assert_eq!(
        (body["kind"].as_str(), body["task"].as_str(), body["instance"].as_str()),
        (Some("instance_failed"), Some("bad"), Some(bad.as_str()))
    );

    // While the dead webhook is retried, the scheduler runs on.
    let ok = trigger(&c, "ok", json!({})).await;
    wait_until(&c, &mut events, &ok, "an instance to run during the retries", |i| {
        i.state == apollo_shared::TaskState::Success
    })
    .await;

    // The dead one is reported once its retries are spent.
    let ev = wait_event(&mut events, "a hook_failed alert", |e| {
        e.topic == Topic::Alerts && e.data.json()["kind"] == "hook_failed"
    })
    .await;
    let data = ev.data.json();
    let m = data["message"].as_str().unwrap();
    assert!(m.contains(&format!("127.0.0.1:{dead}")) && m.contains("failed 4 times"), "{m}");
    let (_, alerts) = agent.cli_json(&["alerts"]);
    assert!(alerts.as_array().unwrap().iter().any(|a| a["kind"] == "hook_failed"), "{alerts:#}");
    // The command hook got the alert as JSON on its stdin.
    let lines = std::fs::read_to_string(agent.path().join("received.jsonl")).unwrap();
    let got: Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    assert_eq!(got["kind"], "instance_failed");
}
