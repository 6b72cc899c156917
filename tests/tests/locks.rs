//! Locks across instances and agents: two instances holding a lock of the
//! same name never run at once (each holder makes a directory named after
//! the lock, which fails if another holder has it), across tasks and, on
//! PostgreSQL, across agents; a waiting instance says what it waits for and
//! does not hold back work with other locks; a cancel releases the lock.
//! A lock is held until its instance ends: through a retry's backoff and a
//! park at an approval, and `apollo locks` never counts the holder as waiting.

use apollo_shared::state::TaskState;
use apollo_tests::*;
use serde_json::json;
use std::path::Path;

/// A task that takes `res:{{ params.r }}` and, while it runs, holds the
/// witness directory `<w>/lock-<r>` (an overlap is written down).
pub(crate) fn holder(task: &str, w: &Path) -> String {
    let w = w.display();
    format!(
        r#"task: {task}
params:
  r: x
  block: "no"
locks: ["res:{{{{ params.r }}}}"]
steps:
  - plugin: shell
    params:
      command: |
        mkdir {w}/lock-{{{{ params.r }}}} || {{ echo "overlap {{{{ params.r }}}} $APOLLO_TASK_ID" >> {w}/overlaps; exit 1; }}
        trap 'rmdir {w}/lock-{{{{ params.r }}}}; exit 143' TERM
        if [ "{{{{ params.block }}}}" = yes ]; then while [ ! -f {w}/gate ]; do sleep 0.05; done; fi
        sleep 0.05
        rmdir {w}/lock-{{{{ params.r }}}}
"#
    )
}

fn text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[tokio::test]
async fn a_lock_holds_back_its_second_taker_only_says_who_holds_it_and_a_cancel_releases_it() {
    let w = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 4\n")
        .task("migrate.yaml", &holder("migrate", w.path()))
        .task("backup.yaml", &holder("backup", w.path()))
        .start();
    let (c, mut events) = agent.watch().await;
    let first = trigger(&c, "migrate", json!({"r": "eu", "block": "yes"})).await;
    wait_until(&c, &mut events, &first, "the first holder running", |i| i.state == TaskState::Running).await;
    // Another task with the same lock waits; one with another lock runs.
    let second = trigger(&c, "backup", json!({"r": "eu"})).await;
    let other = trigger(&c, "migrate", json!({"r": "us"})).await;
    wait_until(&c, &mut events, &other, "the other lock's instance", |i| i.state == TaskState::Success).await;
    let waiting = get(&c, &second).await;
    assert_eq!(waiting.state, TaskState::Pending, "{waiting:?}");
    assert_eq!(waiting.locks, vec!["res:eu".to_string()]);
    let why = waiting.waiting.clone().unwrap_or_default();
    assert!(why.starts_with(&format!("waiting for lock res:eu held by {first} (task migrate) since ")), "{why}");
    let shown = text(&agent.cli(&["show", &second]));
    assert!(shown.contains("locks: res:eu") && shown.contains("waiting for lock res:eu held by"), "{shown}");
    let listed = text(&agent.cli(&["ls"]));
    assert!(listed.contains("waiting for lock res:eu"), "{listed}");
    let (_, locks) = agent.cli_json(&["locks"]);
    let eu = locks.as_array().unwrap().iter().find(|l| l["lock"] == "res:eu").expect("res:eu listed").clone();
    assert_eq!((eu["holder"]["id"].as_str(), eu["waiting"].as_u64()), (Some(first.as_str()), Some(1)), "{locks:#}");
    // Cancelling the holder releases the lock: the waiter runs.
    let out = agent.cli(&["cancel", &first, "--reason", "stuck"]);
    assert!(out.status.success(), "{}", text(&out));
    wait_until(&c, &mut events, &second, "the waiter after the cancel", |i| i.state == TaskState::Success).await;
    assert!(!w.path().join("overlaps").exists(), "{}", std::fs::read_to_string(w.path().join("overlaps")).unwrap());
    assert!(text(&agent.cli(&["locks"])).contains("no locks held or waited for"));
}

