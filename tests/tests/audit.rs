//! Every operator action is recorded with who did it, how, and why: `apollo
//! audit` lists runs, cancels, retries and rollbacks with the user (and the
//! SSH client's address when the call came through `dial-stdio`), and a
//! rollback is recorded as the operator's, not the agent's.

use apollo_tests::*;
use serde_json::Value;

#[test]
fn operator_actions_are_audited_with_who_how_and_why() {
    let agent = Agent::builder()
        .config("scheduler:\n  backoff_base: 100ms\n")
        .task("gate.yaml", "task: gate\non_failure: stop\nsteps:\n  - plugin: shell\n    retry: 0\n    params:\n      command: test -e ../../open\n")
        .start();
    let (code, inst) = agent.cli_json(&["run", "gate", "--wait"]);
    assert_eq!(code, 1, "{inst:#}");
    let id = inst["id"].as_str().unwrap().to_string();
    let (code, _) = agent.cli_json(&["rollback", &id, "--reason", "undo the half-done gate"]);
    assert_eq!(code, 0);
    // Through the SSH stand-in, as from another host.
    let fake = tempfile::tempdir().unwrap();
    let ssh = fake.path().join("ssh");
    std::fs::write(&ssh, "#!/bin/sh\nwhile [ $# -gt 0 ]; do case \"$1\" in -T) shift;; -o|-p) shift 2;; *) break;; esac; done\nshift\nexec \"$@\"\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}:{}", fake.path().display(), bin_dir().display(), std::env::var("PATH").unwrap());
    let out = std::process::Command::new(cli_bin())
        .args(["--ssh", "ops@db-7", "--socket"])
        .arg(&agent.socket)
        .args(["run", "gate", "--reason", "second try"])
        .env("PATH", &path)
        .env("SSH_CLIENT", "10.1.2.3 50022 22")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, audit) = agent.cli_json(&["audit"]);
    assert_eq!(code, 0, "{audit:#}");
    let rows = audit.as_array().unwrap();
    let find = |pred: &dyn Fn(&Value) -> bool| rows.iter().find(|r| pred(r)).cloned();
    let rollback = find(&|r| r["reason"].as_str().unwrap_or_default().contains("rollback requested"))
        .unwrap_or_else(|| panic!("{audit:#}"));
    assert!(rollback["actor"].as_str().unwrap().contains("(uid 0)"), "the operator, not the agent: {rollback:#}");
    assert!(rollback["reason"].as_str().unwrap().contains("undo the half-done gate"), "{rollback:#}");
    assert_eq!(rollback["task"], "gate");
    let remote = find(&|r| r["actor"].as_str().unwrap_or_default().contains("via ssh from 10.1.2.3"))
        .unwrap_or_else(|| panic!("the SSH client's address is recorded: {audit:#}"));
    assert!(remote["reason"].as_str().unwrap().contains("second try"), "the run's reason: {remote:#}");
    assert!(rows.iter().all(|r| !r["actor"].as_str().unwrap().starts_with("agent:")), "{audit:#}");
}

