//! Canary rollouts of a plugin version (the original design's §4.3): a
//! share of new instances goes to the new version, the two are compared
//! side by side, and the rollout is promoted, aborted, or aborted by itself
//! when the new version fails. On SQLite with one agent (the share alone),
//! and on PostgreSQL with three agents (the new version on one of them).

use apollo_shared::protocol::{Event, Instance, Topic};
use apollo_shared::state::TaskState;
use apollo_tests::*;
use serde_json::{json, Value};
use std::path::Path;

/// Plugin `ver` at `version`: its output names the version; `fails` makes
/// every execute fail (a bad release).
fn ver(version: &str, fails: bool) -> String {
    match fails {
        true => ver_plugin(version, "echo '{\"error\": \"bad release\"}'; exit 1"),
        false => ver_plugin(version, &format!("echo '{{\"version\": \"{version}\"}}'")),
    }
}

/// Writes the versions' executables into `dir/bin` and returns their
/// `plugins:` registrations (one name, several versions).
pub(crate) fn versions(dir: &Path, list: &[(&str, bool)]) -> String {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let mut conf = String::from("plugins:\n");
    for (v, fails) in list {
        let path = dir.join(format!("bin/ver-{v}.sh"));
        std::fs::write(&path, ver(v, *fails)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        conf.push_str(&format!("  - name: ver\n    command: {}\n    retry: 0\n", path.display()));
    }
    conf
}

const CANARY: &str = "task: canary\nsteps:\n  - name: work\n    plugin: ver\n    version: \">=1\"\n";

/// The version an instance's step ran, and whether its arm was the new one.
fn ran(i: &Instance) -> (String, Option<bool>) {
    let step = &i.steps.as_ref().unwrap()[0];
    let arm = i.pins.as_ref().and_then(|p| p.get("ver")).map(|p| p.new);
    (step.plugin_version.clone().unwrap_or_default(), arm)
}

/// Triggers `n` instances of `canary` through `agent` and waits (woken by
/// its events) until each has ended.
async fn run_all(agent: &Agent, n: usize) -> Vec<Instance> {
    let (c, mut events) = agent.watch().await;
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(trigger(&c, "canary", json!({})).await);
    }
    let mut out = Vec::new();
    for id in ids {
        out.push(wait_until(&c, &mut events, &id, "every instance", ended).await);
    }
    out
}

/// A subscription to `agent`'s alerts (on PostgreSQL every agent's).
async fn alerts(agent: &Agent) -> (apollo_tui::client::Client, tokio::sync::mpsc::Receiver<Event>) {
    let c = agent.client().await;
    c.subscribe(&[Topic::Alerts]).await.unwrap();
    let events = c.take_events().unwrap();
    (c, events)
}

/// Waits for the `rollout_aborted` alert naming `version`.
async fn aborted_alert(events: &mut tokio::sync::mpsc::Receiver<Event>, version: &str) -> String {
    let e = wait_event(events, "the rollout_aborted alert", |e| {
        let a = e.data.json();
        a["kind"] == "rollout_aborted" && a["message"].as_str().unwrap_or_default().contains(version)
    })
    .await;
    e.data.json()["message"].as_str().unwrap_or_default().to_string()
}

