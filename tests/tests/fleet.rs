//! Looking after several agents: contexts (read-only, production), and
//! actions on many instances with a preview first.

use apollo_tests::*;
use serde_json::Value;
use std::process::{Command, Output, Stdio};

/// Fails until `data/ok` exists; each run leaves a line in `data/runs`.
const FLAKY: &str = r#"task: flaky
on_failure: stop
steps:
  - plugin: shell
    retry: 0
    params:
      command: echo run >> ../../runs; test -e ../../ok
"#;
const FINE: &str = "task: fine\nsteps:\n  - plugin: sleep\n";

fn runs(agent: &Agent) -> usize {
    std::fs::read_to_string(agent.path().join("data/runs")).unwrap_or_default().lines().count()
}

/// Runs `task` to its end; returns the instance id.
fn run_to_end(agent: &Agent, task: &str) -> String {
    let (_, v) = agent.cli_json(&["run", task, "--wait"]);
    v["id"].as_str().unwrap().to_string()
}

fn state(agent: &Agent, id: &str) -> String {
    agent.cli_json(&["show", id]).1["state"].as_str().unwrap().to_string()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn a_batch_retry_shows_its_plan_then_acts_only_on_what_the_table_allows() {
    let agent = Agent::builder().task("flaky.yaml", FLAKY).task("fine.yaml", FINE).start();
    let failed: Vec<String> = (0..3).map(|_| run_to_end(&agent, "flaky")).collect();
    let ok = run_to_end(&agent, "fine");
    assert!(failed.iter().all(|id| state(&agent, id) == "FAILED"));
    assert_eq!(runs(&agent), 3);

    // The preview: three retries and one refusal with the table's reason; nothing changes.
    let (code, plan) = agent.cli_json(&["retry", "--since", "1h", "--dry-run"]);
    assert_eq!(code, 0, "{plan:#}");
    let plan = plan.as_array().unwrap();
    assert_eq!(plan.len(), 4, "{plan:#?}");
    let retried: Vec<&str> =
        plan.iter().filter(|p| p["action"] == "retry").map(|p| p["id"].as_str().unwrap()).collect();
    assert_eq!(retried.len(), 3);
    assert!(failed.iter().all(|id| retried.contains(&id.as_str())));
    let refused = plan.iter().find(|p| p["id"] == ok.as_str()).unwrap();
    assert!(refused["refused"].as_str().unwrap().contains("illegal transition SUCCESS -> RETRYING"), "{refused:#}");
    let human = agent.cli(&["retry", "--since", "1h", "--dry-run"]);
    assert!(text(&human).contains("3 to retry, 1 refused by the transition table"), "{}", text(&human));
    assert!(failed.iter().all(|id| state(&agent, id) == "FAILED"), "a dry run changes nothing");

    // Without a terminal and without --yes, nothing is sent.
    let unconfirmed = agent.cli(&["retry", "--since", "1h"]);
    assert_eq!(unconfirmed.status.code(), Some(2), "{}", text(&unconfirmed));
    assert!(text(&unconfirmed).contains("confirm with --yes"), "{}", text(&unconfirmed));
    assert_eq!(runs(&agent), 3);

    // Confirmed: the three run again (and now pass); the SUCCESS one is untouched.
    std::fs::write(agent.path().join("data/ok"), "").unwrap();
    let done = agent.cli(&["retry", "--since", "1h", "--yes", "--reason", "disk cleaned"]);
    assert_eq!(done.status.code(), Some(0), "{}", text(&done));
    assert_eq!(text(&done).lines().filter(|l| l.starts_with("done ")).count(), 3, "{}", text(&done));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = agent.client().await;
        c.subscribe(&[Topic::Tasks]).await.unwrap();
        let mut ev = c.take_events().unwrap();
        for id in &failed {
            wait_until(&c, &mut ev, id, "the retried instance", |i| i.state.as_str() == "SUCCESS").await;
        }
    });
    assert_eq!(runs(&agent), 6);
    let (_, shown) = agent.cli_json(&["show", &ok]);
    assert_eq!(shown["attempt"], 1, "the SUCCESS instance was not retried: {shown:#}");
    let (_, history) = agent.cli_json(&["show", &failed[0]]);
    let reasons: Vec<&str> =
        history["transitions"].as_array().unwrap().iter().filter_map(|t| t["reason"].as_str()).collect();
    assert!(reasons.iter().any(|r| r.contains("disk cleaned")), "{reasons:?}");
}

