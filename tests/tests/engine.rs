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
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
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
    let out = agent.cli(&["rollback", &id]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("illegal transition SUCCESS -> ROLLED_BACK"));
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
