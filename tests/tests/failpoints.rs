//! Crashes injected where they hurt most (the `fail` crate's fail points,
//! compiled into the test build of the agent): before and after the
//! writer's commit, between a step's return and its commit, during a
//! rollback, during recovery. After each, the agent is started again and the
//! promises I1–I5 are checked (see `apollo_tests::chaos`). The crash right
//! after a failure is recorded is in `faults.rs`.

use apollo_shared::state::TaskState;
use apollo_tests::chaos;
use apollo_tests::*;
use serde_json::json;
use std::time::Duration;

const CONFIG: &str = "scheduler:\n  concurrency: 4\n  lease: 3s\n  kill_grace: 200ms\n";

/// Starts the agent with `point` armed, runs chain instances into it until it
/// crashes there, starts it again and checks every promise.
async fn crash_at(point: &str) {
    let mut agent = Agent::builder().config(CONFIG).task("chain.yaml", &chaos::chain("chain", 5)).start();
    agent.kill9();
    agent.spawn_with(&[("FAILPOINTS", point)]);
    let acked = {
        let c = agent.client().await;
        chaos::trigger_some(&c, "chain", 6, 0.02).await
    };
    let status = agent.wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "{point}: the agent should have crashed there: {status}\n{}", agent.log());
    assert!(agent.log().contains("crashing at fail point"), "{point}: {}", agent.log());
    agent.spawn();
    let c = agent.client().await;
    let done = chaos::check_all(&agent, &c, &acked).await;
    assert!(done.iter().all(|i| i.state == TaskState::Success), "{point}: every instance succeeds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_before_the_writer_commits() {
    crash_at("store.before_commit=25*off->return").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_the_writer_commits_before_anyone_hears() {
    crash_at("store.after_commit=25*off->return").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_a_steps_return_and_its_commit() {
    crash_at("executor.before_step_commit=7*off->return").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_during_recovery() {
    let mut agent = Agent::builder().config(CONFIG).task("chain.yaml", &chaos::chain("chain", 5)).start();
    let acked = {
        let c = agent.client().await;
        let ids = chaos::trigger_some(&c, "chain", 6, 0.2).await;
        c.subscribe(&[Topic::Tasks]).await.unwrap();
        let mut events = c.take_events().unwrap();
        wait_until(&c, &mut events, &ids[0], "a step to run", |i| i.state == TaskState::Running).await;
        ids
    };
    agent.kill9();
    // Crashes after recovery took the instances over and stopped the old
    // processes, before it resumed them.
    let status = agent.run_until_exit(&[("FAILPOINTS", "recovery.before_resume=return")], Duration::from_secs(60));
    assert!(!status.success(), "{status}");
    agent.spawn();
    let c = agent.client().await;
    chaos::check_all(&agent, &c, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_during_a_rollback_resumes_it_without_undoing_a_step_twice() {
    let undo = r#"echo "R $APOLLO_IDEMPOTENCY_KEY" >> "$APOLLO_WORK_DIR/../../undone""#;
    let mut agent = Agent::builder()
        .config(CONFIG)
        .task(
            "undo.yaml",
            &format!(
                "task: undo\nsteps:\n  - name: a\n    plugin: shell\n    params:\n      command: \"true\"\n      rollback_command: '{undo}'\n  - name: b\n    plugin: shell\n    params:\n      command: \"true\"\n      rollback_command: '{undo}'\n  - name: c\n    plugin: shell\n    retry: 0\n    params:\n      command: exit 3\n      rollback_command: '{undo}'\n"
            ),
        )
        .start();
    agent.kill9();
    // The first step rolled back is committed, then the agent dies.
    agent.spawn_with(&[("FAILPOINTS", "executor.during_rollback=return")]);
    let id = {
        let c = agent.client().await;
        trigger(&c, "undo", json!({})).await
    };
    let status = agent.wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "{status}");
    agent.spawn();
    let c = agent.client().await;
    let done = chaos::check_all(&agent, &c, std::slice::from_ref(&id)).await;
    assert_eq!(done[0].state, TaskState::RolledBack, "{:#?}", done[0]);
    let undone = std::fs::read_to_string(agent.path().join("data/undone")).unwrap();
    let lines: Vec<&str> = undone.lines().collect();
    assert_eq!(
        lines,
        [format!("R {id}:2"), format!("R {id}:1"), format!("R {id}:0")],
        "each step undone once, in reverse order"
    );
}
