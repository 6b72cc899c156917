//! The single-machine path end to end: definition → instance → steps →
//! SUCCESS, dry-run, illegal transitions, context limits.

use apollo_tests::*;
use serde_json::json;

#[test]
fn daily_report_succeeds_and_the_report_holds_figures_from_the_csv() {
    let agent = Agent::builder().bundled_tasks().start();
    let (code, inst) = agent.cli_json(&["run", "daily_report", "--wait"]);
    assert_eq!(code, 0, "{inst:#}\n{}", agent.log());
    assert_eq!(inst["state"], "SUCCESS");
    for field in [
        "id",
        "task",
        "state",
        "attempt",
        "trace_id",
        "priority",
        "queue",
        "created_at",
        "finished_at",
        "error",
        "context",
    ] {
        assert!(inst.get(field).is_some(), "--json output lacks {field}");
    }
    let steps = inst["steps"].as_array().unwrap();
    let names: Vec<_> = steps.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["download", "parse", "report"]);
    for s in steps {
        for field in [
            "seq",
            "name",
            "plugin",
            "plugin_version",
            "state",
            "attempts",
            "output",
            "error",
            "started_at",
            "finished_at",
        ] {
            assert!(s.get(field).is_some(), "step lacks {field}");
        }
        assert_eq!(s["state"], "SUCCESS");
        assert_eq!(s["plugin_version"], "1.0.0");
    }
    // The parse summary is in the context; the report is a file it points to.
    assert_eq!(inst["context"]["steps"]["parse"]["rows"], 12);
    let report = steps[2]["output"]["path"].as_str().unwrap();
    let html = std::fs::read_to_string(report).unwrap();
    assert!(html.contains(r#"<strong id="rows">12</strong>"#), "{html}");
    assert!(html.contains(r#"<td id="sum-revenue">25100.5</td>"#), "{html}");
    assert!(html.contains(r#"<td id="sum-units">925.0</td>"#), "{html}");
    assert!(html.contains("us-east"));
}

#[test]
fn dry_run_executes_nothing_and_reports_each_step() {
    let agent = Agent::builder()
        .task(
            "witness.yaml",
            // The bad values come from params: a literal bad value is refused at load.
            "task: witness\nparams:\n  file: {required: true}\n  secs: {default: -1}\nsteps:\n  - name: touch\n    plugin: shell\n    params:\n      command: touch {{ params.file }}\n  - name: bad\n    plugin: sleep\n    params:\n      seconds: \"{{ params.secs }}\"\n",
        )
        .task(
            "original.yaml",
            "task: daily_report\npriority: high\nparams:\n  source: {default: \"s3://bucket/report.csv\"}\nsteps:\n  - plugin: file_downloader\n    params:\n      source: \"{{ params.source }}\"\n  - plugin: data_parser\n    params:\n      format: csv\n      delimiter: \",\"\n",
        )
        .start();
    let witness = agent.path().join("witness-file");
    let (code, r) = agent.cli_json(&["dry-run", "witness", "-p", &format!("file={}", witness.display())]);
    assert_eq!(code, 1, "an invalid step makes the dry-run exit 1: {r:#}");
    assert!(!witness.exists(), "dry-run executed a step");
    assert_eq!(r["steps"][0]["valid"], true);
    assert_eq!(r["steps"][0]["params"]["command"], format!("touch {}", witness.display()));
    assert_eq!(r["steps"][0]["describe"]["name"], "shell");
    assert_eq!(r["steps"][1]["valid"], false);
    assert!(r["steps"][1]["error"].as_str().unwrap().contains("seconds: expected a number from 0"), "{r:#}");

    // The original design's example validates (s3:// is a source) without fetching anything.
    let (code, r) = agent.cli_json(&["dry-run", "daily_report"]);
    assert_eq!(code, 0, "{r:#}");
    assert_eq!((r["steps"][0]["valid"].as_bool(), r["steps"][1]["valid"].as_bool()), (Some(true), Some(true)));
    let (code, r) = agent.cli_json(&["dry-run", "daily_report", "-p", "source=ftp://host/report.csv"]);
    assert_eq!(code, 1);
    let err = r["steps"][0]["error"].as_str().unwrap();
    assert!(err.contains("unsupported scheme \"ftp\""), "{err}");
    // Nothing was created either.
    let (_, list) = agent.cli_json(&["ls"]);
    assert_eq!(list, json!([]));
}

#[tokio::test]
async fn an_illegal_transition_is_refused_and_leaves_the_instance_as_it_was() {
    let agent = Agent::builder().task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n").start();
    let (c, mut events) = agent.watch().await;
    let id = trigger(&c, "ok", json!({})).await;
    let before = wait_until(&c, &mut events, &id, "SUCCESS", |i| i.state == apollo_shared::TaskState::Success).await;
    let err = operate(&c, OperatorAction::Retry, &id).await.unwrap_err();
    let apollo_tui::client::ClientError::Rpc(e) = err else { panic!("expected an RPC error, got {err}") };
    assert_eq!(e.code, apollo_shared::protocol::code::ILLEGAL_TRANSITION);
    assert!(e.message.contains("illegal transition SUCCESS -> RETRYING"), "{}", e.message);
    let after = get(&c, &id).await;
    assert_eq!(after.state, before.state);
    assert_eq!(after.transitions.as_ref().unwrap().len(), before.transitions.as_ref().unwrap().len());
    // The refusal is raised as an alert.
    let alerts = alerts_text(&c).await;
    assert!(alerts.contains(r#""kind":"illegal_transition""#), "{alerts}");
    // And through the CLI: exit 1 with the agent's words.
    let out = agent.cli(&["retry", &id]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("illegal transition SUCCESS -> RETRYING"));
}

#[test]
fn an_output_over_the_context_limit_fails_the_step_with_advice() {
    let agent = Agent::builder()
        .config("scheduler:\n  step_output_bytes: 1024\n")
        .task(
            "big.yaml",
            r#"task: big
on_failure: stop
steps:
  - plugin: shell
    retry: 0
    params:
      command: |
        printf '{"blob": "%s"}\n' "$(head -c 3000 /dev/zero | tr '\0' x)"
"#,
        )
        .start();
    let (code, inst) = agent.cli_json(&["run", "big", "--wait"]);
    assert_eq!(code, 1);
    assert_eq!(inst["state"], "FAILED");
    let err = inst["steps"][0]["error"].as_str().unwrap();
    assert!(
        err.contains("over the 1024 byte limit") && err.contains("store it in a file and return its path"),
        "{err}"
    );
}

/// On an agent with a free slot, a trigger's one write records the instance,
/// its claim and its first step's start: the step is RUNNING when the
/// trigger answers. Triggers racing the scheduler's own claims for the slots
/// never run more than `scheduler.concurrency` instances at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_takes_a_free_slot_at_once_and_never_more_than_the_concurrency() {
    const LONG: &str = "task: long\nsteps:\n  - {name: wait, plugin: sleep, params: {seconds: 60}}\n";
    const SHORT: &str = "task: short\nsteps:\n  - {plugin: sleep, params: {seconds: 0.005}}\n  - {plugin: sleep, params: {seconds: 0.005}}\n";
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 3\n")
        .task("long.yaml", LONG)
        .task("short.yaml", SHORT)
        .start();
    let c = agent.client().await;
    let id = trigger(&c, "long", json!({})).await;
    let i = get(&c, &id).await;
    assert_eq!(i.state, apollo_shared::TaskState::Running, "{i:?}");
    let first = &i.steps.as_ref().unwrap()[0];
    assert_eq!((first.state, first.attempts), (apollo_shared::state::StepState::Running, 1), "{i:?}");
    let moves: Vec<(Option<u32>, &str, &str)> =
        i.transitions.as_ref().unwrap().iter().map(|t| (t.step, t.to.as_str(), t.reason.as_str())).collect();
    assert_eq!(moves[1..], [(None, "RUNNING", "claimed"), (Some(0), "RUNNING", "attempt 1")], "{moves:?}");

    // 160 short instances from 8 connections at once, while the slots free
    // and fill: the long one holds a slot throughout.
    let clients: Vec<_> = futures::future::join_all((0..8).map(|_| agent.client())).await;
    let ids: Vec<String> = futures::future::join_all(clients.iter().map(|c| async move {
        let mut ids = Vec::new();
        for _ in 0..20 {
            ids.push(trigger(c, "short", json!({})).await);
        }
        ids
    }))
    .await
    .concat();
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mut spans = Vec::new();
    for id in &ids {
        let i = wait_until(&c, &mut events, id, "SUCCESS", ended).await;
        assert_eq!(i.state, apollo_shared::TaskState::Success, "{i:?}");
        spans.push((i.started_at.unwrap(), i.finished_at.unwrap()));
    }
    // The most instances under way at one moment, the long one included.
    let mut edges: Vec<(chrono::DateTime<chrono::Utc>, i32)> =
        spans.iter().flat_map(|(s, f)| [(*s, 1), (*f, -1)]).collect();
    edges.sort();
    let (mut now, mut most) = (1, 1);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    assert!(most <= 3, "{most} instances ran at once with scheduler.concurrency 3");
    assert_eq!(get(&c, &id).await.state, apollo_shared::TaskState::Running, "the long one still runs");
}

/// Work a limit holds back starts as soon as the instance ahead of it ends:
/// the end wakes the scheduler (its periodic look, a third of the 60 s
/// lease, would come far too late for this test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_held_back_by_a_limit_starts_when_the_one_ahead_ends() {
    const ONE: &str = "task: one\nmax_active: 1\nsteps:\n  - {plugin: sleep, params: {seconds: 0.05}}\n";
    let agent = Agent::builder().config("scheduler:\n  lease: 60s\n").task("one.yaml", ONE).start();
    let (c, mut events) = agent.watch().await;
    let began = std::time::Instant::now();
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(trigger(&c, "one", json!({})).await);
    }
    for id in &ids {
        let i = wait_until(&c, &mut events, id, "SUCCESS", ended).await;
        assert_eq!(i.state, apollo_shared::TaskState::Success, "{i:?}");
    }
    let took = began.elapsed();
    assert!(took < std::time::Duration::from_secs(10), "five 50 ms instances, one at a time, took {took:?}");
}

/// The original design's §4.4: without `scheduler.concurrency`, twice the
/// cores the agent may run on (its CPU affinity here; a cgroup quota counts
/// the same way), shown by `apollo status`; a configured value is taken as
/// it is.
#[test]
fn the_default_concurrency_is_twice_the_cores_the_agent_may_use() {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    // The agent inherits this thread's affinity: one core.
    let before = sched_getaffinity(Pid::from_raw(0)).unwrap();
    let mut one = CpuSet::new();
    let first = (0..CpuSet::count()).find(|&c| before.is_set(c).unwrap_or(false)).expect("a usable core");
    one.set(first).unwrap();
    sched_setaffinity(Pid::from_raw(0), &one).unwrap();
    let agent = Agent::builder().start();
    sched_setaffinity(Pid::from_raw(0), &before).unwrap();
    let (code, status) = agent.cli_json(&["status"]);
    assert_eq!(code, 0, "{status:#}");
    assert_eq!((status["concurrency"].as_u64(), status["cores"].as_u64()), (Some(2), Some(1)), "{status:#}");
    let human = String::from_utf8_lossy(&agent.cli(&["status"]).stdout).to_string();
    assert!(human.contains("concurrency 2 (2 × 1 core)"), "{human}");

    let set = Agent::builder().config("scheduler:\n  concurrency: 3\n").start();
    let (_, status) = set.cli_json(&["status"]);
    assert_eq!((status["concurrency"].as_u64(), status["cores"].as_u64()), (Some(3), None), "{status:#}");
    let human = String::from_utf8_lossy(&set.cli(&["status"]).stdout).to_string();
    assert!(human.contains("concurrency 3\n"), "{human}");
}

/// A trigger that comes while the loop's own claim holds every free slot
/// (it found nothing, and releases them a commit later) waits for that
/// slot instead of leaving its instance to the loop's next turn.
#[tokio::test]
async fn a_trigger_during_the_loops_own_claim_takes_the_slot_it_releases() {
    const LONG: &str = "task: long\nsteps:\n  - {name: wait, plugin: sleep, params: {seconds: 60}}\n";
    let mut agent = Agent::builder().config("scheduler:\n  concurrency: 2\n").task("long.yaml", LONG).start();
    agent.stop();
    // Every claim of the loop holds its slots 0.5 s: the trigger lands inside one.
    agent.spawn_with(&[("FAILPOINTS", "slots.loop_claim=return(500)")]);
    let c = agent.client().await;
    let id = trigger(&c, "long", json!({})).await;
    let i = get(&c, &id).await;
    assert_eq!(i.state, apollo_shared::TaskState::Running, "{i:?}");
    let moves: Vec<&str> = i.transitions.as_ref().unwrap().iter().map(|t| t.reason.as_str()).collect();
    assert_eq!(moves, ["created by manual", "claimed", "attempt 1"], "claimed in the trigger's write");
}
