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