/// `apollo --context NAME ARGS` with the contexts file in `config`.
fn with_context(config: &std::path::Path, args: &[&str]) -> Output {
    Command::new(cli_bin())
        .args(args)
        .env("XDG_CONFIG_HOME", config)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn read_only_and_production_contexts_refuse_before_sending() {
    let agent = Agent::builder().task("flaky.yaml", FLAKY).start();
    let id = run_to_end(&agent, "flaky");
    let config = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(config.path().join("apollo")).unwrap();
    let socket = agent.socket.display().to_string();
    std::fs::write(
        config.path().join("apollo/contexts.yaml"),
        format!(
            "contexts:\n  - name: watch\n    socket: {socket}\n    read_only: true\n  \
             - name: prod\n    socket: {socket}\n    production: true\n"
        ),
    )
    .unwrap();
    // Reading works through any context.
    let ls = with_context(config.path(), &["--context", "watch", "ls", "--json"]);
    assert_eq!(ls.status.code(), Some(0), "{}", text(&ls));
    let listed: Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(listed[0]["id"], id.as_str());
    // Read-only: refused before sending.
    let r = with_context(config.path(), &["--context", "watch", "rollback", &id]);
    assert_eq!(r.status.code(), Some(1), "{}", text(&r));
    assert!(text(&r).contains("context \"watch\" is read-only"), "{}", text(&r));
    // Production: a rollback needs a confirmation and a reason.
    let r = with_context(config.path(), &["--context", "prod", "rollback", &id]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r));
    assert!(text(&r).contains("production"), "{}", text(&r));
    let r = with_context(config.path(), &["--context", "prod", "rollback", &id, "--yes"]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r));
    assert!(text(&r).contains("give --reason"), "{}", text(&r));
    assert_eq!(state(&agent, &id), "FAILED", "nothing was sent");
    let r = with_context(config.path(), &["--context", "prod", "rollback", &id, "--yes", "--reason", "bad deploy"]);
    assert_eq!(r.status.code(), Some(0), "{}", text(&r));
    let (_, shown) = agent.cli_json(&["show", &id]);
    let reasons: Vec<&str> =
        shown["transitions"].as_array().unwrap().iter().filter_map(|t| t["reason"].as_str()).collect();
    assert!(reasons.iter().any(|r| r.contains("bad deploy")), "{reasons:?}");
    // An unknown context names the known ones.
    let r = with_context(config.path(), &["--context", "qa", "ls"]);
    assert_eq!(r.status.code(), Some(2));
    assert!(text(&r).contains("known: watch, prod"), "{}", text(&r));
}

