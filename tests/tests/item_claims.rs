//! A fan-out's items claimed one by one by every agent of a PostgreSQL
//! store: the agent that holds the instance offers its batches, the others
//! take items into their free slots, and no item runs twice at once — not
//! when a helper dies with items in hand, nor when the holder does.

use apollo_shared::protocol::Topic;
use apollo_tests::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{SystemTime, UNIX_EPOCH};

fn nanos() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

/// One run of an item as the witness saw it: who ran it, when it began.
#[derive(Debug, Clone)]
struct Run {
    agent: String,
    at: u128,
}

/// The witness's starts, by idempotency key.
fn starts(witness: &std::path::Path) -> BTreeMap<String, Vec<Run>> {
    let mut runs: BTreeMap<String, Vec<Run>> = BTreeMap::new();
    for line in std::fs::read_to_string(witness).unwrap_or_default().lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if let ["start", key, agent, at] = f[..] {
            runs.entry(key.to_string()).or_default().push(Run { agent: agent.into(), at: at.parse().unwrap() });
        }
    }
    runs
}

/// The agents (by name) that hold RUNNING items of the instance now.
fn holding(schema: &PgSchema, id: &str) -> BTreeSet<String> {
    let rows = schema.sql(&format!("SELECT holder FROM step_items WHERE instance_id = '{id}' AND state = 'RUNNING'"));
    rows.into_iter().filter_map(|r| r[0].clone()).map(|h| name_of(&h).to_string()).collect()
}

/// The agent's name in a holder (`agent:<name>:<pid>`).
fn name_of(holder: &str) -> &str {
    holder.trim_start_matches("agent:").split(':').next().unwrap_or_default()
}

fn succeeded(schema: &PgSchema, id: &str) -> BTreeSet<String> {
    let rows = schema.sql(&format!("SELECT label FROM step_items WHERE instance_id = '{id}' AND state = 'SUCCESS'"));
    rows.into_iter().filter_map(|r| r[0].clone()).collect()
}

/// The task `fleet`: one step of `items` items (`i000`…, their labels
/// returned too), `parallel` at once, each writing its start to the
/// witness (its key, its agent, the time) and then sleeping `secs`.
fn fleet(witness: &std::path::Path, items: usize, parallel: u32, secs: &str) -> (Vec<String>, String) {
    let labels: Vec<String> = (0..items).map(|i| format!("i{i:03}")).collect();
    let task = format!(
        "task: fleet\nsteps:\n  - name: each\n    plugin: shell\n    retry: 0\n    foreach: [{}]\n    \
         max_parallel: {parallel}\n    params:\n      command: echo \"start $APOLLO_IDEMPOTENCY_KEY $LOGNAME \
         $(date +%s%N)\" >> {w}; sleep {secs}\n",
        labels.join(", "),
        w = witness.display()
    );
    (labels, task)
}

/// Agents of these names on the schema, each with `config` and the task
/// `fleet` of `yaml`.
fn start(schema: &PgSchema, names: &[&str], config: &str, yaml: &str) -> Vec<Agent> {
    start_with(schema, names, config, yaml, "")
}

/// `start`, with these fail points armed (`FAILPOINTS`; empty: none).
fn start_with(schema: &PgSchema, names: &[&str], config: &str, yaml: &str, failpoints: &str) -> Vec<Agent> {
    names
        .iter()
        .map(|name| {
            let agent = Agent::builder()
                .config(&format!("{}agent:\n  name: {name}\n{config}", schema.config()))
                // Steps see a few of the agent's variables: this one says which agent ran it.
                .env("LOGNAME", name)
                .task("fleet.yaml", yaml);
            match failpoints {
                "" => agent,
                armed => agent.env("FAILPOINTS", armed),
            }
            .start()
        })
        .collect()
}

