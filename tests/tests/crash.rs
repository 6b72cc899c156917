//! kill -9 of the agent mid-run: after a restart the instance resumes at the
//! interrupted step and finishes, and no step whose SUCCESS was recorded
//! runs again.

use apollo_shared::state::{StepState, TaskState};
use apollo_tests::*;
use serde_json::json;
use std::collections::BTreeMap;

const STEPS: usize = 5;

fn definition() -> String {
    let mut y = String::from("task: chain\nsteps:\n");
    for i in 0..STEPS {
        // Each step records that it started, works a moment, and records that it finished.
        y.push_str(&format!(
            "  - name: s{i}\n    plugin: shell\n    params:\n      command: echo start s{i} >> ../../witness; sleep 0.3; echo end s{i} >> ../../witness\n"
        ));
    }
    y
}

fn starts(agent: &Agent) -> BTreeMap<String, usize> {
    let w = std::fs::read_to_string(agent.path().join("data/witness")).unwrap_or_default();
    let mut m = BTreeMap::new();
    for l in w.lines().filter_map(|l| l.strip_prefix("start ")) {
        *m.entry(l.to_string()).or_default() += 1;
    }
    m
}

#[tokio::test]
async fn killed_at_several_points_the_instance_resumes_and_no_recorded_success_runs_again() {
    let mut agent = Agent::builder().task("chain.yaml", &definition()).start();
    let id = {
        let c = agent.client().await;
        trigger(&c, "chain", json!({})).await
    };
    // Kill points: just after s0's SUCCESS is committed, just after s2's, and
    // while s3 runs.
    let points: [(usize, StepState); 3] = [(0, StepState::Success), (2, StepState::Success), (3, StepState::Running)];
    let mut frozen: BTreeMap<String, usize> = BTreeMap::new();
    for (seq, state) in points {
        let (c, mut events) = agent.watch().await;
        let what = format!("s{seq} {state}");
        let inst = wait_until(&c, &mut events, &id, &what, |i| i.steps.as_ref().unwrap()[seq].state == state).await;
        agent.kill9();
        // Every step recorded SUCCESS at the kill keeps its start count from now on.
        let counts = starts(&agent);
        for s in inst.steps.unwrap().iter().filter(|s| s.state == StepState::Success) {
            frozen.insert(s.name.clone(), counts.get(&s.name).copied().unwrap_or(0));
        }
        agent.spawn();
    }
    let (c, mut events) = agent.watch().await;
    let inst = wait_until(&c, &mut events, &id, "the end", ended).await;
    assert_eq!(inst.state, TaskState::Success, "{inst:#?}\n{}", agent.log());
    let counts = starts(&agent);
    assert!(frozen.len() >= 3, "{frozen:?}");
    for (name, n) in &frozen {
        assert_eq!(counts[name], *n, "{name} ran again after its SUCCESS was recorded: {counts:?}");
    }
    // s0 finished before the first kill: it ran exactly once.
    assert_eq!(counts["s0"], 1, "{counts:?}");
    // The interrupted step ran again (at-least-once) and the run ended with every step once more at most.
    assert!(counts["s3"] >= 1 && counts["s4"] == 1, "{counts:?}");
    let steps = inst.steps.unwrap();
    assert!(steps.iter().all(|s| s.state == StepState::Success));
    let recovered = inst.transitions.unwrap().iter().filter(|t| t.reason.contains("recovered")).count();
    assert_eq!(recovered, 3, "each restart recovers the instance once");
}

/// A step that ends while the agent shuts down (within the grace) has its
/// SUCCESS recorded on its own: the next step is not started in the same
/// write, so it waits for the next start instead of running during the drain.
#[tokio::test]
async fn a_step_ending_during_shutdown_is_recorded_and_the_next_waits_for_the_next_start() {
    let def = "task: pair\nsteps:\n  - name: a\n    plugin: shell\n    params:\n      command: echo start a >> ../../witness; sleep 1\n  - name: b\n    plugin: shell\n    params:\n      command: echo start b >> ../../witness\n";
    let mut agent = Agent::builder().config("scheduler:\n  shutdown_grace: 20s\n").task("pair.yaml", def).start();
    let id = {
        let (c, mut events) = agent.watch().await;
        let id = trigger(&c, "pair", json!({})).await;
        wait_until(&c, &mut events, &id, "a RUNNING", |i| i.steps.as_ref().unwrap()[0].state == StepState::Running)
            .await;
        id
    };
    let status = agent.stop();
    assert!(status.success(), "{status}\n{}", agent.log());
    let counts = starts(&agent);
    assert_eq!(counts.get("a"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("b"), None, "b ran while the agent shut down: {counts:?}");

    agent.spawn();
    let (c, mut events) = agent.watch().await;
    let inst = wait_until(&c, &mut events, &id, "the end", ended).await;
    assert_eq!(inst.state, TaskState::Success, "{inst:#?}\n{}", agent.log());
    let counts = starts(&agent);
    assert_eq!((counts["a"], counts["b"]), (1, 1), "a's recorded SUCCESS is not run again: {counts:?}");
    let steps = inst.steps.unwrap();
    assert_eq!((steps[0].attempts, steps[1].attempts), (1, 1), "b started once, after the restart");
}