/// Every operator action is a history row whose actor is the operator:
/// cancelling a running instance (its step stopped by the agent on the
/// operator's behalf) and a queued one, retries one at a time and in a
/// batch; each with its reason, said once.
#[test]
fn every_operator_action_is_the_operators_row_with_its_reason() {
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 1\n  kill_grace: 200ms\n")
        .task(
            "hold.yaml",
            "task: hold\non_failure: stop\nsteps:\n  - plugin: shell\n    retry: 0\n    params:\n      command: sleep 60\n",
        )
        .start();
    let id =
        |out: std::process::Output| String::from_utf8_lossy(&out.stdout).split_whitespace().nth(2).unwrap().to_string();
    let running = id(agent.cli(&["run", "hold"]));
    let queued = id(agent.cli(&["run", "hold", "--reason", "queued behind"]));
    // The first runs (concurrency 1): wait for its step to start.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = agent.client().await;
        c.subscribe(&[Topic::Tasks]).await.unwrap();
        let mut ev = c.take_events().unwrap();
        wait_until(&c, &mut ev, &running, "the step to run", |i| {
            i.steps.as_ref().is_some_and(|s| s[0].state == apollo_shared::state::StepState::Running)
        })
        .await;
    });
    assert_eq!(agent.cli(&["cancel", &running, "--reason", "wrong host"]).status.code(), Some(0));
    assert_eq!(agent.cli(&["cancel", &queued, "--reason", "not needed"]).status.code(), Some(0));
    assert_eq!(agent.cli(&["retry", &running, "--reason", "host fixed"]).status.code(), Some(0));
    assert_eq!(agent.cli(&["cancel", &running, "--reason", "again"]).status.code(), Some(0));
    let batch = agent.cli(&["retry", "--task", "hold", "--state", "failed", "--yes", "--reason", "all of them"]);
    assert_eq!(batch.status.code(), Some(0), "{}", String::from_utf8_lossy(&batch.stderr));
    let (_, audit) = agent.cli_json(&["audit"]);
    let rows = audit.as_array().unwrap();
    let of = |id: &str, to: &str, why: &str| {
        rows.iter()
            .find(|r| r["instance"] == id && r["to"] == to && r["reason"].as_str().unwrap_or_default().contains(why))
            .unwrap_or_else(|| panic!("no {to} row of {id} saying {why:?}: {audit:#}"))
            .clone()
    };
    for row in [
        of(&running, "FAILED", "cancelled: wrong host"),
        of(&queued, "FAILED", "cancelled: not needed"),
        of(&running, "RETRYING", "retry requested: host fixed"),
        of(&running, "FAILED", "cancelled: again"),
        of(&running, "RETRYING", "retry requested: all of them"),
        of(&queued, "RETRYING", "retry requested: all of them"),
        of(&queued, "PENDING", "created by manual (queued behind)"),
    ] {
        assert!(row["actor"].as_str().unwrap().ends_with("(uid 0)"), "the operator's row: {row:#}");
        assert!(!row["reason"].as_str().unwrap().contains("(uid 0)"), "who is said once, as the actor: {row:#}");
    }
    // The cancelled step's own row is the operator's too.
    let (_, shown) = agent.cli_json(&["show", &running]);
    let step_row = shown["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["step"] == 0 && t["to"] == "FAILED")
        .cloned()
        .unwrap_or_else(|| panic!("{shown:#}"));
    assert!(step_row["actor"].as_str().unwrap().ends_with("(uid 0)"), "{step_row:#}");
    let human = String::from_utf8_lossy(&agent.cli(&["show", &queued]).stdout).to_string();
    assert!(human.contains("created by manual (queued behind)  (root (uid 0))"), "{human}");
}

