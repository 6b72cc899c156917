//! Several agents on one PostgreSQL schema (the machine's server; each test
//! makes its own schema and drops it): work spread over every agent with no
//! step run twice, takeover after an agent's death, dedicated and ordered
//! queues, schedules and events exactly once, and the agents listed.

use apollo_shared::protocol::Instance;
use apollo_tests::*;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

/// A three-step task whose every step appends its idempotency key
/// (`instance:seq`) to `witness`.
fn chain(witness: &Path) -> String {
    let step = format!(
        "  - plugin: shell\n    params:\n      command: printf '%s\\n' \"$APOLLO_IDEMPOTENCY_KEY\" >> {}\n",
        witness.display()
    );
    format!("task: chain\nsteps:\n{step}{step}{step}")
}

/// Starts `n` agents named a, b, c… on `schema`, each with `tasks`.
fn agents(schema: &PgSchema, n: usize, extra: &str, tasks: &[(&str, &str)]) -> Vec<Agent> {
    (0..n)
        .map(|i| {
            let name = ["a", "b", "c", "d"][i];
            let mut b = Agent::builder().config(&format!("{}agent:\n  name: {name}\n{extra}", schema.config()));
            for (file, yaml) in tasks {
                b = b.task(file, yaml);
            }
            b.start()
        })
        .collect()
}

/// Waits, woken by `agent`'s subscription (which hears every agent's
/// changes), until `n` instances are SUCCESS.
async fn wait_successes(c: &apollo_tui::client::Client, n: u64, what: &str) {
    let mut events = c.take_events().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let status = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
        let done = status.counts.get("SUCCESS").and_then(serde_json::Value::as_u64).unwrap_or(0);
        if done >= n {
            return;
        }
        // Many changes arrive at once; look again after the burst.
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(_)) => while events.try_recv().is_ok() {},
            Ok(None) => panic!("connection closed while waiting for {what}"),
            Err(_) => panic!("timed out waiting for {what}: {done} of {n} SUCCESS; status {status:?}"),
        }
    }
}

