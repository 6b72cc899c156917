//! The console in a real terminal against a real agent: run a task and watch
//! it succeed, filter to a failed instance and retry it, read-only mode, the
//! SSH transport through dial-stdio, and a reconnect after the agent restarts.

use apollo_tests::console::Console;
use apollo_tests::*;

const GATE: &str = "task: gate\non_failure: stop\nsteps:\n  - name: check_gate\n    plugin: shell\n    retry: 0\n    params:\n      command: test -f ../../gate-open\n";

fn failed_gate(agent: &Agent) -> String {
    let (code, inst) = agent.cli_json(&["run", "gate", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    inst["id"].as_str().unwrap().to_string()
}

#[test]
fn run_daily_report_and_watch_it_then_retry_a_failed_instance() {
    let agent = Agent::builder().bundled_tasks().task("gate.yaml", GATE).start();
    let failed = failed_gate(&agent);
    let sock = agent.socket.display().to_string();
    let mut c = Console::start(agent.path(), &["--socket", &sock], None);
    c.wait_for(&["connected", "gate", "FAILED"]);
    c.keys(":defs\r");
    c.wait_for(&["<defs>", "daily_report", "download → parse → report"]);
    c.keys("r");
    c.wait_for(&["run daily_report", "file://tasks/data/report.csv"]);
    c.keys("\r");
    let screen = c.wait_for(&["<timeline>", "daily_report", "SUCCESS", "all steps succeeded"]);
    for step in ["0 download", "1 parse", "2 report"] {
        assert!(screen.contains(step), "{step}:\n{screen}");
    }
    // The report step's context: open it, the output pane has the report path.
    c.keys("jj\r");
    c.wait_for(&["<step>", "step 2 report", "report_generator@1.0.0"]);
    c.keys("\t\t\t");
    c.wait_for(&["daily_report.html"]);
    // A dry-run shows the plan and executes nothing.
    c.keys("d");
    c.wait_for(&["dry-run", "nothing was executed", "ok    0 download"]);
    // Enter closes it (an Esc followed at once by more keys would read as Alt-key).
    c.keys("\r");
    // Filter the tasks to the failed one and retry it after opening the gate.
    c.keys(":tasks\r/state:failed\r");
    c.wait_for(&["filter: state:failed", "tasks (1)", &failed]);
    std::fs::write(agent.path().join("data/gate-open"), "").unwrap();
    c.keys("t");
    // The agent answers with the state after the change (RETRYING, or already RUNNING).
    c.wait_for(&[&format!("retry {failed}: now ")]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let inst = rt.block_on(async {
        let cl = agent.client().await;
        cl.subscribe(&[Topic::Tasks]).await.unwrap();
        let mut ev = cl.take_events().unwrap();
        wait_until(&cl, &mut ev, &failed, "the retry to finish", ended).await
    });
    assert_eq!(inst.state, apollo_shared::TaskState::Success);
    assert_eq!(c.quit(), 0);
}

#[test]
fn readonly_refuses_a_retry() {
    let agent = Agent::builder().task("gate.yaml", GATE).start();
    let failed = failed_gate(&agent);
    let sock = agent.socket.display().to_string();
    let mut c = Console::start(agent.path(), &["--socket", &sock, "--readonly"], None);
    c.wait_for(&["[read-only]", &failed]);
    c.keys("t");
    c.wait_for(&["read-only: actions that change state are disabled"]);
    let (_, inst) = agent.cli_json(&["show", &failed]);
    assert_eq!(inst["state"], "FAILED");
    assert_eq!(inst["transitions"].as_array().unwrap().last().unwrap()["to"], "FAILED");
}

#[test]
fn the_console_and_the_cli_work_over_ssh_through_dial_stdio() {
    let agent = Agent::builder().task("gate.yaml", GATE).start();
    let failed = failed_gate(&agent);
    // An `ssh` stand-in that runs the remote command here.
    let fake = tempfile::tempdir().unwrap();
    let ssh = fake.path().join("ssh");
    std::fs::write(&ssh, "#!/bin/sh\nwhile [ $# -gt 0 ]; do case \"$1\" in -T) shift;; -o|-p) shift 2;; *) break;; esac; done\nshift\nexec \"$@\"\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = agent.socket.display().to_string();
    let c = Console::start(agent.path(), &["--ssh", "ops@db-7:2222", "--socket", &sock], Some(fake.path()));
    c.wait_for(&["via ssh ops@db-7:2222", "connected", &failed]);
    assert_eq!(c.quit(), 0);
    let path = format!("{}:{}:{}", fake.path().display(), bin_dir().display(), std::env::var("PATH").unwrap());
    let out = std::process::Command::new(cli_bin())
        .args(["--ssh", "ops@db-7", "--socket", &sock, "--json", "ls"])
        .env("PATH", path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&failed));
}

#[test]
fn the_console_shows_a_lost_agent_and_reconnects_to_the_restarted_one() {
    let mut agent = Agent::builder().task("gate.yaml", GATE).start();
    let first = failed_gate(&agent);
    let sock = agent.socket.display().to_string();
    let c = Console::start(agent.path(), &["--socket", &sock], None);
    c.wait_for(&["connected", &first]);
    agent.kill9();
    c.wait_for(&["disconnected"]);
    agent.spawn();
    let second = failed_gate(&agent);
    c.wait_for(&["● connected", &first, &second]);
    assert_eq!(c.quit(), 0);
}

#[test]
fn the_tasks_view_toggles_to_the_archive() {
    let agent = Agent::builder()
        .config("scheduler:\n  retention: 1s\n  lease: 3s\n")
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")
        .start();
    let (code, inst) = agent.cli_json(&["run", "ok", "--wait"]);
    assert_eq!(code, 0, "{inst}");
    let old = inst["id"].as_str().unwrap().to_string();
    // Wait (woken by the agent's event) for it to move to the archive.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let c = agent.client().await;
        c.subscribe(&[Topic::Tasks]).await.unwrap();
        let mut events = c.take_events().unwrap();
        if agent.cli_json(&["ls", "--archived"]).1.as_array().is_none_or(|a| a.is_empty()) {
            wait_event(&mut events, "the instance to be archived", |e| e.kind() == EventKind::InstanceArchived).await;
        }
    });
    let sock = agent.socket.display().to_string();
    let mut c = Console::start(agent.path(), &["--socket", &sock], None);
    c.wait_for(&["connected", "no instances"]);
    c.keys("a");
    c.wait_for(&["archived tasks (1)", &old, "SUCCESS"]);
    c.keys("\r");
    c.wait_for(&["<timeline>", &old, "all steps succeeded"]);
    c.keys("\x1b");
    c.wait_for(&["<tasks>", "archived tasks (1)"]);
    c.keys("a");
    c.wait_for(&[" tasks (0)", "no instances"]);
    assert_eq!(c.quit(), 0);
}

#[test]
fn the_plugins_view_shows_runs_failures_durations_and_the_suggested_timeout() {
    let agent = Agent::builder().task("gate.yaml", GATE).start();
    failed_gate(&agent);
    let sock = agent.socket.display().to_string();
    let mut c = Console::start(agent.path(), &["--socket", &sock], None);
    c.wait_for(&["connected"]);
    c.keys(":plugins\r");
    // The shell row's last cell: the row is drawn whole.
    let screen = c.wait_for(&["<plugins>", "SUGGESTED", "RUNS", "FAIL%", "P99", "ok_codes, rollback_command"]);
    let shell: Vec<&str> = screen
        .lines()
        .find(|l| l.contains("│shell "))
        .unwrap_or_default()
        .trim_matches('│')
        .split_whitespace()
        .collect();
    // NAME VERSION TIMEOUT SUGGESTED RUNS FAIL% P50 P99 …: the gate's one run, failed.
    assert_eq!(shell.get(4..6), Some(&["1", "100"][..]), "{screen}");
    assert_eq!(shell.get(3), Some(&"1s"), "p99 + 50 %, at least 1 s: {screen}");
    assert_eq!(c.quit(), 0);
}

/// The console's figures are the store's, for as long as it stays open:
/// its header's hour and its queues view equal `agent.stats` after
/// instances succeed, fail, roll back and are retried, every queue is
/// listed, and a rolled-back instance counts among the failures.
#[test]
fn the_figures_on_screen_stay_equal_to_a_fresh_read() {
    let agent = Agent::builder()
        .task("ok.yaml", "task: ok\nqueue: ops\nsteps:\n  - plugin: shell\n    params: {command: 'true'}\n")
        .task(
            "bad.yaml",
            "task: bad\non_failure: stop\nsteps:\n  - plugin: shell\n    retry: 0\n    params: {command: 'false'}\n",
        )
        .task(
            "undo.yaml",
            "task: undo\nqueue: ops\nsteps:\n  - plugin: shell\n    retry: 0\n    params: {command: 'false'}\n",
        )
        .start();
    let sock = agent.socket.display().to_string();
    let mut c = Console::start_sized(agent.path(), &["--socket", &sock], None, &[], (40, 120));
    c.wait_for(&["connected", "0 ended in 1h"]);
    let run = |task: &str| agent.cli(&["run", task, "--wait"]);
    for task in ["ok", "ok", "ok", "bad", "bad", "undo", "undo"] {
        run(task);
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fresh = || {
        rt.block_on(async {
            let cl = agent.client().await;
            cl.request::<m::AgentStats>(StatsParams { minutes: Some(60) }).await.unwrap()
        })
    };
    let st = fresh();
    assert_eq!(st.ended.iter().sum::<u64>(), 7, "{st:?}");
    c.wait_for(&["7 ended in 1h"]);
    c.keys(":queues\r");
    let row = |screen: &str, q: &str| {
        let q = format!("{q} ");
        screen.lines().find(|l| l.trim_start_matches(['│', ' ']).starts_with(&q)).unwrap_or_default().to_string()
    };
    let screen = c.wait_until("ops 5 (2 failed) and default 2 (2 failed)", |s| {
        row(s, "ops").contains("5 (2 failed)") && row(s, "default").contains("2 (2 failed)")
    });
    assert!(screen.contains("7 ended in 1h"), "{screen}");
    // A FAILED instance retried that fails again is still one instance that
    // ended: a fresh read says 8 after one more, and so does the screen.
    let (_, failed) = agent.cli_json(&["ls", "--task", "bad", "--limit", "1"]);
    let id = failed[0]["id"].as_str().unwrap().to_string();
    let out = agent.cli(&["retry", &id, "--wait"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    run("ok");
    let st = fresh();
    assert_eq!(st.ended.iter().sum::<u64>(), 8, "{st:?}");
    c.wait_until("ops 6 (2 failed), default 2 (2 failed), 8 ended in 1h", |s| {
        row(s, "ops").contains("6 (2 failed)")
            && row(s, "default").contains("2 (2 failed)")
            && s.contains("8 ended in 1h")
    });
    // `apollo plugins` counts every attempt: 4 succeeded, 5 failed.
    let (_, plugins) = agent.cli_json(&["plugins"]);
    let shell = plugins.as_array().unwrap().iter().find(|p| p["name"] == "shell").unwrap();
    assert_eq!(shell["stats"]["runs"], 9, "{shell:#}");
    assert!((shell["stats"]["failure_rate"].as_f64().unwrap() - 5.0 / 9.0).abs() < 1e-9, "{shell:#}");
    assert_eq!(c.quit(), 0);
}

#[test]
fn t_shows_the_selected_instances_timeline_and_writes_it_as_markdown() {
    let agent = Agent::builder().task("gate.yaml", GATE).start();
    let failed = failed_gate(&agent);
    let file = std::env::temp_dir().join(format!("apollo-timeline-{failed}.md"));
    let _ = std::fs::remove_file(&file);
    let sock = agent.socket.display().to_string();
    let mut c = Console::start(agent.path(), &["--socket", &sock], None);
    c.wait_for(&[&failed]);
    c.keys("T");
    c.wait_for(&["timeline written to", "PENDING -> RUNNING", "-> FAILED"]);
    let md = std::fs::read_to_string(&file).unwrap();
    assert!(md.contains("## Timeline") && md.contains(&format!("gate {failed} FAILED")), "{md}");
    std::fs::remove_file(&file).unwrap();
    c.keys("x"); // any other key closes the overlay
    c.wait_for(&["tasks (1)"]);
    assert_eq!(c.quit(), 0);
}
