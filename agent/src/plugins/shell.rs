//! `shell`: runs a command (a string through `sh -c`, or a list as argv).

use super::contract::{Call, ParamDoc, Plugin, PluginError};
use super::params::check_known;
use super::process::{self, Spec};
use futures::future::BoxFuture;
use serde_json::{json, Map, Value};

/// Runs commands in a clean environment: the allowlist of
/// [`process::ALLOWED_ENV`], the variables its registration passes through
/// (`env:` of a `class:` registration), the step's `env:`, the `env` param
/// and the `APOLLO_*` call variables.
pub struct Shell {
    pub pass_env: Vec<String>,
}

const PARAMS: &[&str] = &["command", "env", "cwd", "ok_codes", "rollback_command"];

fn argv(v: &Value, field: &str) -> Result<Vec<String>, String> {
    match v {
        Value::String(s) if !s.trim().is_empty() => Ok(vec!["sh".into(), "-c".into(), s.clone()]),
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(s.clone()),
                Value::Number(n) => Ok(n.to_string()),
                other => Err(format!("{field}: list items must be strings, found {}", apollo_shared::def::kind(other))),
            })
            .collect(),
        _ => Err(format!("{field}: expected a command string (run with sh -c) or a non-empty list (argv)")),
    }
}

fn ok_codes(p: &Map<String, Value>) -> Result<Vec<i64>, String> {
    match p.get("ok_codes") {
        None | Some(Value::Null) => Ok(vec![0]),
        Some(Value::Array(a)) if a.iter().all(|x| x.as_i64().is_some()) => {
            Ok(a.iter().filter_map(Value::as_i64).collect())
        }
        Some(_) => Err("ok_codes: expected a list of exit codes, e.g. [0, 3]".into()),
    }
}

fn env(p: &Map<String, Value>) -> Result<Vec<(String, String)>, String> {
    match p.get("env") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                Value::Number(_) | Value::Bool(_) => Ok((k.clone(), v.to_string())),
                _ => Err(format!("env.{k}: expected a string")),
            })
            .collect(),
        Some(_) => Err("env: expected a mapping of variable names to values".into()),
    }
}

/// Lines of stderr, then of stdout, an error carries: the cause is usually
/// the last thing a command said, on stderr. The whole output is in the
/// step's log.
const ERROR_STDERR_LINES: usize = 5;
const ERROR_STDOUT_LINES: usize = 3;
/// Characters kept of each line an error carries.
const ERROR_LINE_CHARS: usize = 200;

/// `; stderr: A | B; stdout: C | D`: the last lines of each stream, in the
/// order they were written, labelled and bounded; nothing for an empty one.
fn output_tails(o: &process::Outcome) -> String {
    let mut out = String::new();
    for (label, text, n) in
        [("stderr", &o.stderr_tail, ERROR_STDERR_LINES), ("stdout", &o.stdout_tail, ERROR_STDOUT_LINES)]
    {
        let lines = apollo_shared::text::last_lines(text, n, ERROR_LINE_CHARS);
        if !lines.is_empty() {
            out.push_str(&format!("; {label}: {}", lines.join(" | ")));
        }
    }
    out
}