#[test]
fn on_a_production_context_the_console_sends_a_rollback_only_with_the_task_name_and_a_reason() {
    let agent = Agent::builder().task("flaky.yaml", FLAKY).start();
    let id = run_to_end(&agent, "flaky");
    let config = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(config.path().join("apollo")).unwrap();
    std::fs::write(
        config.path().join("apollo/contexts.yaml"),
        format!("contexts:\n  - name: prod\n    socket: {}\n    production: true\n", agent.socket.display()),
    )
    .unwrap();
    let xdg = config.path().to_str().unwrap();
    let mut c = apollo_tests::console::Console::start_with_env(
        agent.path(),
        &["--context", "prod"],
        None,
        &[("XDG_CONFIG_HOME", xdg)],
    );
    c.wait_for(&["[prod PRODUCTION]", "connected", "flaky", "FAILED"]);
    c.keys("b");
    c.wait_for(&["PRODUCTION: roll back flaky", "type the task name (flaky) to go on"]);
    // Enter alone, and a wrong name, do nothing.
    c.keys("\r");
    c.wait_for(&["\"\" is not the task name \"flaky\""]);
    c.keys("flak\r");
    c.wait_for(&["\"flak\" is not the task name"]);
    c.keys("y\r");
    c.wait_for(&["reason, recorded with the action"]);
    c.keys("\r");
    c.wait_for(&["a reason is needed on a production context"]);
    assert_eq!(state(&agent, &id), "FAILED", "nothing was sent yet");
    c.keys("bad deploy\r");
    c.wait_for(&["roll back requested for"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = agent.client().await;
        client.subscribe(&[Topic::Tasks]).await.unwrap();
        let mut ev = client.take_events().unwrap();
        wait_until(&client, &mut ev, &id, "the rollback", |i| i.state.as_str() == "ROLLED_BACK").await;
    });
    let (_, shown) = agent.cli_json(&["show", &id]);
    let reasons: Vec<&str> =
        shown["transitions"].as_array().unwrap().iter().filter_map(|t| t["reason"].as_str()).collect();
    assert!(reasons.iter().any(|r| r.contains("bad deploy")), "{reasons:?}");
    assert_eq!(c.quit(), 0);
}

#[test]
fn throughput_is_right_from_the_first_frame_after_work_done_before_attaching() {
    let agent = Agent::builder().task("fine.yaml", FINE).task("flaky.yaml", FLAKY).start();
    for _ in 0..3 {
        run_to_end(&agent, "fine");
    }
    run_to_end(&agent, "flaky");
    let sock = agent.socket.display().to_string();
    let mut c = apollo_tests::console::Console::start(agent.path(), &["--socket", &sock], None);
    c.wait_for(&["connected", "4 ended in 1h"]);
    c.keys(":queues\r");
    c.wait_for(&["ENDED IN 1H", "4 (1 failed)"]);
    assert_eq!(c.quit(), 0);
}

#[test]
fn the_console_switches_contexts_and_the_fleet_view_marks_a_dead_agent_while_the_other_updates() {
    let a = Agent::builder().task("fine.yaml", FINE).start();
    let mut b = Agent::builder().task("fine.yaml", FINE).start();
    run_to_end(&a, "fine");
    for _ in 0..2 {
        run_to_end(&b, "fine");
    }
    let config = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(config.path().join("apollo")).unwrap();
    std::fs::write(
        config.path().join("apollo/contexts.yaml"),
        format!(
            "contexts:\n  - name: alpha\n    socket: {}\n  - name: bravo\n    socket: {}\n    production: true\n",
            a.socket.display(),
            b.socket.display()
        ),
    )
    .unwrap();
    let xdg = config.path().to_str().unwrap();
    let mut c = apollo_tests::console::Console::start_with_env(
        a.path(),
        &["--context", "alpha"],
        None,
        &[("XDG_CONFIG_HOME", xdg)],
    );
    c.wait_for(&["[alpha]", "connected", "SUCCESS 1"]);
    // :ctx with completion attaches to the other agent.
    c.keys(":ctx br\t\r");
    c.wait_for(&["[bravo PRODUCTION]", "SUCCESS 2"]);
    c.keys(":ctx alp\r");
    c.wait_for(&["[alpha]", "SUCCESS 1"]);
    // The fleet: both side by side, live.
    c.keys(":fleet\r");
    c.wait_for(&["<fleet>", "attached", "production"]);
    c.wait_until("both contexts connected", |screen| screen.matches("connected").count() == 3);
    b.kill9();
    c.wait_for(&["unreachable"]);
    run_to_end(&a, "fine");
    // alpha's row goes on: its last count (SUCCESS) becomes 2, bravo stays unreachable.
    c.wait_until("alpha with SUCCESS 2 beside bravo unreachable", |screen| {
        let row = |name: &str| screen.lines().find(|l| l.contains(&format!("│{name}"))).unwrap_or_default().to_string();
        let alpha = row("alpha");
        let counts: Vec<&str> = alpha.split_whitespace().filter(|w| w.chars().all(|c| c.is_ascii_digit())).collect();
        alpha.contains("connected") && counts.last() == Some(&"2") && row("bravo").contains("unreachable")
    });
    assert_eq!(c.quit(), 0);
}