#[tokio::test]
async fn on_postgresql_every_agent_claims_items_of_one_fan_out_and_none_runs_twice_across_two_deaths() {
    let schema = PgSchema::new("item_claims");
    let shared = tempfile::tempdir().unwrap();
    let witness = shared.path().join("witness");
    let (labels, task) = fleet(&witness, 100, 8, "0.3");
    let names = ["a", "b", "c"];
    let mut agents = start(&schema, &names, "scheduler:\n  concurrency: 4\n  lease: 2s\n", &task);
    let c = agents[0].client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let id = trigger(&c, "fleet", serde_json::json!({})).await;
    // The holder runs 4 at once (its concurrency) of the step's 8: the
    // other agents claim the rest.
    let first =
        wait_until(&c, &mut events, &id, "items running on two agents", |_| holding(&schema, &id).len() >= 2).await;
    let holder = first.lease_owner.clone().unwrap_or_default();
    let holder = names.iter().position(|n| name_of(&holder) == *n).expect("a holder");
    // A helper dies with items in hand: they are offered again once its
    // heartbeat is older than its lease.
    let helper = holding(&schema, &id)
        .into_iter()
        .filter_map(|n| names.iter().position(|m| *m == n))
        .find(|i| *i != holder)
        .expect("a helper holds items");
    // The client follows from the agent that outlives both deaths.
    let last = (0..3).find(|i| *i != holder && *i != helper).unwrap();
    drop(c);
    let c = agents[last].client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mut done_before = vec![(succeeded(&schema, &id), 0)];
    agents[helper].kill9();
    let mut killed = BTreeMap::from([(names[helper].to_string(), nanos())]);
    done_before[0].1 = killed[names[helper]];
    let mid = wait_until(&c, &mut events, &id, "40 items done", |i| {
        i.steps.as_ref().and_then(|s| s[0].items.clone()).is_some_and(|n| n.ok >= 40)
    })
    .await;
    assert_eq!(mid.state, apollo_shared::state::TaskState::Running, "{mid:?}");
    // Then the holder dies: the last agent takes the instance over.
    let done = succeeded(&schema, &id);
    agents[holder].kill9();
    killed.insert(names[holder].to_string(), nanos());
    done_before.push((done, killed[names[holder]]));
    let wait = wait_until(&c, &mut events, &id, "the fan-out's end", ended);
    // Not ended in 30 s: what the store and the agent say, for the record.
    let end = match tokio::time::timeout(std::time::Duration::from_secs(30), wait).await {
        Ok(e) => e,
        Err(_) => {
            let items = schema.sql(&format!(
                "SELECT idx, state, holder, round FROM step_items WHERE instance_id = '{id}' AND state <> 'SUCCESS'"
            ));
            let offer = schema.sql("SELECT * FROM item_offers");
            let log: Vec<String> = agents[last]
                .log()
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .map(str::to_string)
                .collect();
            panic!("the fan-out did not end; items not done {items:?}\noffers {offer:?}\nwarnings {log:#?}");
        }
    };
    assert_eq!(end.state, apollo_shared::state::TaskState::Success, "{end:?}");
    assert_eq!(end.steps.as_ref().unwrap()[0].items.as_ref().map(|n| n.ok), Some(100));
    let runs = starts(&witness);
    let ran_on: BTreeSet<&str> = runs.values().flatten().map(|r| r.agent.as_str()).collect();
    assert_eq!(ran_on.len(), 3, "every agent ran items: {ran_on:?}");
    for (idx, label) in labels.iter().enumerate() {
        let key = format!("{id}:0:{idx}:{label}");
        let runs = runs.get(&key).cloned().unwrap_or_default();
        let history =
            || schema.sql(&format!("SELECT history FROM step_items WHERE instance_id = '{id}' AND label = '{label}'"));
        assert!((1..=3).contains(&runs.len()), "item {label} ran {} times: {runs:?}; {:?}", runs.len(), history());
        // Recorded SUCCESS before a death: it never ran after it.
        for (done, died) in &done_before {
            assert!(
                !done.contains(label) || runs.iter().all(|r| r.at < *died),
                "item {label} succeeded before a death and ran after it: {runs:?}; {:?}",
                history()
            );
        }
        // A run again began only after the agent of the run before it had died.
        for pair in runs.windows(2) {
            let died = killed.get(&pair[0].agent).copied();
            assert!(
                died.is_some_and(|d| d < pair[1].at),
                "item {label} ran again while its first run's agent ({}) lived: {runs:?}",
                pair[0].agent
            );
        }
    }
    // Each item's row names the agent that ran its last attempt.
    let rows = schema.sql(&format!("SELECT label, holder FROM step_items WHERE instance_id = '{id}'"));
    for r in rows {
        let (label, holder) = (r[0].clone().unwrap(), r[1].clone().unwrap_or_default());
        let key = format!("{id}:0:{}:{label}", label[1..].parse::<u32>().unwrap());
        let last_run = starts(&witness)[&key].last().unwrap().agent.clone();
        assert_eq!(name_of(&holder), last_run, "item {label}: its row says {holder}");
    }
    drop(agents);
}

