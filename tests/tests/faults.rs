//! The fault scenarios that broke a promise, each reproduced end to end
//! against the real agent: stuck instances, two copies of a step, a failure
//! recorded in two commits, starvation, oversized answers and output,
//! validate's retry rule, blocking downloads, secrets in shell steps, and
//! wrong requests.

use apollo_shared::protocol::code;
use apollo_shared::state::{StepState, TaskState};
use apollo_tests::chaos;
use apollo_tests::*;
use apollo_tui::client::ClientError;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const FAST: &str = "scheduler:\n  backoff_base: 100ms\n  kill_grace: 300ms\n";

fn rpc_error(e: ClientError) -> apollo_shared::protocol::RpcError {
    match e {
        ClientError::Rpc(e) => e,
        other => panic!("expected an error answer, got {other}"),
    }
}

#[tokio::test]
async fn a_partly_rolled_back_instance_is_not_retried_into_a_stuck_run_and_can_be_rolled_back_again() {
    // Step b's rollback fails once (a marker file makes the second try pass).
    let agent = Agent::builder()
        .config(FAST)
        .task(
            "partial.yaml",
            r#"task: partial
max_active: 1
steps:
  - name: a
    plugin: shell
    params:
      command: "true"
      rollback_command: echo "rollback a" >> ../../witness
  - name: b
    plugin: shell
    params:
      command: "true"
      rollback_command: test -e ../../second || { touch ../../second; exit 4; }; echo "rollback b" >> ../../witness
  - name: c
    plugin: shell
    retry: 0
    params:
      command: exit 3
"#,
        )
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let id = trigger(&c, "partial", json!({})).await;
    let inst = wait_until(&c, &mut events, &id, "the failed rollback", ended).await;
    assert_eq!(inst.state, TaskState::Failed, "{inst:#?}");
    let steps = inst.steps.unwrap();
    assert_eq!(steps[2].state, StepState::RolledBack, "c was rolled back before b's rollback failed");
    // A retry would have to run c again, which the step table forbids: refused, with the reason.
    let e = rpc_error(operate(&c, OperatorAction::Retry, &id).await.unwrap_err());
    assert!(e.message.contains("cannot be retried") && e.message.contains("ROLLED_BACK"), "{}", e.message);
    let after = get(&c, &id).await;
    assert_eq!(after.state, TaskState::Failed, "a refused retry changes nothing");
    // A second rollback finishes the job; the task's max_active is free again.
    operate(&c, OperatorAction::Rollback, &id).await.unwrap();
    let done = wait_until(&c, &mut events, &id, "the rollback", ended).await;
    assert_eq!(done.state, TaskState::RolledBack, "{done:#?}");
    let w = std::fs::read_to_string(agent.path().join("data/witness")).unwrap();
    assert_eq!(w.lines().collect::<Vec<_>>(), ["rollback b", "rollback a"]);
    chaos::check_history(&get(&c, &id).await);
}

