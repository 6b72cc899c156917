//! External plugins: executables in any language, called as
//! `<exe> describe|validate|execute|rollback` with one JSON document on stdin
//! and one JSON object expected on stdout (see PLUGINS.md).
//!
//! Each call runs in its own process group with a clean environment (an
//! allowlist, the variables the registration passes through, and the
//! `APOLLO_*` call variables), in the instance's work dir, with the step's
//! timeout enforced on the whole group. stdout is kept up to the result
//! limit and stderr goes to the step's log; what a plugin prints beyond
//! that is read and dropped, so it cannot grow the agent's memory.

use super::contract::{Call, ParamDoc, Plugin, PluginError};
use super::process::{self, Spec};
use super::worker::{Pool, PoolConf};
use crate::logs::StepLog;
use apollo_shared::def::Masker;
use futures::future::BoxFuture;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The exit status that means "failed, try again" (EX_TEMPFAIL).
pub const EXIT_RETRYABLE: i32 = 75;
/// How long describe and validate may take.
const QUICK_CALL: Duration = Duration::from_secs(10);
/// Result cap for describe and validate.
const QUICK_OUTPUT: usize = 256 * 1024;

pub struct External {
    path: PathBuf,
    name: String,
    version: semver::Version,
    description: String,
    idempotent: bool,
    describe: Value,
    /// Variables passed through from the agent's environment.
    pass_env: Vec<String>,
    /// The largest result accepted from execute (the step output limit).
    output_cap: usize,
    kill_grace: Duration,
    /// Its worker pool, when describe says `"mode": "worker"`.
    pool: Option<Pool>,
}

/// What one call printed and how it ended, and the step's secrets, masked
/// in what an error quotes of it before it is cut or escaped.
struct Reply {
    outcome: process::Outcome,
    masker: Masker,
}

/// The start of `text` (masked already), quoted.
fn quote(text: &str) -> String {
    let text = text.trim();
    let end = text.char_indices().nth(200).map_or(text.len(), |(i, _)| i);
    let t = apollo_shared::text::until(text, end);
    if t.len() < text.len() {
        format!("{t:?}…")
    } else {
        format!("{t:?}")
    }
}

impl Reply {
    /// The JSON object the plugin printed, or an error that quotes what it printed instead.
    fn object(&self, verb: &str, cap: usize) -> Result<Map<String, Value>, String> {
        let o = &self.outcome;
        if o.stdout_bytes as usize > cap {
            return Err(format!(
                "{verb} printed {} bytes on stdout, over the {cap} byte limit for a result: write large data to a file in the work dir and return its path",
                o.stdout_bytes
            ));
        }
        let text = o.stdout_tail.trim();
        if text.is_empty() {
            return Err(format!("{verb} printed nothing on stdout (expected one JSON object)"));
        }
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(other) => Err(format!(
                "{verb} printed JSON that is not an object ({}): {}",
                apollo_shared::def::kind(&other),
                quote(&self.masker.text(text))
            )),
            Err(e) => Err(format!("{verb} printed invalid JSON ({e}); it began: {}", quote(&self.masker.text(text)))),
        }
    }

    /// The plugin's own words for a failure: `error` of its JSON, else its stderr.
    fn reason(&self) -> String {
        if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(self.outcome.stdout_tail.trim()) {
            if let Some(e) = m.get("error").and_then(Value::as_str) {
                return self.masker.text(e);
            }
        }
        let err: Vec<&str> = self.outcome.stderr_tail.lines().rev().take(3).collect();
        err.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }
}

/// Where and how one call runs.
struct Io<'a> {
    env: Vec<(String, String)>,
    cwd: &'a Path,
    log: Option<&'a StepLog>,
    cancel: CancellationToken,
    grace: Duration,
    /// Result cap.
    cap: usize,
    /// The step the call runs for, if any.
    step_key: Option<String>,
}

async fn run(path: &Path, verb: &str, doc: &Value, io: Io<'_>) -> Result<Reply, String> {
    let spec = Spec {
        argv: vec![path.display().to_string(), verb.to_string()],
        env: io.env,
        cwd: io.cwd.to_path_buf(),
        clean_env: true,
        stdin: Some(serde_json::to_vec(doc).unwrap_or_default()),
        capture_stdout: Some(io.cap),
        step_key: io.step_key,
    };
    let masker = io.log.map(StepLog::masker).unwrap_or_default();
    let outcome = process::run(spec, io.log, io.cancel, io.grace).await?;
    Ok(Reply { outcome, masker })
}

/// Runs a quick call (describe, validate) with its own timeout.
async fn quick(path: &Path, verb: &str, doc: &Value, pass: &[String]) -> Result<Reply, String> {
    let cancel = CancellationToken::new();
    let timer = cancel.clone();
    let guard = tokio::spawn(async move {
        tokio::time::sleep(QUICK_CALL).await;
        timer.cancel();
    });
    let cwd = std::env::temp_dir();
    let io = Io {
        env: process::clean_env(pass, Vec::new()),
        cwd: &cwd,
        log: None,
        cancel,
        grace: Duration::from_secs(1),
        cap: QUICK_OUTPUT,
        step_key: None,
    };
    let r = run(path, verb, doc, io).await;
    guard.abort();
    let r = r?;
    if r.outcome.stopped {
        return Err(format!("{verb} did not answer within {}s", QUICK_CALL.as_secs()));
    }
    Ok(r)
}