/// enter_maintenance → flaky (its first attempt anywhere fails, once: a
/// marker directory) → leave_maintenance, under `db:{{ params.cluster }}`;
/// each step writes its start and end, with its instance, to the witness.
const MAINTENANCE: &str = r#"task: maintain
params:
  cluster: eu
locks: ["db:{{ params.cluster }}"]
steps:
  - name: enter_maintenance
    plugin: shell
    params:
      command: |
        echo "start enter_maintenance $APOLLO_TASK_ID $(date +%s.%N)" >> @W@/witness
        sleep 0.1
        echo "end enter_maintenance $APOLLO_TASK_ID $(date +%s.%N)" >> @W@/witness
  - name: flaky
    plugin: shell
    retry: 2
    params:
      command: |
        echo "start flaky $APOLLO_TASK_ID $(date +%s.%N)" >> @W@/witness
        if mkdir @W@/failed-once 2>/dev/null; then echo "end flaky $APOLLO_TASK_ID failed" >> @W@/witness; exit 1; fi
        echo "end flaky $APOLLO_TASK_ID $(date +%s.%N)" >> @W@/witness
  - name: leave_maintenance
    plugin: shell
    params:
      command: |
        echo "start leave_maintenance $APOLLO_TASK_ID $(date +%s.%N)" >> @W@/witness
        sleep 0.1
        echo "end leave_maintenance $APOLLO_TASK_ID $(date +%s.%N)" >> @W@/witness
"#;

#[tokio::test]
async fn a_lock_stays_held_while_its_holder_waits_to_retry_a_step() {
    let w = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 4\n  backoff_base: 2s\n")
        .task("maintain.yaml", &MAINTENANCE.replace("@W@", &w.path().display().to_string()))
        .start();
    let (c, mut events) = agent.watch().await;
    // The first created takes the lock; the second waits for it.
    let first = trigger(&c, "maintain", json!({})).await;
    let second = trigger(&c, "maintain", json!({})).await;
    // Between its failed attempt and the retry, the first still holds the
    // lock and the second waits for it (and is the only one waiting).
    wait_until(&c, &mut events, &first, "the first's backoff", |i| i.state == TaskState::Retrying).await;
    let (_, locks) = agent.cli_json(&["locks"]);
    let eu = locks.as_array().unwrap().iter().find(|l| l["lock"] == "db:eu").expect("db:eu listed").clone();
    assert_eq!((eu["holder"]["id"].as_str(), eu["waiting"].as_u64()), (Some(first.as_str()), Some(1)), "{locks:#}");
    for id in [&first, &second] {
        let i = wait_until(&c, &mut events, id, "both instances", ended).await;
        assert_eq!(i.state, TaskState::Success, "{i:?}");
    }
    let lines = std::fs::read_to_string(w.path().join("witness")).unwrap();
    let at = |what: &str| {
        lines.lines().position(|l| l.starts_with(what)).unwrap_or_else(|| panic!("no {what:?} in:\n{lines}"))
    };
    let (from, to) = (at(&format!("start enter_maintenance {first}")), at(&format!("end leave_maintenance {first}")));
    let inside: Vec<&str> = lines.lines().take(to + 1).skip(from).collect();
    let overlap = inside.iter().any(|l| l.contains(second.as_str()));
    assert!(!overlap, "the second ran inside the first's maintenance:\n{lines}");
    let attempts = inside.iter().filter(|l| l.starts_with("start flaky")).count();
    assert_eq!(attempts, 2, "one failed attempt, then its retry:\n{lines}");
    assert!(at(&format!("start enter_maintenance {second}")) > to, "{lines}");
}

/// A task that parks at an approval step holding `res:{{ params.r }}`.
const GATED: &str = r#"task: gated
params:
  r: x
locks: ["res:{{ params.r }}"]
steps:
  - name: gate
    plugin: approval
    params:
      message: go?
"#;