#[tokio::test]
async fn after_a_kill_9_the_old_copy_of_a_running_step_is_stopped_before_it_runs_again() {
    let mut agent = Agent::builder()
        .config(FAST)
        .task(
            "long.yaml",
            "task: long\nsteps:\n  - plugin: shell\n    timeout: 60\n    params:\n      command: echo \"begin $APOLLO_ATTEMPT\" >> ../../witness; sleep 30; echo \"end $APOLLO_ATTEMPT\" >> ../../witness\n",
        )
        .start();
    let id = {
        let c = agent.client().await;
        c.subscribe(&[Topic::Tasks]).await.unwrap();
        let mut events = c.take_events().unwrap();
        let id = trigger(&c, "long", json!({})).await;
        wait_until(&c, &mut events, &id, "the step to run", |i| {
            i.steps.as_ref().unwrap()[0].state == StepState::Running
        })
        .await;
        id
    };
    // The step's processes are up (its first line is written) before the kill.
    let witness = agent.path().join("data/witness");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&witness).unwrap_or_default().contains("begin 1") {
        assert!(Instant::now() < deadline, "the step never began");
        std::thread::sleep(Duration::from_millis(10));
    }
    agent.kill9();
    agent.spawn();
    // Recovery is done before the agent answers: attempt 2 runs, and nothing
    // of attempt 1 (the shell nor its sleep) is alive beside it.
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    wait_until(&c, &mut events, &id, "attempt 2 to run", |i| {
        let s = &i.steps.as_ref().unwrap()[0];
        s.attempts == 2 && s.state == StepState::Running
    })
    .await;
    let old: Vec<String> = chaos::leftover_processes(std::slice::from_ref(&id))
        .into_iter()
        .filter(|p| {
            let pid: i32 = p.split_whitespace().nth(1).unwrap().parse().unwrap();
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            String::from_utf8_lossy(&env).split('\0').any(|kv| kv == "APOLLO_ATTEMPT=1")
        })
        .collect();
    assert!(old.is_empty(), "processes of the killed agent's step still run beside the new copy: {old:?}");
    let alerts = alerts_text(&c).await;
    assert!(alerts.to_string().contains("leftover_processes"), "the stop is reported: {alerts:#}");
    operate(&c, OperatorAction::Cancel, &id).await.unwrap();
}

#[tokio::test]
async fn a_crash_right_after_a_permanent_failure_is_recorded_does_not_run_the_step_again() {
    // A permanent error (exit 1 from an external plugin): never retried.
    let mut agent = Agent::builder()
        .config(FAST)
        .plugin(
            "perm.sh",
            "#!/bin/sh\ncase \"$1\" in\n  describe) echo '{\"version\": \"1.0.0\"}' ;;\n  validate) echo '{\"ok\": true}' ;;\n  execute) echo ran >> \"$APOLLO_WORK_DIR/../../witness\"; echo '{\"error\": \"no such account\"}'; exit 1 ;;\n  *) echo '{}' ;;\nesac\n",
        )
        .task("fails.yaml", "task: fails\non_failure: stop\nsteps:\n  - plugin: perm\n    retry: 3\n")
        .start();
    agent.kill9();
    agent.spawn_with(&[("FAILPOINTS", "executor.after_failure_commit=return")]);
    let id = {
        let c = agent.client().await;
        trigger(&c, "fails", json!({})).await
    };
    let status = agent.wait_exit(Duration::from_secs(30));
    assert!(!status.success(), "the agent crashed at the fail point: {status}");
    agent.spawn();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    // The step's failure and the instance's FAILED were one commit: the
    // restarted agent finds it FAILED and does not run the step again.
    let inst = wait_until(&c, &mut events, &id, "the end", ended).await;
    assert_eq!(inst.state, TaskState::Failed);
    assert!(inst.error.as_deref().unwrap().contains("permanent error, not retried"), "{:?}", inst.error);
    let runs = std::fs::read_to_string(agent.path().join("data/witness")).unwrap().lines().count();
    assert_eq!(runs, 1, "a permanent error ran again after the crash");
    chaos::check_history(&inst);
}

#[tokio::test]
async fn a_queued_task_is_not_starved_behind_a_backlog_held_by_max_active() {
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 8\n")
        .task("a.yaml", "task: a\nmax_active: 1\nsteps:\n  - plugin: sleep\n    params:\n      seconds: 0.2\n")
        .task("b.yaml", "task: b\nsteps:\n  - plugin: sleep\n    params:\n      seconds: 0\n")
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mut a_ids = Vec::new();
    for _ in 0..300 {
        a_ids.push(trigger(&c, "a", json!({})).await);
    }
    let b = trigger(&c, "b", json!({})).await;
    wait_until(&c, &mut events, &b, "b to finish", |i| i.state == TaskState::Success).await;
    let st: apollo_shared::protocol::AgentStatus = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
    let a_done = st.counts["SUCCESS"].as_u64().unwrap() - 1;
    // A runs one at a time, 0.2 s each: B started while A's backlog was nearly whole.
    assert!(a_done < 25, "b waited for {a_done} of a's instances to finish");
    assert_eq!(a_ids.len(), 300);
}