/// Calls `<exe> describe` and checks what it says.
pub async fn describe(path: &Path, pass: &[String]) -> Result<Value, String> {
    let r = quick(path, "describe", &json!({}), pass).await?;
    if r.outcome.code != Some(0) {
        return Err(format!(
            "describe ended with {}; stderr: {}",
            process::describe_exit(&r.outcome),
            quote(&r.reason())
        ));
    }
    let m = r.object("describe", QUICK_OUTPUT)?;
    let version = m
        .get("version")
        .and_then(Value::as_str)
        .ok_or("describe: missing \"version\" (a semver string such as \"1.2.0\")")?;
    semver::Version::parse(version).map_err(|e| {
        format!("describe: version {version:?} is not a semver version (expected MAJOR.MINOR.PATCH, such as \"1.0.0\"): {e}")
    })?;
    match m.get("mode") {
        None => {}
        Some(Value::String(mode)) if mode == "oneshot" || mode == "worker" => {}
        Some(other) => {
            return Err(format!("describe: mode {other} is not valid (expected \"oneshot\" or \"worker\")"));
        }
    }
    Ok(Value::Object(m))
}

impl External {
    /// Registers an executable: checks it exists and is executable, and asks
    /// it to describe itself. A worker-mode plugin gets its pool, with
    /// `workers` as its bounds (the defaults when `None`).
    pub async fn load(
        name: &str,
        path: &Path,
        pass_env: Vec<String>,
        output_cap: usize,
        kill_grace: Duration,
        workers: Option<PoolConf>,
    ) -> Result<External, String> {
        use std::os::unix::fs::PermissionsExt;
        // Calls run in the work dir, so the path must not depend on ours.
        let path = &std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            return Err(format!("{}: not an executable file (chmod +x it)", path.display()));
        }
        let d = describe(path, &pass_env).await?;
        let pool = (d.get("mode").and_then(Value::as_str) == Some("worker")).then(|| {
            let cap = output_cap.max(QUICK_OUTPUT);
            Pool::new(path, pass_env.clone(), workers.unwrap_or_default(), kill_grace, cap)
        });
        Ok(External {
            path: path.to_path_buf(),
            name: name.to_string(),
            version: semver::Version::parse(d["version"].as_str().unwrap_or_default()).map_err(|e| e.to_string())?,
            description: d.get("description").and_then(Value::as_str).unwrap_or_default().to_string(),
            idempotent: d.get("idempotent").and_then(Value::as_bool).unwrap_or(false),
            describe: d,
            pass_env,
            output_cap,
            kill_grace,
            pool,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The call's own variables (a one-shot call's environment adds them to
    /// the clean base; a worker gets them with the request).
    fn call_vars(call: &Call<'_>, rollback: bool) -> Vec<(String, String)> {
        let mut extra = vec![
            ("APOLLO_IDEMPOTENCY_KEY".to_string(), call.idempotency_key.to_string()),
            ("APOLLO_WORK_DIR".into(), call.work_dir.display().to_string()),
            ("APOLLO_STEP".into(), call.step.into()),
            ("APOLLO_ATTEMPT".into(), call.attempt.to_string()),
            ("APOLLO_TASK_ID".into(), call.context["task_id"].as_str().unwrap_or_default().into()),
            ("APOLLO_TRACE_ID".into(), call.context["trace_id"].as_str().unwrap_or_default().into()),
        ];
        if rollback {
            extra.push(("APOLLO_ROLLBACK".into(), "1".into()));
        }
        extra.extend(call.env.iter().cloned());
        extra
    }

    async fn step_call(
        &self,
        verb: &str,
        call: &Call<'_>,
        output: Option<&Value>,
    ) -> Result<Map<String, Value>, PluginError> {
        let mut doc = json!({
            "params": call.params,
            "context": &**call.context,
            "task_id": call.context["task_id"],
            "step": call.step,
            "attempt": call.attempt,
            "idempotency_key": call.idempotency_key,
            "work_dir": call.work_dir,
            "dry_run": false,
        });
        if let Some(o) = output {
            doc["output"] = o.clone();
        }
        let vars = Self::call_vars(call, verb == "rollback");
        if let Some(pool) = &self.pool {
            return pool.call(verb, &doc, &vars, Some(call.log), &call.cancel, self.output_cap).await;
        }
        let env = process::clean_env(&self.pass_env, vars);
        let io = Io {
            env,
            cwd: call.work_dir,
            log: Some(call.log),
            cancel: call.cancel.clone(),
            grace: self.kill_grace,
            cap: self.output_cap,
            step_key: Some(call.idempotency_key.to_string()),
        };
        let r = run(&self.path, verb, &doc, io).await.map_err(PluginError::permanent)?;
        let o = &r.outcome;
        if o.stopped {
            return Err(PluginError::retryable(format!("{verb} was stopped")));
        }
        match (o.code, o.signal) {
            (Some(0), _) => r.object(verb, self.output_cap).map_err(PluginError::permanent),
            (Some(EXIT_RETRYABLE), _) => Err(PluginError::retryable(format!(
                "{verb} asked to be retried (exit {EXIT_RETRYABLE}): {}",
                r.reason()
            ))),
            (Some(c), _) => Err(PluginError::permanent(format!("{verb} failed (exit {c}, permanent): {}", r.reason()))),
            (None, Some(_)) => Err(PluginError::retryable(format!(
                "{verb} {}; stderr: {}",
                process::describe_exit(o),
                quote(&r.reason())
            ))),
            _ => Err(PluginError::retryable(format!("{verb} ended without a status"))),
        }
    }

    /// validate on a worker, bounded like a one-shot validate.
    async fn validate_on(&self, pool: &Pool, params: &Map<String, Value>) -> Result<(), PluginError> {
        let cancel = CancellationToken::new();
        let timer = cancel.clone();
        let guard = tokio::spawn(async move {
            tokio::time::sleep(QUICK_CALL).await;
            timer.cancel();
        });
        let r = pool.call("validate", &json!({ "params": params }), &[], None, &cancel, QUICK_OUTPUT).await;
        guard.abort();
        match r {
            Ok(m) if m.get("ok") == Some(&Value::Bool(false)) => Err(PluginError::permanent(
                m.get("error").and_then(Value::as_str).unwrap_or("validate refused the params").to_string(),
            )),
            Ok(_) => Ok(()),
            Err(_) if cancel.is_cancelled() => {
                Err(PluginError::retryable(format!("validate: did not answer within {}s", QUICK_CALL.as_secs())))
            }
            // A refusal is the plugin's own words, as in one-shot mode.
            Err(e) if e.permanent => Err(PluginError::permanent(
                e.message.strip_prefix("validate failed (permanent): ").unwrap_or(&e.message).to_string(),
            )),
            Err(e) => Err(e),
        }
    }
}

impl Plugin for External {
    fn name(&self) -> &str {
        &self.name
    }
    fn version(&self) -> semver::Version {
        self.version.clone()
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn params(&self) -> Vec<ParamDoc> {
        Vec::new()
    }
    fn idempotent(&self) -> bool {
        self.idempotent
    }
    fn describe(&self) -> Value {
        let mut d = self.describe.clone();
        d["command"] = json!(self.path);
        d
    }
    fn outputs(&self) -> Option<Vec<String>> {
        let fields = self.describe.get("outputs")?.as_array()?;
        Some(fields.iter().filter_map(|f| f.as_str().map(str::to_string)).collect())
    }
    fn pool(&self) -> Option<apollo_shared::protocol::PoolStats> {
        self.pool.as_ref().map(Pool::stats)
    }
    fn validate<'a>(&'a self, params: &'a Map<String, Value>) -> BoxFuture<'a, Result<(), PluginError>> {
        Box::pin(async move {
            if let Some(pool) = &self.pool {
                return self.validate_on(pool, params).await;
            }
            // Not answering in time is not a refusal: it is retried like an execute.
            let r = quick(&self.path, "validate", &json!({ "params": params }), &self.pass_env)
                .await
                .map_err(|e| PluginError::retryable(format!("validate: {e}")))?;
            let said = r.object("validate", QUICK_OUTPUT);
            match (r.outcome.code, r.outcome.signal, said) {
                (Some(0), _, Ok(m)) if m.get("ok") != Some(&Value::Bool(false)) => Ok(()),
                // The contract: a JSON object ({"ok": true}); anything else is
                // a plugin that does not speak it, refused as such.
                (Some(0), _, Err(e)) => Err(PluginError::permanent(format!(
                    "validate broke the plugin protocol (expected {{\"ok\": true}}): {e}"
                ))),
                (Some(EXIT_RETRYABLE), _, _) => Err(PluginError::retryable(format!(
                    "validate asked to be retried (exit {EXIT_RETRYABLE}): {}",
                    r.reason()
                ))),
                (None, Some(_), _) => Err(PluginError::retryable(format!(
                    "validate {}; stderr: {}",
                    process::describe_exit(&r.outcome),
                    quote(&r.reason())
                ))),
                _ => Err(PluginError::permanent(r.reason())),
            }
        })
    }
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, PluginError>> {
        Box::pin(async move { self.step_call("execute", &call, None).await.map(Value::Object) })
    }
    fn rollback<'a>(&'a self, call: Call<'a>, output: Option<&'a Value>) -> BoxFuture<'a, Result<(), PluginError>> {
        Box::pin(async move { self.step_call("rollback", &call, output).await.map(|_| ()) })
    }
}