#[test]
fn the_console_previews_a_batch_retry_and_acts_only_on_what_the_table_allows() {
    let agent = Agent::builder().task("flaky.yaml", FLAKY).task("fine.yaml", FINE).start();
    let failed: Vec<String> = (0..3).map(|_| run_to_end(&agent, "flaky")).collect();
    let ok = run_to_end(&agent, "fine");
    let sock = agent.socket.display().to_string();
    let mut c = apollo_tests::console::Console::start(agent.path(), &["--socket", &sock], None);
    c.wait_for(&["connected", "fine", "flaky", "FAILED"]);
    // Mark the four one by one (Space moves on), then ask for a retry.
    c.keys("    ");
    c.wait_for(&["4 marked"]);
    c.keys("t");
    let screen = c.wait_for(&["3 to retry, 1 refused by the transition table", "retry 3 instances?"]);
    assert!(screen.contains("illegal transition SUCCESS -> RETRYING"), "{screen}");
    // Enter does not confirm; nothing was sent.
    c.keys("\r");
    c.wait_for(&["Enter does not confirm"]);
    assert!(failed.iter().all(|id| state(&agent, id) == "FAILED"));
    std::fs::write(agent.path().join("data/ok"), "").unwrap();
    c.keys("y");
    let screen = c.wait_for(&["retry: 3 done, 0 refused by the agent"]);
    for id in &failed {
        assert!(screen.contains(&format!("done    {id}  now ")), "{screen}");
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = agent.client().await;
        client.subscribe(&[Topic::Tasks]).await.unwrap();
        let mut ev = client.take_events().unwrap();
        for id in &failed {
            wait_until(&client, &mut ev, id, "the retried instance", |i| i.state.as_str() == "SUCCESS").await;
        }
    });
    assert_eq!(runs(&agent), 6, "each FAILED instance ran once more");
    assert_eq!(agent.cli_json(&["show", &ok]).1["attempt"], 1, "the SUCCESS one is untouched");
    // Any key closes the results (not Esc: an Esc just before the `q` of
    // quit would read as Alt-q).
    c.keys("x");
    c.wait_until("the results closed", |s| !s.contains("any key closes"));
    assert_eq!(c.quit(), 0);
}

#[test]
fn each_failed_attempt_is_kept_so_two_attempts_can_be_compared() {
    let agent = Agent::builder()
        .task(
            "second.yaml",
            "task: second\nsteps:\n  - plugin: shell\n    retry: 1\n    params:\n      \
             command: echo try {{ attempt }}; test {{ attempt }} -ge 2\n",
        )
        .start();
    let id = run_to_end(&agent, "second");
    let (_, shown) = agent.cli_json(&["show", &id]);
    assert_eq!(shown["state"], "SUCCESS", "{shown:#}");
    let step = &shown["steps"][0];
    assert_eq!(step["attempts"], 2);
    let earlier = step["earlier"].as_array().expect("the failed attempt is kept");
    assert_eq!(earlier.len(), 1, "{step:#}");
    assert_eq!(earlier[0]["attempt"], 1);
    assert!(earlier[0]["params"]["command"].as_str().unwrap().contains("echo try 1"), "{step:#}");
    assert!(earlier[0]["error"].as_str().unwrap().contains("exit"), "{step:#}");
    assert!(step["params"]["command"].as_str().unwrap().contains("echo try 2"), "{step:#}");
}