#[tokio::test]
async fn large_answers_are_summaries_or_a_clear_error_never_a_dropped_connection() {
    // 16 steps of a 58 KB result each: the context stays under its 1 MiB
    // limit, but the instance with its steps is about 2 MB.
    let mut y = String::from("task: big\nsteps:\n");
    for i in 0..16 {
        y.push_str(&format!(
            "  - name: s{i}\n    plugin: shell\n    params:\n      command: |\n        printf '{{\"x\": \"%s\"}}\\n' \"$(head -c 58000 /dev/zero | tr '\\0' a)\"\n"
        ));
    }
    let agent = Agent::builder().task("big.yaml", &y).start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let id = trigger(&c, "big", json!({})).await;
        // Waited for by its events: the whole instance is too large to get.
        let ev = wait_event(&mut events, "the instance to end", |ev| {
            let data = ev.data.json();
            let state = data["state"].as_str().unwrap_or_default();
            ev.data.json()["id"] == json!(id)
                && ev.data.json().get("step").is_none()
                && !matches!(state, "PENDING" | "RUNNING")
        })
        .await;
        assert_eq!(ev.data.json()["state"], "SUCCESS", "{ev:?}");
        ids.push(id);
    }
    // Lists carry summaries: `apollo ls` works and carries no context.
    let (code, list) = agent.cli_json(&["ls"]);
    assert_eq!(code, 0, "{list:#}");
    assert!(list.as_array().unwrap().iter().all(|i| i["context"].is_null()));
    // The whole instance is over the frame limit: a clear error on a live connection.
    let e = rpc_error(try_get(&c, &ids[0]).await.unwrap_err());
    assert_eq!(e.code, code::TOO_LARGE);
    assert!(e.message.contains("frame limit"), "{}", e.message);
    let out = agent.cli(&["show", &ids[0]]);
    assert_eq!(out.status.code(), Some(1), "an error answer, not 'no agent reachable'");
    assert!(String::from_utf8_lossy(&out.stderr).contains("frame limit"));
    // An error never echoes an unbounded piece of the request.
    let huge = "x".repeat(900_000);
    let e = rpc_error(try_get(&c, &huge).await.unwrap_err());
    assert!(e.message.len() < 2048, "the error is {} bytes", e.message.len());
    c.request::<m::AgentStatus>(NoParams {}).await.expect("the connection carries on");
}

#[test]
fn a_json_result_too_large_to_keep_fails_the_step_and_a_large_one_that_fits_is_kept() {
    let agent = Agent::builder()
        .task(
            "fits.yaml",
            "task: fits\nsteps:\n  - plugin: shell\n    params:\n      command: |\n        printf '{\"x\": \"%s\"}\\n' \"$(head -c 20000 /dev/zero | tr '\\0' a)\"\n",
        )
        .task(
            "huge.yaml",
            "task: huge\nsteps:\n  - plugin: shell\n    params:\n      command: |\n        printf '{\"x\": \"%s\"}\\n' \"$(head -c 1100000 /dev/zero | tr '\\0' a)\"\n",
        )
        .start();
    let (code, inst) = agent.cli_json(&["run", "fits", "--wait"]);
    assert_eq!(code, 0, "{inst:#}");
    assert_eq!(
        inst["steps"][0]["output"]["result"]["x"].as_str().unwrap().len(),
        20000,
        "a 20 KB last line is the result"
    );
    let (code, inst) = agent.cli_json(&["run", "huge", "--wait"]);
    assert_ne!(code, 0);
    let err = inst["error"].as_str().unwrap();
    assert!(err.contains("over the 1048576 byte limit") && err.contains("write large data to a file"), "{err}");
    assert!(err.contains("permanent"), "too large is not retried: {err}");
}

