//! Secrets that never leak: a definition's secrets reach the step's process
//! whole and appear nowhere else — not in the store file, the step's log,
//! the agent's log, `show`, `logs`, the alerts or a hook's payload — where
//! `***` stands in for them; a dry-run shows them masked; a missing secret
//! fails the request, naming it, before anything is created. A value of
//! two lines goes whole and line by line, one across a cut is masked before
//! the cut, one in an approval's message is masked in the request, and one
//! an HTTP client percent-encodes is masked encoded too.

use apollo_tests::*;
use std::path::Path;

const PASSWORD: &str = "s3cr3t-pw-7731";
const TOKEN: &str = "tok-9f2e1c";

fn leak(token_file: &Path) -> String {
    format!(
        r#"task: leak
on_failure: stop
secrets:
  db_password: {{env: APOLLO_E2E_DB_PASSWORD}}
  token: {{file: {}}}
steps:
  - name: use
    plugin: shell
    env: {{PW: "{{{{ secrets.db_password }}}}"}}
    params:
      command: 'echo "pw=$PW token={{{{ secrets.token }}}}"; echo "stderr has $PW" >&2; test "$(printf %s "$PW" | rev)" = {reversed} && echo real-value-seen'
  - name: fail
    plugin: shell
    retry: 0
    params:
      command: 'echo "failing with {{{{ secrets.db_password }}}}" >&2; exit 3'
"#,
        token_file.display(),
        // The definition must not hold the value either: the step checks it reversed.
        reversed = PASSWORD.chars().rev().collect::<String>()
    )
}