fn rollout_of<'a>(list: &'a Value, version: &str) -> &'a Value {
    list.as_array().unwrap().iter().find(|r| r["version"] == version).unwrap_or_else(|| panic!("{list:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_sends_its_share_to_the_new_version_and_is_aborted_promoted_and_aborted_by_itself() {
    let b = Agent::builder();
    let plugins = versions(b.path(), &[("1.0.0", false), ("2.0.0", false), ("3.0.0", true)]);
    let config = format!("{plugins}scheduler:\n  concurrency: 4\n  lease: 1s\n");
    let agent = b.config(&config).task("canary.yaml", CANARY).start();
    let (_c, mut raised) = alerts(&agent).await;

    // Refused with the reason: no such version, no reason given.
    let out = agent.cli(&["rollout", "start", "ver", "9.0.0", "--reason", "x"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("no live agent has ver 9.0.0 registered"), "{err}");

    // 2.0.0 over 1.0.0 (the newest other version), half the new instances.
    let out = agent.cli(&["rollout", "start", "ver", "2.0.0", "--share", "50", "--reason", "canary of 2.0.0"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("ver 2.0.0 over 1.0.0: 50% of new instances"), "{said}");
    let again = agent.cli(&["rollout", "start", "ver", "2.0.0", "--reason", "twice"]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("is running already"), "a second one is refused");

    let n = 60;
    let done = run_all(&agent, n).await;
    let mut new = 0;
    for i in &done {
        assert_eq!(i.state, TaskState::Success, "{i:?}");
        match ran(i) {
            (v, Some(true)) => {
                assert_eq!(v, "2.0.0", "the new arm runs the new version");
                new += 1;
            }
            (v, Some(false)) => assert_eq!(v, "1.0.0", "the old arm runs the old version"),
            other => panic!("every instance of a task whose steps accept both has an arm: {other:?}"),
        }
    }
    // Binomial(60, 0.5): mean 30, sd 3.9; four sd either side.
    assert!((15..=45).contains(&new), "{new} of {n} went to the new version");

    // `show` says which arm an instance was given.
    let shown = String::from_utf8_lossy(&agent.cli(&["show", &done[0].id]).stdout).to_string();
    assert!(shown.contains("rollout: ver ") && shown.contains(" arm of rollout-"), "{shown}");

    // Side by side since the start.
    let (_, list) = agent.cli_json(&["rollout"]);
    let r = rollout_of(&list, "2.0.0");
    assert_eq!(r["new"]["runs"], json!(new), "{r:#}");
    assert_eq!(r["old"]["runs"], json!(n - new), "{r:#}");
    let table = String::from_utf8_lossy(&agent.cli(&["rollout"]).stdout).to_string();
    assert!(table.contains("2.0.0 (new)") && table.contains("1.0.0 (old)"), "{table}");

    // Abort: everything goes back to 1.0.0, alerted and audited.
    let out = agent.cli(&["rollout", "abort", "ver", "--reason", "seen enough"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for i in run_all(&agent, 10).await {
        assert_eq!(ran(&i), ("1.0.0".to_string(), None), "after the abort");
    }
    assert!(aborted_alert(&mut raised, "2.0.0").await.contains("aborted by root"));

    // Again, promoted: 2.0.0 for everything (3.0.0, registered too, is not
    // chosen without a rollout of its own).
    assert!(agent.cli(&["rollout", "start", "ver", "2.0.0", "--share", "10", "--reason", "again"]).status.success());
    assert!(agent.cli(&["rollout", "promote", "ver", "--reason", "healthy"]).status.success());
    for i in run_all(&agent, 10).await {
        assert_eq!(ran(&i), ("2.0.0".to_string(), None), "after the promote");
    }

    // A bad release: 3.0.0 for every new instance, aborted by itself after
    // 5 runs failing 100% against 2.0.0's 0%.
    let out = agent.cli(&[
        "rollout",
        "start",
        "ver",
        "3.0.0",
        "--share",
        "100",
        "--min-runs",
        "5",
        "--abort-margin",
        "20",
        "--reason",
        "3.0.0",
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("ver 3.0.0 over 2.0.0"), "{out:?}");
    let bad = run_all(&agent, 5).await;
    assert!(bad.iter().all(|i| i.state != TaskState::Success && ran(i) == ("3.0.0".into(), Some(true))), "{bad:?}");
    aborted_alert(&mut raised, "3.0.0").await;
    let (_, list) = agent.cli_json(&["rollout"]);
    let aborted = rollout_of(&list, "3.0.0");
    assert_eq!(aborted["state"], "aborted", "{aborted:#}");
    let why = aborted["end_reason"].as_str().unwrap();
    assert!(why.contains("automatic abort: ver 3.0.0 failed 100% of 5 runs against 0% for 2.0.0"), "{why}");
    for i in run_all(&agent, 5).await {
        assert_eq!((i.state, ran(&i)), (TaskState::Success, ("2.0.0".to_string(), None)), "after the automatic abort");
    }

    // All of it audited, with who and why.
    let audit = String::from_utf8_lossy(&agent.cli(&["audit"]).stdout).to_string();
    for said in
        ["rollout of ver 2.0.0 over 1.0.0 started", "seen enough", "promoted: healthy", "automatic abort (agent"]
    {
        assert!(audit.contains(said), "{said:?} in\n{audit}");
    }
}

/// Waits until every agent acts on a rollout's end: the others learn of it
/// at their next maintenance tick (a third of the lease), so instances run
/// one by one until `ok` holds for three in a row (one each agent could
/// claim), for at most 10 s.
async fn settled(agent: &Agent, ok: impl Fn(&Instance) -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut in_a_row = 0;
    while in_a_row < 3 {
        assert!(std::time::Instant::now() < until, "the agents did not act on the rollout's end within 10 s");
        let i = run_all(agent, 1).await.remove(0);
        in_a_row = if ok(&i) { in_a_row + 1 } else { 0 };
    }
}

/// Which agent claimed instance `id` (the actor of its RUNNING move).
fn claimer(schema: &PgSchema, id: &str) -> String {
    let rows = schema.sql(&format!(
        "SELECT split_part(actor, ':', 2) FROM transitions WHERE instance_id = '{id}' AND step_seq IS NULL \
         AND to_state = 'RUNNING' ORDER BY id LIMIT 1"
    ));
    rows[0][0].clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_the_new_arm_runs_only_on_the_rollout_agents_and_a_failing_version_is_aborted_by_itself() {
    let schema = PgSchema::new("rollout");
    // a has 1.0.0; b has 1.0.0 and 2.0.0; c has 1.0.0, 2.0.0 and a bad
    // 3.0.0 (so `--agents b`, not what c lacks, keeps the new arm on b).
    let start = |name: &str, list: &[(&str, bool)]| {
        let b = Agent::builder();
        let plugins = versions(b.path(), list);
        let conf =
            format!("{}{plugins}agent:\n  name: {name}\nscheduler:\n  concurrency: 4\n  lease: 1s\n", schema.config());
        b.config(&conf).task("canary.yaml", CANARY).start()
    };
    let a = start("a", &[("1.0.0", false)]);
    let b = start("b", &[("1.0.0", false), ("2.0.0", false)]);
    let c_agent = start("c", &[("1.0.0", false), ("2.0.0", false), ("3.0.0", true)]);
    let (_c, mut raised) = alerts(&a).await;

    // Through a (which lacks it): 2.0.0 for half, on b only.
    let out = a.cli(&["rollout", "start", "ver", "2.0.0", "--share", "50", "--agents", "b", "--reason", "canary"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("ver 2.0.0 over 1.0.0: 50% of new instances on b"), "{said}{out:?}");
    let n = 40;
    let done = run_all(&a, n).await;
    let mut new = 0;
    for i in &done {
        assert_eq!(i.state, TaskState::Success, "{i:?}\n{}", a.log());
        match ran(i) {
            (v, Some(true)) => {
                assert_eq!((v.as_str(), claimer(&schema, &i.id).as_str()), ("2.0.0", "b"), "the new arm, on b");
                new += 1;
            }
            (v, Some(false)) => assert_eq!(v, "1.0.0", "the old arm, anywhere"),
            other => panic!("{other:?}"),
        }
    }
    // Binomial(40, 0.5): mean 20, sd 3.2; four sd either side.
    assert!((8..=32).contains(&new), "{new} of {n} went to the new version");
    // Every agent sees the same rollout and figures.
    let (_, list) = c_agent.cli_json(&["rollout"]);
    assert_eq!(rollout_of(&list, "2.0.0")["new"]["runs"], json!(new), "{list:#}");

    // Aborted through b: everything runs 1.0.0 again, anywhere, at once.
    // An instance c makes before it hears of the abort has the new arm,
    // which only b runs, and b ended the rollout: the arm of an ended
    // rollout is not acted on (nor brought back by a read of the store
    // begun before the end and written after it).
    assert!(b.cli(&["rollout", "abort", "ver", "--reason", "enough"]).status.success());
    for i in run_all(&c_agent, 20).await {
        assert_eq!(ran(&i).0, "1.0.0", "after the abort: {i:?}\n{}", c_agent.log());
    }

    // c's bad 3.0.0 for every new instance: its failures abort it by itself,
    // once, and later instances run elsewhere.
    let out = a.cli(&[
        "rollout",
        "start",
        "ver",
        "3.0.0",
        "--share",
        "100",
        "--min-runs",
        "4",
        "--abort-margin",
        "20",
        "--reason",
        "3.0.0 on c",
    ]);
    assert!(out.status.success(), "{out:?}");
    let bad = run_all(&a, 4).await;
    for i in &bad {
        assert_eq!((ran(i), claimer(&schema, &i.id)), (("3.0.0".to_string(), Some(true)), "c".to_string()), "{i:?}");
    }
    aborted_alert(&mut raised, "3.0.0").await;
    let (_, list) = b.cli_json(&["rollout"]);
    let aborted = rollout_of(&list, "3.0.0");
    assert!(aborted["end_reason"].as_str().unwrap().contains("automatic abort"), "{aborted:#}");
    let alerts = schema.sql("SELECT COUNT(*) FROM alerts WHERE kind = 'rollout_aborted' AND message LIKE '%3.0.0%'");
    assert_eq!(alerts[0][0].as_deref(), Some("1"), "one agent ended it and alerted");
    settled(&a, |i| i.state == TaskState::Success).await;
    for i in run_all(&a, 6).await {
        assert_eq!(i.state, TaskState::Success, "after the automatic abort: {i:?}");
        assert_ne!(ran(&i).0, "3.0.0");
    }
}
