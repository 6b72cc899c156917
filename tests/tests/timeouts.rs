//! Timeouts learned from history (the original design's §3.2): with
//! `timeout: auto`, a step runs under the p99 of its own successful runs
//! (the same step of the same task, under the same plugin version) × 1.5
//! (between a floor and a ceiling) once there are enough runs, the
//! registration's fixed timeout before — never under another task's runs of
//! the plugin; what applies and why is shown by dry-run and `apollo plugins`,
//! recorded with each attempt and named by a timeout's error.

use apollo_shared::state::TaskState;
use apollo_tests::*;
use serde_json::{json, Value};

const CONFIG: &str = r#"scheduler:
  concurrency: 20
  auto_timeout:
    min_runs: 20
    floor: 100ms
plugins:
  - name: pace
    class: apollo.plugins.sleep.Sleep
    timeout: auto
"#;

/// A step of `pace` (auto by its registration) and one of `sleep` (auto by
/// the step).
const LEARN: &str = r#"task: learn
on_failure: stop
params:
  secs: {default: 0.3}
steps:
  - name: work
    plugin: pace
    retry: 0
    params:
      seconds: "{{ params.secs }}"
"#;

const OWN: &str = r#"task: own
steps:
  - name: nap
    plugin: sleep
    timeout: auto
    params:
      seconds: 0
"#;

fn dry_timeout(agent: &Agent, task: &str) -> Value {
    let (code, v) = agent.cli_json(&["dry-run", task]);
    assert_eq!(code, 0, "{v:#}");
    v["steps"][0]["timeout"].clone()
}

#[tokio::test]
async fn timeout_auto_applies_the_p99_of_the_steps_successful_runs_times_one_and_a_half() {
    let agent = Agent::builder().config(CONFIG).task("learn.yaml", LEARN).task("own.yaml", OWN).start();
    // No history yet: the registration's fixed timeout (the sleep class's
    // 300 s), and the dry-run says why.
    let t = dry_timeout(&agent, "learn");
    assert_eq!(t["secs"], 300.0, "{t}");
    let basis = t["basis"].as_str().unwrap();
    let needs = "auto: 0 of the 20 successful runs of step work of learn (pace 1.0.0) it needs";
    assert!(basis.starts_with(needs), "{basis}");
    let t = dry_timeout(&agent, "own");
    let needs = "auto: 0 of the 20 successful runs of step nap of own (sleep";
    assert!(t["basis"].as_str().unwrap().starts_with(needs), "{t}");

    let (c, mut events) = agent.watch().await;
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.push(trigger(&c, "learn", json!({})).await);
    }
    let mut took = Vec::new();
    for id in &ids {
        let inst = wait_until(&c, &mut events, id, "a run", ended).await;
        assert_eq!(inst.state, TaskState::Success, "{inst:?}");
        let step = &inst.steps.as_ref().unwrap()[0];
        // Each attempt recorded the timeout it ran under.
        let applied = step.timeout.as_ref().expect("a learned timeout is recorded with the attempt");
        assert!(applied.basis.starts_with("auto: "), "{applied:?}");
        took.push((step.finished_at.unwrap() - step.started_at.unwrap()).num_microseconds().unwrap() as f64 / 1e6);
    }
    // The p99 of 20 runs is the slowest; × 1.5, well above the 100 ms floor.
    took.sort_by(f64::total_cmp);
    let p99 = took[((took.len() - 1) as f64 * 0.99).round() as usize];
    let want = p99 * 1.5;
    assert!(want > 0.3, "{took:?}");
    let t = dry_timeout(&agent, "learn");
    let secs = t["secs"].as_f64().unwrap();
    assert!((secs - want).abs() < 1e-6, "applied {secs}, expected p99 {p99} × 1.5 = {want}: {t}");
    let basis = t["basis"].as_str().unwrap();
    let learned =
        format!("auto: p99 {p99:.3}s × 1.5 over the last 20 successful runs of step work of learn (pace 1.0.0)");
    assert_eq!(basis, learned);
    // `apollo plugins` shows what applies now.
    let (_, plugins) = agent.cli_json(&["plugins"]);
    let pace = plugins.as_array().unwrap().iter().find(|p| p["name"] == "pace").unwrap().clone();
    assert!((pace["auto_timeout"]["secs"].as_f64().unwrap() - want).abs() < 1e-6, "{pace:#}");
    let table = String::from_utf8_lossy(&agent.cli(&["plugins"]).stdout).to_string();
    let row = table.lines().find(|l| l.starts_with("pace ")).unwrap_or_default().to_string();
    assert!(row.contains(&format!("auto {want:.3}s")), "{table}");

    // A run of 2 s is stopped at the learned timeout, which its attempt records.
    let id = trigger(&c, "learn", json!({"secs": 2})).await;
    let inst = wait_until(&c, &mut events, &id, "the timeout", ended).await;
    assert_eq!(inst.state, TaskState::Failed, "{inst:?}");
    let step = &inst.steps.as_ref().unwrap()[0];
    let error = step.error.clone().unwrap_or_default();
    let after: f64 = error
        .split("timed out after ")
        .nth(1)
        .and_then(|r| r.split('s').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a timeout: {error}"));
    assert!((after - want).abs() < 1e-6, "{error}");
    // The error names the basis the attempt ran under, not "the step's timeout".
    assert!(error.contains(&format!("({basis})")), "{error}");
    let applied = step.timeout.as_ref().unwrap();
    assert!((applied.secs - want).abs() < 1e-6 && applied.basis == basis, "{applied:?}");
    let out = String::from_utf8_lossy(&agent.cli(&["show", &id]).stdout).to_string();
    assert!(out.contains(&format!("timeout {want:.3}s (auto: p99 {p99:.3}s × 1.5")), "{out}");
}