fn text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Every file under `dir`, read as bytes, that holds `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_holding(&p, needle));
        } else if let Ok(bytes) = std::fs::read(&p) {
            if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                out.push(p.display().to_string());
            }
        }
    }
    out
}

#[test]
fn a_secret_used_by_a_shell_step_that_echoes_it_appears_nowhere_but_in_the_process() {
    let b = Agent::builder();
    let token_file = b.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let hook_out = b.path().join("hook.json");
    let conf = format!("alerts:\n  hooks:\n    - command: [sh, -c, 'cat >> {}']\n", hook_out.display());
    let mut agent =
        b.env("APOLLO_E2E_DB_PASSWORD", PASSWORD).config(&conf).task("leak.yaml", &leak(&token_file)).start();

    // The dry-run shows the secrets masked.
    let dry = text(&agent.cli(&["dry-run", "leak"]));
    assert!(dry.contains("token=***"), "{dry}");

    let (code, inst) = agent.cli_json(&["run", "leak", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    let id = inst["id"].as_str().unwrap().to_string();
    let out = inst["steps"][0]["output"].to_string();
    // The process got the real values; what it printed is recorded masked.
    assert!(out.contains("real-value-seen") && out.contains("pw=*** token=***"), "{out}");
    let err = inst["steps"][1]["error"].as_str().unwrap_or_default();
    assert!(err.contains("failing with ***"), "{err}");
    let shown = text(&agent.cli(&["show", &id]));
    let logs = text(&agent.cli(&["logs", &id]));
    let alerts = text(&agent.cli(&["alerts"]));
    assert!(logs.contains("pw=*** token=***") && logs.contains("stderr has ***"), "{logs}");
    assert!(alerts.contains("failing with ***"), "{alerts}");
    // The hook ran (its payload is the failure's alert).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::fs::read_to_string(&hook_out).unwrap_or_default().contains("instance_failed") {
        assert!(std::time::Instant::now() < deadline, "the hook never ran:\n{}", agent.log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let hook = std::fs::read_to_string(&hook_out).unwrap();
    assert!(hook.contains("failing with ***"), "{hook}");
    agent.stop();
    let log = agent.log();
    for secret in [PASSWORD, TOKEN] {
        for (what, t) in [("show", &shown), ("logs", &logs), ("alerts", &alerts), ("hook", &hook), ("agent log", &log)]
        {
            assert!(!t.contains(secret), "{secret} leaked into {what}:\n{t}");
        }
        // Not in the store (the database and its WAL), the step logs or
        // anything else under the data dir.
        let leaked = files_holding(&agent.path().join("data"), secret);

        assert!(leaked.is_empty(), "{secret} leaked into {leaked:?}");
    }
}

#[test]
fn a_missing_secret_fails_the_request_naming_it_and_creates_nothing() {
    let b = Agent::builder();
    let token_file = b.path().join("no-such-token");
    let agent = b.task("leak.yaml", &leak(&token_file)).start();
    let out = agent.cli(&["run", "leak"]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("secret db_password: environment variable APOLLO_E2E_DB_PASSWORD is not set"), "{said}");
    assert!(said.contains("nothing was created"), "{said}");
    let (_, listed) = agent.cli_json(&["ls"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "{listed:#}");
    let dry = text(&agent.cli(&["dry-run", "leak"]));
    assert!(dry.contains("secret db_password") && dry.contains("secret token: file"), "{dry}");
}

#[test]
fn an_undeclared_secret_is_named_by_check_with_what_is_declared() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("tasks");
    std::fs::create_dir_all(&t).unwrap();
    let def = "task: t\nsecrets:\n  db_password: {env: X}\nsteps:\n  - plugin: shell\n    params:\n      command: 'echo {{ secrets.db_pasword }}'\n";
    std::fs::write(t.join("t.yaml"), def).unwrap();
    let out = std::process::Command::new(agent_bin()).current_dir(dir.path()).arg("check").output().unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("secrets.db_pasword: the definition declares no secret"), "{said}");
    assert!(said.contains("did you mean \"db_password\"?"), "{said}");
}

#[test]
fn on_postgresql_a_secret_is_in_no_table_of_the_store() {
    let schema = PgSchema::new("secrets");
    let b = Agent::builder();
    let token_file = b.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let agent = b
        .env("APOLLO_E2E_DB_PASSWORD", PASSWORD)
        .config(&format!("{}agent:\n  name: a\n", schema.config()))
        .task("leak.yaml", &leak(&token_file))
        .start();
    let (code, inst) = agent.cli_json(&["run", "leak", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    assert!(inst["steps"][0]["output"].to_string().contains("real-value-seen"), "{inst:#}");
    let tables =
        schema.sql(&format!("SELECT table_name FROM information_schema.tables WHERE table_schema = '{}'", schema.name));
    assert!(tables.len() >= 10, "{tables:?}");
    for t in tables.iter().filter_map(|r| r[0].clone()) {
        let rows = schema.sql(&format!("SELECT string_agg(x::text, ' ') FROM {t} x"));
        let all = rows.first().and_then(|r| r[0].clone()).unwrap_or_default();
        for secret in [PASSWORD, TOKEN] {
            assert!(!all.contains(secret), "{secret} is in table {t}");
        }
        if t == "step_runs" {
            assert!(all.contains("pw=*** token=***"), "the masked output is stored: {all}");
        }
    }
}

/// An alerts hook that appends each payload to `out`.
fn hook_conf(out: &Path) -> String {
    format!("alerts:\n  hooks:\n    - command: [sh, -c, 'cat >> {}']\n", out.display())
}

/// The hook's payloads, once one of them holds `kind`.
fn hooked(agent: &Agent, out: &Path, kind: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(out).unwrap_or_default();
        if text.contains(kind) {
            return text;
        }
        assert!(std::time::Instant::now() < deadline, "the hook never got {kind}:\n{}", agent.log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// None of `needles` is in any of `places`, nor in any file under the data
/// dir (the store and its WAL, the step logs).
fn nowhere(agent: &Agent, needles: &[&str], places: &[(&str, &str)]) {
    for needle in needles {
        for (what, t) in places {
            assert!(!t.contains(needle), "{needle} leaked into {what}:\n{t}");
        }
        let leaked = files_holding(&agent.path().join("data"), needle);
        assert!(leaked.is_empty(), "{needle} leaked into {leaked:?}");
    }
}

const LINE1: &str = "first-line-5b1e9c0d";
const LINE2: &str = "second-line-a7f3e2";

#[test]
fn a_secret_of_two_lines_is_masked_whole_and_line_by_line() {
    let b = Agent::builder();
    let key = b.path().join("key");
    std::fs::write(&key, format!("{LINE1}\n{LINE2}\n")).unwrap();
    let hook_out = b.path().join("hook.json");
    let def = format!(
        r#"task: lines
on_failure: stop
secrets:
  key: {{file: {}}}
steps:
  - name: print
    plugin: shell
    retry: 0
    env: {{KEY: "{{{{ secrets.key }}}}"}}
    params:
      command: 'echo "$KEY"; echo "$KEY" >&2; exit 3'
"#,
        key.display()
    );
    let mut agent = b.config(&hook_conf(&hook_out)).task("lines.yaml", &def).start();
    let (code, inst) = agent.cli_json(&["run", "lines", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    let id = inst["id"].as_str().unwrap().to_string();
    let err = inst["steps"][0]["error"].as_str().unwrap_or_default();
    assert!(err.contains("stderr: ***") && err.contains("stdout: ***"), "{err}");
    let shown = agent.cli_json(&["show", &id]).1.to_string();
    let logs = text(&agent.cli(&["logs", &id]));
    assert!(logs.contains("***"), "{logs}");
    let hook = hooked(&agent, &hook_out, "instance_failed");
    agent.stop();
    let log = agent.log();
    let places =
        [("show", shown.as_str()), ("logs", logs.as_str()), ("hook", hook.as_str()), ("agent log", log.as_str())];
    nowhere(&agent, &[LINE1, LINE2], &places);
}

/// 39 characters, with no character an encoder would change.
const LONG: &str = "LONGSECRET-7f3a9c1e5b2d8f4a6c0e9b7d3a1x";

#[test]
fn a_secret_across_a_cut_is_masked_whole_before_the_cut() {
    // The first step's stdout tail (its last 4 KiB) starts five characters
    // into the secret; the second step's stderr line of 219 characters, cut
    // to 200 in its error, ends with it.
    let def = r#"task: cut
on_failure: stop
secrets:
  long: {env: APOLLO_E2E_LONG}
steps:
  - name: tail
    plugin: shell
    env: {S: "{{ secrets.long }}"}
    params:
      command: 'head -c 10000 /dev/zero | tr "\0" x; printf %s "$S"; head -c 4061 /dev/zero | tr "\0" x; echo'
  - name: line
    plugin: shell
    retry: 0
    env: {S: "{{ secrets.long }}"}
    params:
      command: 'head -c 180 /dev/zero | tr "\0" E >&2; printf "%s\n" "$S" >&2; exit 3'
"#;
    let agent = Agent::builder().env("APOLLO_E2E_LONG", LONG).task("cut.yaml", def).start();
    let (code, inst) = agent.cli_json(&["run", "cut", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    let id = inst["id"].as_str().unwrap().to_string();
    let tail = inst["steps"][0]["output"]["stdout_tail"].as_str().unwrap_or_default();
    assert!(tail.len() <= 4096 && tail.trim_end().ends_with("xxxx"), "{tail}");
    let err = inst["steps"][1]["error"].as_str().unwrap_or_default();
    assert!(err.contains(&format!("stderr: {}***", "E".repeat(180))), "{err}");
    let shown = agent.cli_json(&["show", &id]).1.to_string();
    let logs = text(&agent.cli(&["logs", &id]));
    let (head, end) = (&LONG[..10], &LONG[LONG.len() - 10..]);
    nowhere(&agent, &[head, end], &[("show", shown.as_str()), ("logs", logs.as_str())]);
}

#[tokio::test]
async fn a_secret_in_an_approval_message_is_masked_wherever_the_request_shows() {
    const GATE: &str = "gate-key-93be01f7";
    let b = Agent::builder();
    let hook_out = b.path().join("hook.json");
    let def = "task: gate\non_failure: stop\nsecrets:\n  x: {env: APOLLO_E2E_GATE}\nsteps:\n  - name: gate\n    \
               plugin: approval\n    params:\n      message: \"rotate with {{ secrets.x }} now?\"\n";
    let mut agent = b.env("APOLLO_E2E_GATE", GATE).config(&hook_conf(&hook_out)).task("gate.yaml", def).start();
    let (c, mut events) = agent.watch().await;
    let id = trigger(&c, "gate", serde_json::json!({})).await;
    let parked = |i: &Instance| i.waiting.as_deref().is_some_and(|w| w.starts_with("waiting for approval"));
    let waiting = wait_until(&c, &mut events, &id, "the approval's wait", parked).await.waiting.unwrap();
    assert!(waiting.ends_with("rotate with *** now?"), "{waiting}");
    let alerts = alerts_text(&c).await;
    assert!(alerts.contains("rotate with *** now?"), "{alerts}");
    let hook = hooked(&agent, &hook_out, "approval_requested");
    assert!(hook.contains("rotate with *** now?"), "{hook}");
    let listed = text(&agent.cli(&["ls"]));
    let approvals = text(&agent.cli(&["approvals"]));
    let cli_alerts = text(&agent.cli(&["alerts"]));
    let out = agent.cli(&["approve", &id, "--reason", "go"]);
    assert!(out.status.success(), "{}", text(&out));
    let done = wait_until(&c, &mut events, &id, "the approved instance", ended).await;
    assert_eq!(done.state, apollo_shared::state::TaskState::Success, "{done:?}");
    let shown = text(&agent.cli(&["show", &id]));
    let shown_json = agent.cli_json(&["show", &id]).1.to_string();
    agent.stop();
    let log = agent.log();
    let places = [
        ("ls", listed.as_str()),
        ("approvals", approvals.as_str()),
        ("alerts", alerts.as_str()),
        ("apollo alerts", cli_alerts.as_str()),
        ("hook", hook.as_str()),
        ("show", shown.as_str()),
        ("show --json", shown_json.as_str()),
        ("agent log", log.as_str()),
    ];
    nowhere(&agent, &[GATE], &places);
}

#[test]
fn a_secret_an_http_client_percent_encodes_is_masked_encoded_too() {
    const SPACED: &str = "tok en<é-4d2c9b";
    // A port nothing listens on: the client's error quotes the URL it made.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let def = format!(
        "task: call\non_failure: stop\nsecrets:\n  sp: {{env: APOLLO_E2E_SPACED}}\nsteps:\n  - plugin: http\n    \
         retry: 0\n    params:\n      url: \"http://127.0.0.1:{port}/hook?token={{{{ secrets.sp }}}}\"\n"
    );
    let agent = Agent::builder().env("APOLLO_E2E_SPACED", SPACED).task("call.yaml", &def).start();
    let (code, inst) = agent.cli_json(&["run", "call", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    let id = inst["id"].as_str().unwrap().to_string();
    let err = inst["steps"][0]["error"].as_str().unwrap_or_default();
    assert!(err.contains("token=***"), "{err}");
    let shown = agent.cli_json(&["show", &id]).1.to_string();
    let places = [("error", err), ("show", shown.as_str())];
    nowhere(&agent, &[SPACED, "tok%20en", "%3C%C3%A9-4d2c9b", "en<é"], &places);
}