/// Whether process `pid` has ended (gone, or a zombie its parent has not
/// reaped yet).
fn ended_process(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(") ").next().is_some_and(|rest| rest.starts_with('Z')),
    }
}

#[tokio::test]
async fn on_postgresql_a_cancel_stops_the_items_other_agents_run_and_an_items_log_is_asked_of_its_agent() {
    let schema = PgSchema::new("item_cancel");
    let shared = tempfile::tempdir().unwrap();
    let witness = shared.path().join("witness");
    // Each item says where it runs, then waits (its pid is the sleep's).
    let task = format!(
        "task: fleet\nsteps:\n  - name: each\n    plugin: shell\n    retry: 0\n    foreach: [i0, i1, i2, i3, i4, i5]\n    \
         max_parallel: 4\n    params:\n      command: echo \"start $APOLLO_IDEMPOTENCY_KEY $LOGNAME $$\" >> {w}; \
         echo said-by-$LOGNAME; exec sleep 120\n",
        w = witness.display()
    );
    let agents = start(&schema, &["a", "b"], "scheduler:\n  concurrency: 2\n", &task);
    let c = agents[0].client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let id = trigger(&c, "fleet", serde_json::json!({})).await;
    // Four items at once: two on each agent (concurrency 2).
    let running = wait_until(&c, &mut events, &id, "items running on both agents", |_| {
        holding(&schema, &id).len() == 2 && starts(&witness).len() == 4
    })
    .await;
    let holder = name_of(running.lease_owner.as_deref().unwrap_or_default()).to_string();
    let (here, there) = if holder == "a" { (0, 1) } else { (1, 0) };
    let rows = schema.sql(&format!(
        "SELECT label, holder FROM step_items WHERE instance_id = '{id}' AND state = 'RUNNING' ORDER BY idx"
    ));
    let helped = rows
        .iter()
        .find(|r| r[1].as_deref().map(name_of) != Some(holder.as_str()))
        .and_then(|r| r[0].clone())
        .expect("an item the helper runs");
    // Its log is on the helper: the holder says so, the helper shows it.
    let asked = agents[here].cli(&["logs", &id, "--step", "each", "--item", &helped]);
    let said = String::from_utf8_lossy(&asked.stderr).to_string();
    let helper = ["a", "b"][there];
    assert!(!asked.status.success(), "{said}");
    assert!(
        said.contains(&format!("ran on agent {helper}")) && said.contains("its log is kept on that agent"),
        "{said}"
    );
    let shown = agents[there].cli(&["logs", &id, "--step", "each", "--item", &helped]);
    assert!(String::from_utf8_lossy(&shown.stdout).contains(&format!("said-by-{helper}")), "{shown:?}");
    // A cancel through the holder stops every item, the helper's too.
    assert_eq!(agents[here].cli(&["cancel", &id, "--reason", "wrong fleet"]).status.code(), Some(0));
    let end = wait_until(&c, &mut events, &id, "the cancelled instance's end", ended).await;
    assert_eq!(end.state, apollo_shared::state::TaskState::Failed, "{end:?}");
    let pids: Vec<(String, u32)> = std::fs::read_to_string(&witness)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some((f.get(2)?.to_string(), f.get(3)?.parse().ok()?))
        })
        .collect();
    assert!(pids.iter().any(|(agent, _)| agent == helper), "{pids:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for (agent, pid) in &pids {
        // Polled: a process's end is published nowhere.
        while !ended_process(*pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "item process {pid} on agent {agent} still runs after the cancel"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    drop(agents);
}

/// Triggers `fleet` through agent a (of a and b) and waits until items run
/// on both: the instance, and the index of the agent that holds it.
async fn until_items_run_on_both(agents: &[Agent], schema: &PgSchema) -> (String, usize) {
    let c = agents[0].client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let id = trigger(&c, "fleet", serde_json::json!({})).await;
    let running =
        wait_until(&c, &mut events, &id, "items running on both agents", |_| holding(schema, &id).len() == 2).await;
    let held = usize::from(name_of(running.lease_owner.as_deref().unwrap_or_default()) != "a");
    (id, held)
}

#[tokio::test]
async fn on_postgresql_an_item_that_ends_while_its_step_is_taken_over_counts_and_the_step_ends() {
    let schema = PgSchema::new("item_takeover");
    let shared = tempfile::tempdir().unwrap();
    let witness = shared.path().join("witness");
    let task = fleet(&witness, 40, 4, "0.5").1;
    // A new life of the step waits 0.8 s before it locks the offer — the
    // agent taking over claims more items of the old life as a helper
    // meanwhile — and stays open 0.8 s once it has read what runs: those
    // items (0.5 s each) end meanwhile, and their ends wait for it. (The
    // agent's writer waits with it: the lease is long enough to be renewed
    // after both.)
    let failpoints = "items.open_round.before_lock=sleep(800);items.open_round.locked=sleep(800)";
    let config = "scheduler:\n  concurrency: 2\n  lease: 4s\n";
    let mut agents = start_with(&schema, &["a", "b"], config, &task, failpoints);
    let (id, held) = until_items_run_on_both(&agents, &schema).await;
    let (dies, lives) = (held, 1 - held);
    let c = agents[lives].client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    agents[dies].kill9();
    let end = tokio::time::timeout(
        std::time::Duration::from_secs(40),
        wait_until(&c, &mut events, &id, "the fan-out's end after the takeover", ended),
    )
    .await
    .unwrap_or_else(|_| {
        let offer = schema.sql("SELECT round, running, done FROM item_offers");
        let items =
            schema.sql(&format!("SELECT label, state, holder, round FROM step_items WHERE instance_id = '{id}'"));
        panic!("the fan-out did not end after the takeover: offer (round, running, done) {offer:?}; items {items:?}")
    });
    assert_eq!(end.state, apollo_shared::state::TaskState::Success, "{end:?}");
    assert_eq!(end.steps.as_ref().unwrap()[0].items.as_ref().map(|n| n.ok), Some(40));
    // The takeover's new life did wait for items of the helper's to end.
    let took = schema.sql(&format!(
        "SELECT COUNT(*) FROM step_items WHERE instance_id = '{id}' AND holder LIKE 'agent:{}:%' AND round = 1",
        ["a", "b"][lives]
    ));
    assert_ne!(took[0][0].as_deref(), Some("0"), "the agent that took over ran items of the first life");
    // None of them was interrupted as left over and run again beside itself.
    let survivor = ["a", "b"][lives];
    for (key, runs) in starts(&witness) {
        let here = runs.iter().filter(|r| r.agent == survivor).count();
        assert!(here <= 1, "item {key} ran {here} times on {survivor}, which never stopped: {runs:?}");
    }
    drop(agents);
}

#[tokio::test]
async fn on_postgresql_an_item_that_ends_as_a_restarted_holder_opens_the_step_again_counts() {
    let schema = PgSchema::new("item_reopen");
    let shared = tempfile::tempdir().unwrap();
    let witness = shared.path().join("witness");
    // Odd items take 6 s, even ones 1 s: when the holder has stopped, the
    // helper has an item begun since, with time left.
    let task = fleet(&witness, 16, 4, "$((1 + 5 * $(expr ${APOLLO_IDEMPOTENCY_KEY##*:i} % 2)))").1;
    let config = "scheduler:\n  concurrency: 2\n  lease: 10s\n";
    let mut agents = start(&schema, &["a", "b"], config, &task);
    let (id, held) = until_items_run_on_both(&agents, &schema).await;
    let (restarts, helps) = (held, 1 - held);
    let c = agents[helps].client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    // The holder stops (its own items finish; its offer is withdrawn) while
    // the helper's items run on; started again, it opens the step again and
    // holds that write 3.5 s once it has read what runs: the helper's
    // items end meanwhile, with no offer open when their ends began.
    assert_eq!(agents[restarts].stop().code(), Some(0));
    assert_eq!(holding(&schema, &id), BTreeSet::from([["a", "b"][helps].to_string()]), "the helper runs items on");
    agents[restarts].spawn_with(&[("FAILPOINTS", "items.open_round.locked=sleep(3500)")]);
    let end = tokio::time::timeout(
        std::time::Duration::from_secs(45),
        wait_until(&c, &mut events, &id, "the fan-out's end after the restart", ended),
    )
    .await
    .unwrap_or_else(|_| {
        let offer = schema.sql("SELECT round, running, done FROM item_offers");
        panic!("the fan-out did not end after the restart: offer (round, running, done) {offer:?}")
    });
    assert_eq!(end.state, apollo_shared::state::TaskState::Success, "{end:?}");
    assert_eq!(end.steps.as_ref().unwrap()[0].items.as_ref().map(|n| n.ok), Some(16));
    drop(agents);
}