pub(crate) fn witness_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_agents_share_the_work_and_no_step_runs_twice() {
    let n: usize = std::env::var("APOLLO_PG_INSTANCES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let schema = PgSchema::new("share");
    let shared = tempfile::tempdir().unwrap();
    let witness = shared.path().join("witness");
    let chain = chain(&witness);
    let agents = agents(&schema, 3, "scheduler:\n  concurrency: 16\n", &[("chain.yaml", &chain)]);
    let watcher = agents[0].client().await;
    watcher.subscribe(&[Topic::Tasks]).await.unwrap();
    // Triggered through all three, concurrently.
    let clients = [agents[0].client().await, agents[1].client().await, agents[2].client().await];
    let mut calls = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let part = (n / 3) + usize::from(i < n % 3);
        calls.push(async move {
            for _ in 0..part {
                trigger(c, "chain", json!({})).await;
            }
        });
    }
    futures::future::join_all(calls).await;
    wait_successes(&watcher, n as u64, "every instance to succeed").await;

    let lines = witness_lines(&witness);
    let unique: BTreeSet<&String> = lines.iter().collect();
    assert_eq!(unique.len(), 3 * n, "every step ran");
    // Each attempt the store recorded ran once: a step runs twice only as a
    // second attempt (a retry, or an interrupted run taken up again), never
    // as two agents running the same attempt.
    let mut runs: BTreeMap<&str, usize> = BTreeMap::new();
    for l in &lines {
        *runs.entry(l.as_str()).or_default() += 1;
    }
    let attempts: BTreeMap<String, usize> = schema
        .sql("SELECT instance_id || ':' || seq, attempts FROM step_runs")
        .into_iter()
        .map(|r| (r[0].clone().unwrap(), r[1].clone().unwrap().parse().unwrap()))
        .collect();
    let again: Vec<(&str, usize)> = runs.iter().filter(|(_, &k)| k > 1).map(|(key, &k)| (*key, k)).collect();
    for (key, &k) in &runs {
        let recorded = attempts.get(*key).copied().unwrap_or(0);
        if k != recorded {
            let logs: Vec<String> = agents
                .iter()
                .flat_map(|a| {
                    a.log()
                        .lines()
                        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                        .map(str::to_string)
                        .collect::<Vec<_>>()
                })
                .collect();
            panic!("step {key} ran {k} times but {recorded} attempt(s) were recorded\n{}", logs.join("\n"));
        }
    }
    assert!(again.len() <= n / 100, "{} steps ran more than once (as recorded attempts): {again:?}", again.len());
    let by_agent: BTreeMap<String, usize> = schema
        .sql("SELECT split_part(actor, ':', 2), COUNT(*) FROM transitions WHERE reason = 'claimed' GROUP BY 1")
        .into_iter()
        .map(|r| (r[0].clone().unwrap(), r[1].clone().unwrap().parse().unwrap()))
        .collect();
    assert_eq!(by_agent.keys().cloned().collect::<Vec<_>>(), ["a", "b", "c"], "all three claimed: {by_agent:?}");
    assert!(by_agent.values().all(|&k| k >= n / 20), "the work is spread: {by_agent:?}");
    let listed = agents[1].cli_json(&["agents"]).1;
    let names: BTreeSet<&str> = listed.as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(names, BTreeSet::from(["a", "b", "c"]), "{listed:#}");
    drop(agents);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agents_instances_are_taken_over_after_its_lease() {
    let schema = PgSchema::new("takeover");
    let shared = tempfile::tempdir().unwrap();
    let witness = shared.path().join("witness");
    // Each step marks its start, works a while, marks its end.
    let step = format!(
        "  - plugin: shell\n    params:\n      command: echo \"start $APOLLO_IDEMPOTENCY_KEY\" >> {w}; sleep 0.3; echo \"end $APOLLO_IDEMPOTENCY_KEY\" >> {w}\n",
        w = witness.display()
    );
    let task = format!("task: slow\nsteps:\n{step}{step}");
    let mut agents = agents(&schema, 3, "scheduler:\n  concurrency: 4\n  lease: 2s\n", &[("slow.yaml", &task)]);
    let c = agents[0].client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mut ids = Vec::new();
    for _ in 0..24 {
        ids.push(trigger(&c, "slow", json!({})).await);
    }
    // Once agent b holds running instances, it dies.
    let held_by_b = || {
        schema.sql("SELECT COUNT(*) FROM task_instances WHERE state = 'RUNNING' AND lease_owner LIKE 'agent:b:%'")[0][0]
            .clone()
            .unwrap()
            .parse::<u32>()
            .unwrap()
    };
    wait_event(&mut events, "agent b to hold work", |_| held_by_b() > 0).await;
    let succeeded_before: BTreeSet<String> = schema
        .sql("SELECT instance_id || ':' || seq FROM step_runs WHERE state = 'SUCCESS'")
        .into_iter()
        .map(|r| r[0].clone().unwrap())
        .collect();
    agents[1].kill9();
    for id in &ids {
        let done = wait_until(&c, &mut events, id, "every instance to finish", ended).await;
        assert_eq!(done.state.as_str(), "SUCCESS", "{done:?}");
    }
    let lines = witness_lines(&witness);
    for key in &succeeded_before {
        let starts = lines.iter().filter(|l| **l == format!("start {key}")).count();
        assert_eq!(starts, 1, "step {key} recorded SUCCESS before the kill, yet started {starts} times");
    }
    let taken: Vec<Vec<Option<String>>> = schema.sql(
        "SELECT DISTINCT instance_id FROM transitions WHERE reason LIKE 'recovered%' AND actor NOT LIKE 'agent:b:%'",
    );
    assert!(!taken.is_empty(), "b's instances were taken over by a or c");
    let shown: Instance = get(&c, &taken[0][0].clone().unwrap()).await;
    let rows = shown.transitions.unwrap();
    assert!(rows.iter().any(|t| t.reason.starts_with("recovered") && !t.actor.starts_with("agent:b:")), "{rows:#?}");
    // The dead agent is listed as late (no heartbeat for half a lease), not stopped.
    let (_, listed) = agents[0].cli_json(&["agents"]);
    let b = listed.as_array().unwrap().iter().find(|x| x["name"] == "b").cloned().unwrap_or_default();
    assert_eq!((b["late"].as_bool(), b["stopped"].as_bool()), (Some(true), Some(false)), "{listed:#}");
    drop(agents);
}

/// The agent (a, b or c) holding a RUNNING instance of `task`, if one runs.
fn holder(schema: &PgSchema, task: &str) -> Option<String> {
    schema
        .sql(&format!(
            "SELECT split_part(lease_owner, ':', 2) FROM task_instances WHERE task = '{task}' AND state = 'RUNNING'"
        ))
        .first()
        .and_then(|r| r[0].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedicated_queues_go_to_their_agents_and_ordered_queues_keep_order_across_a_death() {
    let schema = PgSchema::new("queues");
    let shared = tempfile::tempdir().unwrap();
    let witness = shared.path().join("witness");
    let special = "task: sp\nqueue: special\nsteps:\n  - plugin: sleep\n    params: {seconds: 0.02}\n";
    let serial = format!(
        "task: ser\nqueue: serial\nsteps:\n  - plugin: shell\n    params:\n      command: echo \"start $APOLLO_IDEMPOTENCY_KEY\" >> {w}; sleep 0.15; echo \"end $APOLLO_IDEMPOTENCY_KEY\" >> {w}\n",
        w = witness.display()
    );
    let queues = "scheduler:\n  lease: 2s\n  queues:\n    special: {agents: [c]}\n    serial: {ordered: true}\n";
    let mut agents = agents(&schema, 3, queues, &[("sp.yaml", special), ("ser.yaml", &serial)]);
    let c = agents[0].client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();

    // The dedicated queue: only c claims, whichever agent was asked.
    let mut sp = Vec::new();
    for i in 0..20 {
        let via = agents[i % 2].client().await;
        sp.push(trigger(&via, "sp", json!({})).await);
    }
    for id in &sp {
        wait_until(&c, &mut events, id, "the dedicated queue's instances", ended).await;
    }
    let claimers = schema.sql(
        "SELECT DISTINCT split_part(t.actor, ':', 2) FROM transitions t JOIN task_instances i ON i.id = t.instance_id \
         WHERE i.task = 'sp' AND t.reason = 'claimed'",
    );
    assert_eq!(claimers, vec![vec![Some("c".to_string())]], "only c serves the dedicated queue");

    // The ordered queue: one at a time, in creation order, through the
    // death of the agent running them.
    let mut ser = Vec::new();
    for _ in 0..10 {
        ser.push(trigger(&c, "ser", json!({})).await);
    }
    wait_until(&c, &mut events, &ser[3], "the fourth ordered instance to start", |i| i.state.as_str() == "RUNNING")
        .await;
    let victim = holder(&schema, "ser").expect("an ordered instance runs");
    let v = ["a", "b", "c"].iter().position(|n| *n == victim).unwrap();
    agents[v].kill9();
    let watcher = agents[if v == 0 { 1 } else { 0 }].client().await;
    watcher.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = watcher.take_events().unwrap();
    for id in &ser {
        let done = wait_until(&watcher, &mut events, id, "every ordered instance to finish", ended).await;
        assert_eq!(done.state.as_str(), "SUCCESS", "{done:?}");
    }
    let mut open: Option<String> = None;
    let mut first_starts = Vec::new();
    for line in witness_lines(&witness) {
        let (what, key) = line.split_once(' ').unwrap();
        let inst = key.split(':').next().unwrap().to_string();
        match what {
            "start" => {
                // A start while another instance is open would be two at once;
                // the same instance again is the killed run, repeated.
                if let Some(o) = &open {
                    assert_eq!(o, &inst, "{inst} started while {o} ran: {:#?}", witness_lines(&witness));
                }
                if !first_starts.contains(&inst) {
                    first_starts.push(inst.clone());
                }
                open = Some(inst);
            }
            _ => open = None,
        }
    }
    assert_eq!(first_starts, ser, "started in creation order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_and_events_make_one_instance_whichever_agents_see_them() {
    let schema = PgSchema::new("once");
    let tick = "task: tick\nschedule: '* * * * * *'\ntimezone: UTC\nsteps:\n  - plugin: sleep\n";
    let on = "task: on\non_event: deploy\nsteps:\n  - plugin: sleep\n";
    let agents = agents(&schema, 3, "", &[("tick.yaml", tick), ("on.yaml", on)]);
    let c = agents[0].client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    // Three fires (of every agent's schedule) are seen, woken by their creation.
    let fired = || schema.sql("SELECT COUNT(*) FROM task_instances WHERE task = 'tick'")[0][0].clone().unwrap();
    wait_event(&mut events, "three fires", |_| fired().parse::<u32>().unwrap() >= 3).await;
    // One event with a dedup key, published to two agents at once.
    let (a, b) = (agents[0].client().await, agents[1].client().await);
    let (data, key) = (json!({"v": 42}), Some("release-42"));
    let (ra, rb) = tokio::join!(publish(&a, "deploy", data.clone(), key), publish(&b, "deploy", data.clone(), key));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    drop(agents);
    let per_fire =
        schema.sql("SELECT dedup_key, COUNT(*) FROM task_instances WHERE task = 'tick' GROUP BY 1 HAVING COUNT(*) > 1");
    assert!(per_fire.is_empty(), "a fire made more than one instance: {per_fire:?}");
    let keys = schema.sql("SELECT COUNT(DISTINCT dedup_key), COUNT(*) FROM task_instances WHERE task = 'tick'");
    assert_eq!(keys[0][0], keys[0][1], "one instance per fire time");
    let on = schema.sql("SELECT id FROM task_instances WHERE task = 'on'");
    assert_eq!(on.len(), 1, "one instance for the event, published twice: {ra:?} {rb:?}");
    let made: Vec<&String> = [&ra, &rb].iter().flat_map(|r| &r.instances).collect();
    assert_eq!(made.len(), 1, "exactly one of the two calls created it: {ra:?} {rb:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_through_any_agent_stops_the_instance_where_it_runs() {
    let schema = PgSchema::new("cancel");
    let long = "task: long\nsteps:\n  - plugin: shell\n    params: {command: sleep 30}\n";
    let agents = agents(&schema, 2, "", &[("long.yaml", long)]);
    let a = agents[0].client().await;
    a.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = a.take_events().unwrap();
    // One more subscriber on each agent, to see what the other one runs.
    let mut watchers = Vec::new();
    for agent in &agents {
        let w = agent.client().await;
        w.subscribe(&[Topic::Tasks]).await.unwrap();
        let rx = w.take_events().unwrap();
        watchers.push((w, rx));
    }
    let id = trigger(&a, "long", json!({})).await;
    wait_until(&a, &mut events, &id, "the instance to run", |i| i.state.as_str() == "RUNNING").await;
    let runs_on = holder(&schema, "long").unwrap();
    let other = if runs_on == "a" { &agents[1] } else { &agents[0] };
    // A subscriber on the agent that does not run it sees its steps move.
    let elsewhere = &mut watchers[if runs_on == "a" { 1 } else { 0 }].1;
    wait_event(elsewhere, "the running agent's step start, pushed to the other's subscriber", |e| {
        e.kind() == EventKind::InstanceUpdated
            && e.data.json()["id"] == id.as_str()
            && e.data.json()["step"]["state"] == "RUNNING"
    })
    .await;
    let (code, out) = other.cli_json(&["cancel", &id, "--reason", "wrong release"]);
    assert_eq!(code, 0, "{out:#}");
    let done = wait_until(&a, &mut events, &id, "the cancel", ended).await;
    assert_eq!(done.state.as_str(), "FAILED");
    assert!(done.error.as_deref().unwrap_or_default().contains("wrong release"), "{done:?}");
    let steps = done.steps.unwrap();
    assert!(steps[0].error.as_deref().unwrap_or_default().contains("cancelled"), "{steps:?}");

    // The console's agents view lists both, live.
    let sock = agents[0].socket.display().to_string();
    let mut console = apollo_tests::console::Console::start(agents[0].path(), &["--socket", &sock], None);
    console.wait_for(&["connected"]);
    console.keys(":agents\r");
    let screen = console.wait_for(&["<agents>", "agents (2)", "live"]);
    for name in ["a", "b"] {
        assert!(screen.lines().any(|l| l.starts_with(&format!("│{name} "))), "{name} is listed:\n{screen}");
    }
    assert_eq!(console.quit(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_installation_is_promoted_and_its_unfinished_work_finishes_on_postgres() {
    let schema = PgSchema::new("migrate");
    let shared = tempfile::tempdir().unwrap();
    let open = shared.path().join("gate-open");
    let gate = format!(
        "task: gate\nsteps:\n  - plugin: shell\n    params: {{command: 'while [ ! -e {} ]; do sleep 0.05; done'}}\n  - plugin: sleep\n",
        open.display()
    );
    let mut agent = Agent::builder()
        .config("scheduler:\n  concurrency: 1\n")
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")
        .task(
            "bad.yaml",
            "task: bad\non_failure: stop\nsteps:\n  - plugin: shell\n    retry: 0\n    params: {command: exit 3}\n",
        )
        .task("gate.yaml", &gate)
        .start();
    assert_eq!(agent.cli_json(&["run", "ok", "--wait"]).0, 0);
    assert_eq!(agent.cli_json(&["run", "bad", "--wait"]).0, 1);
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mid = trigger(&c, "gate", json!({})).await;
    wait_until(&c, &mut events, &mid, "the gate to run", |i| i.state.as_str() == "RUNNING").await;
    let queued = [trigger(&c, "ok", json!({})).await, trigger(&c, "ok", json!({})).await];
    let migrate = |agent: &Agent| {
        std::process::Command::new(agent_bin())
            .current_dir(agent.path())
            .args(["--data-dir", "data", "--tasks", "tasks", "migrate", "--to", &pg_url(), "--schema", &schema.name])
            .output()
            .unwrap()
    };
    // A running agent is refused.
    let out = migrate(&agent);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("stop the agent before migrating"), "{err}");
    let (_, before) = agent.cli_json(&["ls", "--limit", "100"]);
    let (_, shown_before) = agent.cli_json(&["show", &mid]);
    drop(c);
    agent.kill9();

    let out = migrate(&agent);
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{report}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(report.contains("task_instances") && report.contains("5 rows") && report.contains("verified"), "{report}");
    // Into a schema that is no longer empty: refused.
    let out = migrate(&agent);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("the target is not empty"), "{err}");

    // The same installation, now on PostgreSQL.
    std::fs::write(agent.path().join("apollo.yaml"), format!("{}scheduler:\n  concurrency: 1\n", schema.config()))
        .unwrap();
    agent.spawn();
    let (_, after) = agent.cli_json(&["ls", "--limit", "100"]);
    let summary = |v: &serde_json::Value| -> Vec<(String, String)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|i| (i["id"].as_str().unwrap().into(), i["task"].as_str().unwrap().into()))
            .collect()
    };
    assert_eq!(summary(&after), summary(&before), "the same instances");
    let (_, shown_after) = agent.cli_json(&["show", &mid]);
    let history = |v: &serde_json::Value| v["transitions"].as_array().unwrap().clone();
    let (was, is) = (history(&shown_before), history(&shown_after));
    assert!(was.len() >= 3 && is.starts_with(&was), "the same history, then the resumption:\n{was:#?}\n{is:#?}");
    std::fs::write(&open, "").unwrap();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    for id in [&mid, &queued[0], &queued[1]] {
        let done = wait_until(&c, &mut events, id, "the unfinished instances to finish on PostgreSQL", ended).await;
        assert_eq!(done.state.as_str(), "SUCCESS", "{done:?}");
    }
}