#[tokio::test]
async fn a_validate_that_asks_for_a_retry_is_retried_like_an_execute() {
    // validate exits 75 (retryable) on its first call, then accepts.
    let agent = Agent::builder()
        .config(FAST)
        .plugin(
            "flaky.sh",
            r#"#!/bin/sh
case "$1" in
  describe) echo '{"version": "1.0.0"}' ;;
  validate) m="$(dirname "$0")/validated"; if [ -e "$m" ]; then echo '{"ok": true}'; else touch "$m"; echo busy >&2; exit 75; fi ;;
  execute) echo '{"done": true}' ;;
  rollback) echo '{}' ;;
esac
"#,
        )
        .task("v.yaml", "task: v\nsteps:\n  - plugin: flaky\n    retry: 3\n    params:\n      x: \"{{ params.x }}\"\n")
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let id = trigger(&c, "v", json!({"x": 1})).await;
    let inst = wait_until(&c, &mut events, &id, "the end", ended).await;
    assert_eq!(inst.state, TaskState::Success, "{:?}", inst.error);
    let s = &inst.steps.unwrap()[0];
    assert_eq!((s.attempts, s.failures), (2, 1), "{s:#?}");
}

#[tokio::test]
async fn a_large_download_stops_at_its_timeout_and_the_agent_keeps_answering() {
    let agent = Agent::builder()
        .task(
            "dl.yaml",
            "task: dl\non_failure: stop\nsteps:\n  - plugin: file_downloader\n    timeout: 1\n    retry: 0\n    params:\n      source: file://big.bin\n      target: big.copy\n",
        )
        .start();
    // Sparse: 2 GiB that take no disk, but every byte is read, copied and hashed.
    let big = std::fs::File::create(agent.path().join("big.bin")).unwrap();
    big.set_len(2 << 30).unwrap();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let started = Instant::now();
    let id = trigger(&c, "dl", json!({})).await;
    wait_until(&c, &mut events, &id, "the download to start", |i| {
        i.steps.as_ref().unwrap()[0].state == StepState::Running
    })
    .await;
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let t = Instant::now();
        c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
        slowest = slowest.max(t.elapsed());
    }
    let inst = wait_until(&c, &mut events, &id, "the end", ended).await;
    assert_eq!(inst.state, TaskState::Failed);
    assert!(inst.error.as_deref().unwrap().contains("timed out"), "{:?}", inst.error);
    assert!(started.elapsed() < Duration::from_secs(15), "the timeout was honoured: {:?}", started.elapsed());
    assert!(slowest < Duration::from_secs(1), "agent.status took {slowest:?} during the download");
}

#[test]
fn shell_steps_get_a_clean_environment_with_the_steps_own_variables() {
    let mut agent = Agent::builder()
        .task(
            "env.yaml",
            r#"task: env
steps:
  - plugin: shell
    env:
      REGION: "{{ params.region }}"
    params:
      command: |
        printf '{"secret": "%s", "region": "%s", "path": "%s"}\n' "${APOLLO_TEST_SECRET:-absent}" "$REGION" "${PATH:+set}"
"#,
        )
        .start();
    agent.kill9();
    agent.spawn_with(&[("APOLLO_TEST_SECRET", "hunter2")]);
    let (code, inst) = agent.cli_json(&["run", "env", "-p", "region=eu", "--wait"]);
    assert_eq!(code, 0, "{inst:#}");
    let r = &inst["steps"][0]["output"]["result"];
    assert_eq!(r["secret"], "absent", "the agent's environment leaked into a shell step: {r}");
    assert_eq!(r["region"], "eu", "the step's env: is passed: {r}");
    assert_eq!(r["path"], "set", "the allowlist (PATH) is kept: {r}");
}