/// `apollo timeline`: an instance that fails, is retried by an operator with
/// a reason and succeeds, in all three formats; once archived, the same
/// timeline from the archive.
#[tokio::test]
async fn a_timeline_lists_each_attempt_and_the_operators_retry_in_order_in_every_format() {
    let agent = Agent::builder()
        .config("scheduler:\n  retention: 3s\n")
        .task(
            "flaky.yaml",
            "task: flaky\non_failure: stop\nsteps:\n  - name: check\n    plugin: shell\n    retry: 0\n    params:\n      command: test -e ok || { echo 'no ok file' >&2; exit 3; }\n",
        )
        .start();
    let c = agent.client().await;
    c.subscribe(&[apollo_shared::protocol::Topic::Tasks]).await.unwrap();
    let mut pushed = c.take_events().unwrap();
    let (code, inst) = agent.cli_json(&["run", "flaky", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    let id = inst["id"].as_str().unwrap().to_string();
    let work = agent.path().join("data/work").join(&id);
    std::fs::write(work.join("ok"), "").unwrap();
    let (code, _) = agent.cli_json(&["retry", &id, "--wait", "--reason", "created the ok file"]);
    assert_eq!(code, 0);

    let (code, t) = agent.cli_json(&["timeline", &id]);
    assert_eq!(code, 0, "{t:#}");
    let events = t["events"].as_array().unwrap();
    let find = |pred: &dyn Fn(&Value) -> bool, what: &str| {
        events.iter().position(pred).unwrap_or_else(|| panic!("no {what}: {t:#}"))
    };
    let failed = find(&|e| e["kind"] == "step" && e["to"] == "FAILED", "step failure");
    let retry = find(&|e| e["kind"] == "instance" && e["to"] == "RETRYING" && e["operator"] == true, "operator retry");
    let ok = find(&|e| e["kind"] == "step" && e["to"] == "SUCCESS", "step success");
    assert!(failed < retry && retry < ok, "in order: {t:#}");
    let f = &events[failed];
    assert_eq!((f["step"].as_str(), f["from"].as_str()), (Some("check"), Some("RUNNING")), "{f:#}");
    assert!(f["error"].as_str().unwrap().contains("exit code 3"), "{f:#}");
    assert!(f["duration_secs"].as_f64().is_some(), "{f:#}");
    let r = &events[retry];
    assert!(r["reason"].as_str().unwrap().contains("created the ok file"), "{r:#}");
    assert!(r["actor"].as_str().unwrap().ends_with("(uid 0)"), "{r:#}");
    let offsets: Vec<f64> = events.iter().map(|e| e["offset_secs"].as_f64().unwrap()).collect();
    assert!(offsets[0] == 0.0 && offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    assert_eq!(t["instances"][0]["state"], "SUCCESS");

    let human = String::from_utf8_lossy(&agent.cli(&["timeline", &id]).stdout).to_string();
    let lines: Vec<&str> = human.lines().collect();
    let at =
        |needle: &str| lines.iter().position(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle}: {human}"));
    assert!(
        at("check: RUNNING -> FAILED") < at("created the ok file")
            && at("created the ok file") < at("check: RUNNING -> SUCCESS")
    );
    assert!(lines[0].starts_with("+00:00:00  "), "{human}");

    let md = String::from_utf8_lossy(&agent.cli(&["timeline", &id, "--md"]).stdout).to_string();
    for section in [
        "## Timeline",
        "- **Started:** flaky (manual by root",
        "- **Lasted:**",
        "- **Outcome:** flaky",
        "SUCCESS",
        "- **Who acted:** ",
        "| + | UTC | instance | what | detail |",
    ] {
        assert!(md.contains(section), "{section}: {md}");
    }
    assert!(md.contains("created the ok file") && md.contains("check: RUNNING -> FAILED"), "{md}");

    // Unknown ids are named; once archived, the timeline reads the archive.
    let out = agent.cli(&["timeline", "01ZZZZZZZZZZZZZZZZZZZZZZZZ"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no instance 01ZZZZZZZZZZZZZZZZZZZZZZZZ (not among"));
    let typo = format!("{}X", &id[..25]);
    let out = agent.cli(&["timeline", &typo]);
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(said.contains(&format!("no instance {typo} (did you mean {id}?)")), "{said}");
    wait_event(&mut pushed, "the instance archived", |e| {
        e.kind() == apollo_shared::protocol::EventKind::InstanceArchived
    })
    .await;
    let (code, archived) = agent.cli_json(&["timeline", &id]);
    assert_eq!((code, archived["events"].as_array().map(Vec::len)), (0, Some(events.len())), "{archived:#}");
}

/// A sub-runbook's child joins its parent's trace: one trace id gives both
/// instances' timeline; a window says what it read, and an empty one is
/// no error.
#[test]
fn a_timeline_by_trace_id_joins_a_parent_and_its_child_and_an_empty_window_says_so() {
    let agent = Agent::builder()
        .task("child.yaml", "task: child\nsteps:\n  - name: work\n    plugin: sleep\n")
        .task("parent.yaml", "task: parent\nsteps:\n  - name: call\n    task: child\n")
        .task("other.yaml", "task: other\nsteps:\n  - plugin: sleep\n")
        .start();
    let (code, parent) = agent.cli_json(&["run", "parent", "--wait"]);
    assert_eq!(code, 0, "{parent:#}");
    assert_eq!(agent.cli_json(&["run", "other", "--wait"]).0, 0);
    let trace = parent["trace_id"].as_str().unwrap();
    let (code, t) = agent.cli_json(&["timeline", "--trace", trace]);
    assert_eq!(code, 0, "{t:#}");
    let mut tasks: Vec<&str> = t["instances"].as_array().unwrap().iter().map(|i| i["task"].as_str().unwrap()).collect();
    tasks.sort();
    assert_eq!(tasks, ["child", "parent"], "{t:#}");
    assert_eq!(t["read"], serde_json::json!(["hot", "archive"]));
    let child = t["instances"].as_array().unwrap().iter().find(|i| i["task"] == "child").unwrap()["id"].clone();
    let steps: Vec<(&str, &str)> = t["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "step" && e["to"] == "SUCCESS")
        .map(|e| (e["step"].as_str().unwrap(), e["instance"].as_str().unwrap()))
        .collect();
    assert_eq!(steps.len(), 2, "{t:#}");
    assert_eq!(steps[0], ("work", child.as_str().unwrap()), "the child's step ends before its parent's: {t:#}");
    assert_eq!(steps[1].0, "call");

    let (_, by_task) = agent.cli_json(&["timeline", "--since", "1h", "--task", "other"]);
    assert_eq!(by_task["instances"].as_array().map(Vec::len), Some(1), "{by_task:#}");
    let empty = agent.cli(&["timeline", "--since", "1h", "--queue", "nothing-here"]);
    assert_eq!(empty.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&empty.stdout).contains("no instance in the window (read: hot, archive)"));
}
