//! A store written by the release before fan-out and the archive's end
//! (b09a9c2, schema 19) opens under this agent, migrates in place, and
//! every instance — its steps, its history rows, an archived instance's
//! document — reads back as that release showed it.
//!
//! The fixture (tests/fixtures/store-b09a9c2/) was written by that
//! release's binaries running the bundled tasks: two instances archived
//! under `retention: 1s`, then a report, a sync that retried twice, a
//! provisioning rolled back and one that succeeded; `instances.json` is
//! `apollo --json show` of each, from that release.

use apollo_tests::*;
use serde_json::Value;

/// Whether everything `old` says, `new` says too (new fields may be added).
fn subset(old: &Value, new: &Value, path: &str) -> Result<(), String> {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            o.iter().try_for_each(|(k, v)| subset(v, n.get(k).unwrap_or(&Value::Null), &format!("{path}.{k}")))
        }
        (Value::Array(o), Value::Array(n)) if o.len() == n.len() => {
            o.iter().zip(n).enumerate().try_for_each(|(i, (o, n))| subset(o, n, &format!("{path}[{i}]")))
        }
        _ if old == new => Ok(()),
        _ => Err(format!("{path}: was {old}, now {new}")),
    }
}

#[test]
fn a_store_written_by_the_previous_release_migrates_with_every_instance_step_and_row_equal() {
    let fixture = repo().join("tests/fixtures/store-b09a9c2");
    let builder = Agent::builder()
        .config("scheduler:\n  retention: 3650d\n")
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n");
    std::fs::create_dir_all(builder.path().join("data")).unwrap();
    std::fs::copy(fixture.join("apollo.db"), builder.path().join("data/apollo.db")).unwrap();
    let mut agent = builder.start_stopped();
    // The history's move to rows kept by instance (schema 23) is cut off
    // after its first batch of 5 rows; the next start goes on from there.
    let env = [("FAILPOINTS", "schema.history_batch=return(5);schema.after_history_batch=return")];
    let status = agent.run_until_exit(&env, std::time::Duration::from_secs(30));
    assert!(!status.success(), "the migration was cut off: {}", agent.log());
    assert!(agent.log().contains("crashing at fail point schema.after_history_batch"), "{}", agent.log());
    // So is the history's move to fewer bytes (schema 26), on the next start.
    let env = [("FAILPOINTS", "schema.compact_batch=return(5);schema.after_compact_batch=return")];
    let status = agent.run_until_exit(&env, std::time::Duration::from_secs(30));
    assert!(!status.success(), "the second migration was cut off: {}", agent.log());
    assert!(agent.log().contains("crashing at fail point schema.after_compact_batch"), "{}", agent.log());
    agent.spawn();
    let old: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("instances.json")).unwrap()).unwrap();
    assert!(old.len() >= 6, "the fixture holds {} instances", old.len());
    for before in &old {
        let id = before["id"].as_str().unwrap();
        let (code, now) = agent.cli_json(&["show", id]);
        assert_eq!(code, 0, "{id}: {now:#}\n{}", agent.log());
        if let Err(e) = subset(before, &now, id) {
            panic!("{e}\nbefore: {before:#}\nnow: {now:#}");
        }
    }
    let (_, hot) = agent.cli_json(&["ls", "--limit", "100"]);
    let (_, archived) = agent.cli_json(&["ls", "--archived", "--limit", "100"]);
    let listed = hot.as_array().unwrap().len() + archived.as_array().unwrap().len();
    assert_eq!(listed, old.len(), "every instance listed, hot or archived");
    assert_eq!(archived.as_array().unwrap().len(), 2, "{archived:#}");
    // The counts per state (schema 27 keeps only the ended states' by
    // trigger) are those of the instances listed.
    let counted = |hot: &Value| {
        let (_, st) = agent.cli_json(&["status"]);
        for state in ["PENDING", "RUNNING", "SUCCESS", "FAILED", "RETRYING", "ROLLED_BACK"] {
            let listed = hot.as_array().unwrap().iter().filter(|i| i["state"] == state).count() as u64;
            assert_eq!(st["counts"][state].as_u64(), Some(listed), "{state}: {st:#}");
        }
    };
    counted(&hot);
    // And the migrated store goes on working.
    let (code, inst) = agent.cli_json(&["run", "ok", "--wait"]);
    assert_eq!(code, 0, "{inst:#}");
    counted(&agent.cli_json(&["ls", "--limit", "100"]).1);
}