/// Few runs are enough here (`min_runs: 5`), and the floor is low: fast
/// checks of one task would give a shell step a timeout well under 2 s.
const AUTO_FEW: &str = r#"scheduler:
  concurrency: 4
  auto_timeout:
    min_runs: 5
    floor: 100ms
"#;

const HEALTH: &str = r#"task: health
steps:
  - name: check
    plugin: shell
    timeout: auto
    params:
      command: "true"
"#;

const RELEASE: &str = r#"task: release
on_failure: stop
steps:
  - name: deploy
    plugin: shell
    timeout: auto
    retry: 0
    params:
      command: sleep 2
"#;

#[tokio::test]
async fn a_step_learns_from_its_own_runs_only_and_not_from_another_tasks_runs_of_the_plugin() {
    let agent = Agent::builder().config(AUTO_FEW).task("health.yaml", HEALTH).task("release.yaml", RELEASE).start();
    let (c, mut events) = agent.watch().await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(trigger(&c, "health", json!({})).await);
    }
    for id in &ids {
        let inst = wait_until(&c, &mut events, id, "a health check", ended).await;
        assert_eq!(inst.state, TaskState::Success, "{inst:?}");
    }
    // The checks learned from their own runs (about the 100 ms floor): a
    // timeout that would kill the deploy, had it learned from them.
    let t = dry_timeout(&agent, "health");
    let basis = t["basis"].as_str().unwrap();
    assert!(basis.starts_with("auto: p99 ") && basis.contains("runs of step check of health (shell "), "{t}");
    assert!(t["secs"].as_f64().unwrap() < 1.5, "{t}");
    // The deploy has no runs of its own: its fixed timeout, not the checks'.
    let t = dry_timeout(&agent, "release");
    let basis = t["basis"].as_str().unwrap().to_string();
    assert!(basis.starts_with("auto: 0 of the 5 successful runs of step deploy of release (shell "), "{t}");
    assert!(t["secs"].as_f64().unwrap() > 2.5, "{t}");
    let id = trigger(&c, "release", json!({})).await;
    let inst = wait_until(&c, &mut events, &id, "the deploy", ended).await;
    assert_eq!(inst.state, TaskState::Success, "the deploy was not killed at the checks' timeout: {inst:?}");
    let step = &inst.steps.as_ref().unwrap()[0];
    let applied = step.timeout.as_ref().expect("a learned timeout is recorded with the attempt");
    assert_eq!(applied.basis, basis, "{applied:?}");
}