#[tokio::test]
async fn the_locks_listing_counts_a_parked_holder_as_the_holder_and_not_as_waiting() {
    let agent = Agent::builder().task("gated.yaml", GATED).start();
    let (c, mut events) = agent.watch().await;
    let parked = |i: &apollo_shared::protocol::Instance| {
        i.state == TaskState::Pending && i.waiting.as_deref().is_some_and(|w| w.starts_with("waiting for approval"))
    };
    let first = trigger(&c, "gated", json!({"r": "eu"})).await;
    wait_until(&c, &mut events, &first, "the first parked", parked).await;
    let second = trigger(&c, "gated", json!({"r": "eu"})).await;
    let listed = |agent: &Agent| {
        let (_, locks) = agent.cli_json(&["locks"]);
        let eu = locks.as_array().unwrap().iter().find(|l| l["lock"] == "res:eu").expect("res:eu listed").clone();
        (eu["holder"]["id"].as_str().map(str::to_string), eu["waiting"].as_u64())
    };
    assert_eq!(listed(&agent), (Some(first.clone()), Some(1)));
    let table = text(&agent.cli(&["locks"]));
    let row = table.lines().find(|l| l.starts_with("res:eu")).unwrap_or_default();
    assert!(row.contains(&first) && row.trim_end().ends_with(" 1"), "{table}");
    // Approved, the first ends; the second takes the lock and parks: held, nobody waiting.
    let out = agent.cli(&["approve", &first, "--reason", "go"]);
    assert!(out.status.success(), "{}", text(&out));
    wait_until(&c, &mut events, &first, "the first's end", |i| i.state == TaskState::Success).await;
    wait_until(&c, &mut events, &second, "the second parked", parked).await;
    assert_eq!(listed(&agent), (Some(second.clone()), Some(0)));
}

#[tokio::test]
async fn on_postgresql_twenty_instances_of_three_tasks_over_two_locks_on_two_agents_never_overlap() {
    let schema = PgSchema::new("locks");
    let w = tempfile::tempdir().unwrap();
    let start = |name: &str| {
        let conf = format!("{}agent:\n  name: {name}\nscheduler:\n  concurrency: 4\n  lease: 2s\n", schema.config());
        let b = Agent::builder().config(&conf);
        ["a", "b", "c"].iter().fold(b, |b, t| b.task(&format!("{t}.yaml"), &holder(t, w.path()))).start()
    };
    let one = start("one");
    let two = start("two");
    let (c1, mut events) = one.watch().await;
    let c2 = two.client().await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let (c, task) = (if i % 2 == 0 { &c1 } else { &c2 }, ["a", "b", "c"][i % 3]);
        ids.push(trigger(c, task, json!({"r": if i % 4 < 2 { "x" } else { "y" }})).await);
    }
    for id in &ids {
        let i = wait_until(&c1, &mut events, id, "every instance", ended).await;
        assert_eq!(i.state, TaskState::Success, "{i:?}\n{}\n{}", one.log(), two.log());
    }
    let overlaps = std::fs::read_to_string(w.path().join("overlaps")).unwrap_or_default();
    assert!(overlaps.is_empty(), "two holders of one lock at once:\n{overlaps}");
    // Both agents took part.
    let owners = schema.sql("SELECT DISTINCT actor FROM transitions WHERE reason = 'claimed'");
    assert!(owners.len() >= 2, "only {owners:?} claimed");
}

#[test]
fn a_lock_that_names_what_a_creation_does_not_know_is_refused_by_check() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("tasks");
    std::fs::create_dir_all(&t).unwrap();
    let def = "task: t\nparams: {cluster: eu}\nlocks: [\"db:{{ steps.x.out }}\", \"db:{{ params.clustr }}\", 3]\n\
               steps:\n  - plugin: sleep\n";
    std::fs::write(t.join("t.yaml"), def).unwrap();
    let out = std::process::Command::new(agent_bin()).current_dir(dir.path()).arg("check").output().unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("locks[0]: steps: a lock is rendered when the instance is created"), "{said}");
    assert!(said.contains("locks[1]: params.clustr: the definition declares no param"), "{said}");
    assert!(said.contains("locks[2]: expected a lock name, found 3"), "{said}");
}
