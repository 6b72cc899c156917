//! What scripts get: with `--json`, an error is one JSON object on stdout
//! with the exit code a person gets; `apollo defs` fails when a definition
//! did not load; `apollo-agent check` takes files as well as directories;
//! an unreachable agent is explained (no socket, permission denied with the
//! directory and its group, a socket nobody answers).

use apollo_tests::*;
use serde_json::Value;
use std::os::unix::process::CommandExt;
use std::process::Command;

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON object ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn errors_are_json_objects_with_the_same_exit_codes() {
    let agent = Agent::builder().task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n").start();
    // The agent's refusal: its JSON-RPC code and words, exit 1.
    let out = agent.cli(&["--json", "run", "nosuch"]);
    assert_eq!(out.status.code(), Some(1));
    let e = &json_of(&out)["error"];
    assert_eq!(
        (e["kind"].as_str(), e["code"].as_i64(), e["exit"].as_u64()),
        (Some("agent"), Some(-32004), Some(1)),
        "{e:#}"
    );
    assert!(e["message"].as_str().unwrap().contains("no task \"nosuch\" is defined (defined: ok)"), "{e:#}");
    assert_eq!(e["command"][0], "--socket", "the command as given: {e:#}");
    // A usage error, exit 2.
    let out = agent.cli(&["--json", "run", "ok", "-p", "no-equals-sign"]);
    assert_eq!(out.status.code(), Some(2));
    let e = &json_of(&out)["error"];
    assert_eq!(e["kind"], "usage");
    assert!(e["message"].as_str().unwrap().contains("expected KEY=VALUE"), "{e:#}");
    // No agent, exit 2.
    let out = Command::new(cli_bin()).args(["--json", "--socket", "/nonexistent/agent.sock", "ls"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = &json_of(&out)["error"];
    assert_eq!(e["kind"], "unreachable");
    assert!(
        e["message"].as_str().unwrap().contains("no agent is listening (no socket at /nonexistent/agent.sock)"),
        "{e:#}"
    );
    // Without --json the same words go to stderr.
    let out = agent.cli(&["run", "nosuch"]);
    assert!(out.stdout.is_empty() && String::from_utf8_lossy(&out.stderr).contains("no task \"nosuch\""));
}

#[test]
fn defs_fails_when_a_definition_did_not_load_and_check_takes_files() {
    let agent = Agent::builder()
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")
        .task("bad.yaml", "task: bad\nsteps:\n  - plugin: nosuch\n")
        .start();
    let out = agent.cli(&["defs"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    let (code, defs) = agent.cli_json(&["defs"]);
    assert_eq!(code, 1);
    assert!(defs.as_array().unwrap().iter().any(|d| d["task"] == "ok"), "{defs:#}");
    let check = |args: &[&str]| {
        let out = Command::new(agent_bin()).current_dir(agent.path()).arg("check").args(args).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string())
    };
    let (code, text) = check(&["tasks/ok.yaml"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("tasks: tasks/ok.yaml — 1 definition(s) valid, 0 problem(s)"), "{text}");
    let (code, text) = check(&["tasks/bad.yaml", "tasks/ok.yaml"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("tasks/bad.yaml: line 3: steps[0].plugin"), "{text}");
    let (code, text) = check(&["tasks"]);
    assert_eq!(code, Some(1), "{text}");
    let (code, text) = check(&["tasks/nothing.yaml"]);
    assert_eq!(code, Some(1));
    assert!(text.contains("tasks/nothing.yaml: no such file or directory"), "{text}");
}

#[test]
fn an_unreachable_agent_is_explained_not_called_absent() {
    let agent = Agent::builder().task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n").start();
    use std::os::unix::fs::PermissionsExt;
    let as_nobody = || {
        let out = Command::new(cli_bin())
            .args(["--socket"])
            .arg(&agent.socket)
            .arg("status")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    // The socket is root's and its group's (0660): nobody may not use it.
    std::fs::set_permissions(agent.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, err) = as_nobody();
    assert_eq!(code, Some(2), "{err}");
    let sock = agent.socket.display().to_string();
    assert!(err.contains(&format!("nobody may not use the socket {sock} (mode 0660, group root)")), "{err}");
    assert!(err.contains("sudo usermod -aG root nobody`, then log in again"), "{err}");
    // A directory on the way that nobody may not enter is named instead.
    std::fs::set_permissions(agent.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let (_, err) = as_nobody();
    let dir = agent.path().display().to_string();
    assert!(err.contains(&format!("nobody may not use the directory {dir} (mode 0700, group root)")), "{err}");
    // A socket nobody answers.
    let stale = agent.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let out = Command::new(cli_bin()).args(["--socket"]).arg(&stale).arg("status").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("the socket is there but no agent answers (connection refused)"), "{err}");
    // None at all.
    let out = Command::new(cli_bin()).args(["--socket", "/nonexistent/agent.sock", "status"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("no agent is listening (no socket at /nonexistent/agent.sock)"), "{err}");
}
