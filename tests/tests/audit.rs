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
