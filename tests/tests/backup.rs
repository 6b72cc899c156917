//! `apollo-agent backup FILE` while the agent runs, and a restore into a new
//! data dir ("stop, put the file in place, start"): every instance the agent
//! had acknowledged is there, and the restored agent finishes the ones that
//! were still running or queued.

use apollo_shared::state::TaskState;
use apollo_tests::*;
use serde_json::json;
use std::process::Command;

const SLOW: &str = "task: slow\nsteps:\n  - plugin: sleep\n    params:\n      seconds: 0.2\n  - plugin: sleep\n    params:\n      seconds: 0.2\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_during_a_run_restores_into_a_new_data_dir() {
    let agent = Agent::builder().config("scheduler:\n  concurrency: 4\n").task("slow.yaml", SLOW).start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(trigger(&c, "slow", json!({})).await);
    }
    wait_until(&c, &mut events, &ids[0], "the first to finish", ended).await;
    let copy = agent.path().join("copy.db");
    let out = Command::new(agent_bin())
        .current_dir(agent.path())
        .args(["--data-dir", "data", "backup"])
        .arg(&copy)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("12 instances"), "{said}");
    let st: apollo_shared::protocol::AgentStatus = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
    assert!(st.counts["PENDING"].as_u64().unwrap() + st.counts["RUNNING"].as_u64().unwrap() > 0, "taken mid-run");

    // Restore: a new data dir holding only the copy.
    let builder = Agent::builder().task("slow.yaml", SLOW);
    std::fs::create_dir_all(builder.path().join("data")).unwrap();
    std::fs::copy(&copy, builder.path().join("data/apollo.db")).unwrap();
    let restored = builder.start();
    let r = restored.client().await;
    r.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = r.take_events().unwrap();
    for id in &ids {
        let inst = wait_until(&r, &mut events, id, "the restored instance to finish", ended).await;
        assert_eq!(inst.state, TaskState::Success, "{inst:#?}");
        apollo_tests::chaos::check_history(&inst);
    }
    // A missing store is named, not created.
    let out = Command::new(agent_bin())
        .current_dir(restored.path())
        .args(["--data-dir", "nowhere", "backup", "x.db"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no store here"));
}
