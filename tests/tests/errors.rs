//! What an operator reads of a failure carries its cause: a shell step's
//! exit code with the last lines of its stderr, then of its stdout, in the
//! order they were written; an HTTP step's status, content type and the
//! start of the page's text. Every place shows the same text, and history
//! rows stay one line each.

use apollo_tests::*;
use serde_json::Value;
use std::time::Duration;

fn run_wait(agent: &Agent, task: &str) -> Value {
    let out = agent.cli_within(&["run", task, "--wait", "--json"], Duration::from_secs(60));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", agent.log()))
}

fn text(out: std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

const QUOTA: &str = r#"task: quota
on_failure: stop
steps:
  - name: write
    plugin: shell
    retry: 0
    params:
      command: |
        echo line1
        echo line2
        echo "FATAL: disk quota exceeded" >&2
        exit 1
"#;

#[test]
fn a_shell_error_carries_the_exit_code_then_stderr_then_stdout_in_order() {
    let (port, hook) = http_receiver();
    let agent = Agent::builder()
        .config(&format!("alerts:\n  hooks:\n    - webhook: http://127.0.0.1:{port}/hook\n"))
        .task("quota.yaml", QUOTA)
        .start();
    let inst = run_wait(&agent, "quota");
    assert_eq!(inst["state"], "FAILED", "{inst:#}");
    let cause = "command ended with exit code 1 (expected exit code [0]); stderr: FATAL: disk quota exceeded; \
                 stdout: line1 | line2";
    assert_eq!(inst["steps"][0]["error"], cause);
    let error = inst["error"].as_str().unwrap();
    assert!(error.starts_with(&format!("step \"write\" (#0) failed: {cause}")), "{error}");
    // The same text in `show`, the alert and the hook's payload.
    let id = inst["id"].as_str().unwrap();
    let shown = text(agent.cli(&["show", id]));
    assert!(shown.contains(cause), "{shown}");
    let alerts = text(agent.cli(&["alerts"]));
    assert!(alerts.contains(cause), "{alerts}");
    let (_, payload) = hook.recv_timeout(Duration::from_secs(30)).expect("the hook was called");
    assert!(payload["message"].as_str().unwrap_or_default().contains(cause), "{payload:#}");
    // The whole output stays in the step's log.
    let log = text(agent.cli(&["logs", id]));
    assert!(log.contains("line1") && log.contains("line2") && log.contains("FATAL: disk quota exceeded"), "{log}");
}

#[test]
fn an_http_error_page_is_summed_up_and_history_rows_stay_one_line() {
    let page = "<!DOCTYPE html>\n<html>\n<head><title>501 Not Implemented</title>\n<style>body { font: 12px }</style>\n\
                </head>\n<body>\n<h1>Not Implemented</h1>\n<p>The deploy endpoint does not take POST.</p>\n"
        .to_string()
        + &"<p>padding</p>\n".repeat(300) + "</body>\n</html>\n";
    let port = http_responder("501 Not Implemented", "text/html; charset=utf-8", &page);
    let agent = Agent::builder()
        .config("scheduler:\n  backoff_base: 10ms\n  backoff_max: 20ms\n")
        .task(
            "deploy.yaml",
            &format!(
                "task: deploy\non_failure: stop\nsteps:\n  - plugin: http\n    retry: 3\n    params:\n      \
                 url: http://127.0.0.1:{port}/deploy\n      method: POST\n"
            ),
        )
        .start();
    let inst = run_wait(&agent, "deploy");
    assert_eq!(inst["state"], "FAILED", "{inst:#}");
    let error = inst["steps"][0]["error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!(
            "POST http://127.0.0.1:{port}/deploy: HTTP 501 Not Implemented (text/html): 501 Not Implemented \
             Not Implemented The deploy endpoint does not take POST. padding"
        )),
        "{error}"
    );
    assert!(!error.contains('<') && !error.contains('\n') && error.chars().count() < 420, "{error}");
    // Four attempts, each in the history; every row is one line.
    let shown = text(agent.cli(&["show", inst["id"].as_str().unwrap()]));
    let history: Vec<&str> = shown.lines().skip_while(|l| !l.contains("history:")).skip(1).collect();
    assert!(history.len() >= 8, "{shown}");
    for row in &history {
        assert!(row.starts_with("    20"), "a history row that is not one line: {row:?}\n{shown}");
        assert!(row.chars().count() < 420, "{row}");
    }
}