#[tokio::test]
async fn wrong_requests_get_an_error_that_says_what_was_wrong() {
    let agent = Agent::builder()
        .task("bom.yaml", "\u{feff}task: bom\nsteps:\n  - plugin: sleep\n")
        .task("argv.yaml", "task: argv\nsteps:\n  - plugin: shell\n    params:\n      command: []\n")
        .start();
    let c = agent.client().await;
    let cases = [
        ("tasks.list", json!({"limit": 0}), "limit 0 is out of range"),
        ("tasks.list", json!({"limit": 5000}), "limit 5000 is out of range"),
        ("tasks.list", json!({"cursor": "not-an-id"}), "is not an instance id"),
        ("events.publish", json!({"name": "e", "data": [1, 2]}), "data must be a JSON object"),
        ("hello", json!({"client": 42}), "client name"),
    ];
    for (method, params, want) in cases {
        // Wrong on purpose: what a typed client cannot send.
        let e = rpc_error(c.call_raw(method, params.clone()).await.unwrap_err());
        assert_eq!(e.code, code::INVALID_PARAMS, "{method} {params}: {}", e.message);
        assert!(e.message.contains(want), "{method} {params}: {}", e.message);
    }
    // A definition saved with a byte-order mark loads.
    let defs = c.request::<m::DefsList>(NoParams {}).await.unwrap();
    assert!(defs.iter().any(|d| d.task == "bom" && d.errors.is_empty()), "{defs:#?}");
    // What `apollo-agent check` refuses, the agent refuses at load (it used to
    // load it and fail at run time).
    let argv = defs.iter().find(|d| d.file.ends_with("argv.yaml")).unwrap();
    assert!(argv.errors.join("\n").contains("line 3: steps[0].params: command"), "{argv:#?}");
    get(&c, &trigger(&c, "bom", json!({})).await).await;
}

#[tokio::test]
async fn a_repeated_event_creates_nothing_even_for_a_definition_added_since() {
    let agent = Agent::builder().task("a.yaml", "task: a\non_event: order.placed\nsteps:\n  - plugin: sleep\n").start();
    let c = agent.client().await;
    let first = publish(&c, "order.placed", Value::Null, Some("order-7")).await.unwrap();
    assert_eq!(first.instances.len(), 1, "{first:#?}");
    // A second listener appears (hot reload), then the same event is delivered again.
    c.subscribe(&[Topic::Defs]).await.unwrap();
    let mut events = c.take_events().unwrap();
    std::fs::write(agent.path().join("tasks/b.yaml"), "task: b\non_event: order.placed\nsteps:\n  - plugin: sleep\n")
        .unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.pid()), nix::sys::signal::Signal::SIGHUP).unwrap();
    wait_event(&mut events, "the reload", |e| e.kind() == EventKind::DefsReloaded).await;
    let again = publish(&c, "order.placed", Value::Null, Some("order-7")).await.unwrap();
    assert!(again.duplicate, "{again:#?}");
    assert_eq!(again.event_id, first.event_id, "the original event is named");
    let page = c.request::<m::TasksList>(ListParams { task: Some("b".into()), ..Default::default() }).await.unwrap();
    assert!(page.items.is_empty(), "the repeat created an instance of b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_events_arrive_in_sequence_order_under_concurrent_commits() {
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 8\n")
        .task("noop.yaml", "task: noop\nsteps:\n  - plugin: sleep\n  - plugin: sleep\n")
        .start();
    let watcher = agent.client().await;
    watcher.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = watcher.take_events().unwrap();
    let mut callers = Vec::new();
    for _ in 0..8 {
        let c = agent.client().await;
        callers.push(tokio::spawn(async move {
            for _ in 0..50 {
                trigger(&c, "noop", json!({})).await;
            }
        }));
    }
    for c in callers {
        c.await.unwrap();
    }
    // 400 instances, each created, claimed, 2 × 2 step moves, finished.
    let (mut last, mut seen, mut finished) = (0u64, 0usize, 0usize);
    while finished < 400 {
        let ev = tokio::time::timeout(Duration::from_secs(60), events.recv()).await.unwrap().unwrap();
        assert_ne!(ev.kind(), EventKind::Resync, "this subscriber reads as fast as it can");
        assert!(ev.seq > last, "event {} arrived after {last}", ev.seq);
        last = ev.seq;
        seen += 1;
        if ev.data.json().get("step").is_none() && ev.data.json()["state"] == "SUCCESS" {
            finished += 1;
        }
    }
    assert!(seen >= 400 * 7, "{seen} events");
}
