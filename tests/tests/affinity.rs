//! Task affinity (the original design's §5.3) on PostgreSQL with three
//! agents: in a queue with `affinity: task`, every instance of a task is
//! claimed by one live agent, whichever agent it was triggered through;
//! `apollo agents` says which; after kill -9 of an owner its tasks move to
//! a survivor within one lease.

use apollo_tests::*;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

const LEASE_SECS: f64 = 2.0;

fn task(i: usize) -> (String, String) {
    (
        format!("t{i}.yaml"),
        format!("task: t{i}\nqueue: pinned\nsteps:\n  - plugin: shell\n    params:\n      command: \"true\"\n"),
    )
}

/// Which agents (a, b, c) claimed each task's instances.
fn claimers(schema: &PgSchema) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in schema.sql(
        "SELECT t.task, split_part(r.actor, ':', 2) FROM transitions r JOIN task_instances t ON t.id = r.instance_id \
         WHERE r.step_seq IS NULL AND r.to_state = 'RUNNING'",
    ) {
        out.entry(r[0].clone().unwrap()).or_default().insert(r[1].clone().unwrap());
    }
    out
}

/// The tasks each agent serves, as `apollo agents` lists them.
fn listed(agent: &Agent) -> BTreeMap<String, Vec<String>> {
    let (_, v) = agent.cli_json(&["agents"]);
    v.as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let tasks = a["tasks"].as_array().map(|t| t.iter().map(|x| x.as_str().unwrap().to_string()).collect());
            (a["name"].as_str().unwrap().to_string(), tasks.unwrap_or_default())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_task_of_an_affinity_queue_runs_on_one_agent_and_moves_within_a_lease_when_it_dies() {
    let schema = PgSchema::new("affinity");
    let tasks: Vec<(String, String)> = (0..6).map(task).collect();
    let names = ["a", "b", "c"];
    let mut agents: Vec<Agent> = names
        .iter()
        .map(|name| {
            let conf = format!(
                "{}agent:\n  name: {name}\nscheduler:\n  lease: {LEASE_SECS}s\n  queues:\n    pinned: {{affinity: task}}\n",
                schema.config()
            );
            let mut b = Agent::builder().config(&conf);
            for (file, yaml) in &tasks {
                b = b.task(file, yaml);
            }
            b.start()
        })
        .collect();
    let (c, mut events) = agents[0].watch().await;
    let clients = [agents[0].client().await, agents[1].client().await, agents[2].client().await];
    // Four instances of each task, triggered through all three agents.
    let mut ids = Vec::new();
    for round in 0..4 {
        for i in 0..6 {
            ids.push(trigger(&clients[(round + i) % 3], &format!("t{i}"), json!({})).await);
        }
    }
    for id in &ids {
        let done = wait_until(&c, &mut events, id, "every instance", ended).await;
        assert_eq!(done.state.as_str(), "SUCCESS", "{done:?}");
    }
    let by_task = claimers(&schema);
    let mut owners = BTreeMap::new();
    for (task, who) in &by_task {
        assert_eq!(who.len(), 1, "task {task} was claimed by {who:?}");
        owners.insert(task.clone(), who.iter().next().unwrap().clone());
    }
    assert_eq!(owners.len(), 6, "{by_task:?}");
    // `apollo agents` names the same owners.
    let shown = listed(&agents[1]);
    for (task, owner) in &owners {
        assert!(shown[owner].contains(task), "{task} on {owner}, listed {shown:?}");
    }
    let distinct: BTreeSet<&String> = owners.values().collect();
    assert!(distinct.len() >= 2, "the tasks spread over the agents: {owners:?}");

    // The owner of t0 dies; new instances of t0 go to one survivor.
    let dead = owners["t0"].clone();
    let dead_at = names.iter().position(|n| *n == dead).unwrap();
    agents[dead_at].kill9();
    let survivor = (dead_at + 1) % 3;
    let (c, mut events) = agents[survivor].watch().await;
    let client = agents[survivor].client().await;
    let mut again = Vec::new();
    for _ in 0..4 {
        again.push(trigger(&client, "t0", json!({})).await);
    }
    for id in &again {
        let done = wait_until(&c, &mut events, id, "t0 after its owner died", ended).await;
        assert_eq!(done.state.as_str(), "SUCCESS", "{done:?}");
        // Claimed within one lease of its creation.
        let claimed = done
            .transitions
            .as_ref()
            .unwrap()
            .iter()
            .find(|t| t.step.is_none() && t.to == "RUNNING")
            .map(|t| t.at)
            .unwrap();
        let waited = (claimed - done.created_at).num_milliseconds() as f64 / 1000.0;
        assert!(waited < LEASE_SECS, "instance {id} waited {waited}s for a claim after its owner died");
    }
    let in_list = |set: &[String]| -> String { format!("'{}'", set.join("','")) };
    let rows = schema.sql(&format!(
        "SELECT DISTINCT split_part(r.actor, ':', 2) FROM transitions r WHERE r.step_seq IS NULL \
         AND r.to_state = 'RUNNING' AND r.instance_id IN ({})",
        in_list(&again)
    ));
    assert_eq!(rows.len(), 1, "t0's new instances went to one agent: {rows:?}");
    let new_owner = rows[0][0].clone().unwrap();
    assert_ne!(new_owner, dead);
    let shown = listed(&agents[survivor]);
    assert!(shown[&new_owner].contains(&"t0".to_string()) && shown[&dead].is_empty(), "{shown:?}");
    // The other tasks stayed where they were.
    for (task, owner) in owners.iter().filter(|(_, o)| **o != dead) {
        assert!(shown[owner].contains(task), "{task} moved from {owner}: {shown:?}");
    }
    drop(agents);
}