impl Shell {
    async fn run(&self, call: &Call<'_>, command: &Value, field: &str, rollback: bool) -> Result<Value, PluginError> {
        let p = call.params;
        let argv = argv(command, field).map_err(PluginError::permanent)?;
        let mut vars: Vec<(String, String)> = call.env.to_vec();
        vars.extend(env(p).map_err(PluginError::permanent)?);
        vars.push(("APOLLO_WORK_DIR".into(), call.work_dir.display().to_string()));
        vars.push(("APOLLO_STEP".into(), call.step.into()));
        vars.push(("APOLLO_ATTEMPT".into(), call.attempt.to_string()));
        vars.push(("APOLLO_TASK_ID".into(), call.context["task_id"].as_str().unwrap_or_default().into()));
        vars.push(("APOLLO_TRACE_ID".into(), call.context["trace_id"].as_str().unwrap_or_default().into()));
        if rollback {
            vars.push(("APOLLO_ROLLBACK".into(), "1".into()));
        }
        let cwd = match p.get("cwd").and_then(Value::as_str) {
            Some(d) => super::params::resolve_path(call.work_dir, d),
            None => call.work_dir.to_path_buf(),
        };
        let started = std::time::Instant::now();
        let spec = Spec {
            argv,
            env: process::clean_env(&self.pass_env, vars),
            cwd,
            clean_env: true,
            stdin: None,
            capture_stdout: None,
            step_key: Some(call.idempotency_key.to_string()),
        };
        let outcome = process::run(spec, Some(call.log), call.cancel.clone(), call.kill_grace)
            .await
            .map_err(PluginError::permanent)?;
        let ok = ok_codes(p).map_err(PluginError::permanent)?;
        let code = outcome.code.map(i64::from);
        if outcome.stopped || !code.is_some_and(|c| ok.contains(&c)) {
            return Err(PluginError::retryable(format!(
                "{} {} (expected exit code {ok:?}){}",
                if rollback { "rollback command ended with" } else { "command ended with" },
                process::describe_exit(&outcome),
                output_tails(&outcome)
            )));
        }
        let mut out = json!({
            "exit_code": code,
            "duration_ms": started.elapsed().as_millis() as u64,
            "stdout_tail": outcome.stdout_tail,
        });
        // A command may hand structured output to later steps: a JSON object on
        // its last line of stdout becomes `result`. One too large to keep is an
        // error, never a result silently dropped.
        let last = String::from_utf8_lossy(&outcome.last_line);
        let last = last.trim();
        if last.starts_with('{') {
            if outcome.last_line_bytes as usize > process::RESULT_LINE_BYTES {
                return Err(PluginError::permanent(format!(
                    "the last line of stdout (a JSON result) is {} bytes, over the {} byte limit for a result: \
                     write large data to a file in the work dir and return its path",
                    outcome.last_line_bytes,
                    process::RESULT_LINE_BYTES
                )));
            }
            if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(last) {
                out["result"] = v;
            }
        }
        Ok(out)
    }
}

impl Plugin for Shell {
    fn name(&self) -> &str {
        "shell"
    }
    fn version(&self) -> semver::Version {
        semver::Version::new(1, 0, 0)
    }
    fn description(&self) -> &str {
        "Runs a command in its own process group; APOLLO_IDEMPOTENCY_KEY is in its environment"
    }
    fn idempotent(&self) -> bool {
        false
    }
    fn outputs(&self) -> Option<Vec<String>> {
        Some(["exit_code", "duration_ms", "stdout_tail", "result"].map(String::from).to_vec())
    }
    fn params(&self) -> Vec<ParamDoc> {
        vec![
            ParamDoc {
                name: "command",
                kind: "string|list",
                required: true,
                description: "string: run with sh -c; list: argv",
            },
            ParamDoc { name: "env", kind: "map", required: false, description: "extra environment variables" },
            ParamDoc {
                name: "cwd",
                kind: "path",
                required: false,
                description: "working directory (default: the work dir)",
            },
            ParamDoc {
                name: "ok_codes",
                kind: "list",
                required: false,
                description: "exit codes that mean success (default [0])",
            },
            ParamDoc { name: "rollback_command", kind: "string|list", required: false, description: "run on rollback" },
        ]
    }
    fn check_params(&self, p: &Map<String, Value>) -> Result<(), String> {
        check_known(p, PARAMS)?;
        argv(p.get("command").unwrap_or(&Value::Null), "command")?;
        if let Some(r) = p.get("rollback_command").filter(|v| !v.is_null()) {
            argv(r, "rollback_command")?;
        }
        ok_codes(p)?;
        env(p)?;
        super::params::str_param(p, "cwd")?;
        Ok(())
    }
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, PluginError>> {
        Box::pin(async move {
            // The tests make a plugin panic here (`shell.execute=panic(…)`).
            fail::fail_point!("shell.execute");
            let command = call.params.get("command").cloned().unwrap_or(Value::Null);
            self.run(&call, &command, "command", false).await
        })
    }
    fn cannot_undo(&self, p: &Map<String, Value>) -> Option<String> {
        p.get("rollback_command").is_none_or(Value::is_null).then(|| "no rollback_command".to_string())
    }
    fn rollback<'a>(&'a self, call: Call<'a>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), PluginError>> {
        Box::pin(async move {
            match call.params.get("rollback_command").filter(|v| !v.is_null()).cloned() {
                Some(cmd) => self.run(&call, &cmd, "rollback_command", true).await.map(|_| ()),
                None => Ok(()),
            }
        })
    }
}
