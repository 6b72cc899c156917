//! Secrets that never leak: a definition's secrets reach the step's process
//! whole and appear nowhere else — not in the store file, the step's log,
//! the agent's log, `show`, `logs`, the alerts or a hook's payload — where
//! `***` stands in for them; a dry-run shows them masked; a missing secret
//! fails the request, naming it, before anything is created.

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
