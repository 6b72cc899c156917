//! `apollo-agent plugin test <exe>`: what a plugin author runs before
//! registering a plugin. It calls describe, validate with the example params,
//! execute twice with one idempotency key (the outputs must match), then
//! rollback, and reports each result plainly.

use super::contract::{Call, CallContext, Plugin};
use super::external::External;
use crate::logs::StepLog;
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::Path;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// Returns whether every check passed.
pub async fn run(exe: &Path, params: Option<Map<String, Value>>, out: &mut impl Write) -> std::io::Result<bool> {
    let mut ok = true;
    let mut report = |out: &mut dyn Write, pass: bool, what: &str, detail: &str| -> std::io::Result<()> {
        ok &= pass;
        writeln!(
            out,
            "{} {what}{}",
            if pass { "ok  " } else { "FAIL" },
            if detail.is_empty() { String::new() } else { format!(": {detail}") }
        )
    };
    let plugin = match External::load("under-test", exe, Vec::new(), 1024 * 1024, Duration::from_secs(5), None).await {
        Ok(p) => p,
        Err(e) => {
            report(out, false, "describe", e.strip_prefix("describe: ").unwrap_or(&e))?;
            return Ok(false);
        }
    };
    let d = Plugin::describe(&plugin);
    report(
        out,
        true,
        "describe",
        &format!(
            "{} {} (idempotent: {}, mode: {})",
            d["name"].as_str().unwrap_or("?"),
            plugin.version(),
            plugin.idempotent(),
            if plugin.pool().is_some() { "worker" } else { "oneshot" }
        ),
    )?;
    let params = match params.or_else(|| d.get("example_params").and_then(Value::as_object).cloned()) {
        Some(p) => p,
        None => {
            report(out, false, "params", "describe declares no example_params; pass --params '{...}'")?;
            return Ok(false);
        }
    };
    match plugin.validate(&params).await {
        Ok(()) => report(out, true, "validate", &Value::Object(params.clone()).to_string())?,
        Err(e) => {
            report(out, false, "validate", &e.message)?;
            return Ok(false);
        }
    }
    let work = tempfile::tempdir()?;
    let log = StepLog::new(work.path().join("plugin-test.log"), 1024 * 1024);
    let context = json!({"task": "plugin-test", "task_id": "plugin-test", "trace_id": "plugin-test", "params": params, "steps": {}});
    let context = CallContext::made(&context);
    let key = "plugin-test:0";
    let call = |attempt| Call {
        params: &params,
        context: &context,
        idempotency_key: key,
        work_dir: work.path(),
        tasks_dir: work.path(),
        previous: None,
        step: "under-test",
        attempt,
        env: &[],
        log: &log,
        cancel: CancellationToken::new(),
        kill_grace: Duration::from_secs(5),
    };
    let mut outputs = Vec::new();
    for attempt in 1..=2 {
        match tokio::time::timeout(STEP_TIMEOUT, plugin.execute(call(attempt))).await {
            Ok(Ok(o)) => {
                report(out, true, &format!("execute #{attempt}"), &o.to_string())?;
                outputs.push(o);
            }
            Ok(Err(e)) => report(out, false, &format!("execute #{attempt}"), &e.message)?,
            Err(_) => report(out, false, &format!("execute #{attempt}"), "did not finish in 60s")?,
        }
    }
    if outputs.len() == 2 {
        let same = outputs[0] == outputs[1];
        let detail = if same {
            format!("the same idempotency key ({key}) gave the same output")
        } else {
            format!(
                "NOT idempotent: the same idempotency key ({key}) gave different outputs: {} then {}",
                outputs[0], outputs[1]
            )
        };
        report(out, same, "idempotent", &detail)?;
    }
    match plugin.rollback(call(1), outputs.first()).await {
        Ok(()) => report(out, true, "rollback", "")?,
        Err(e) => report(out, false, "rollback", &e.message)?,
    }
    let logged = std::fs::read_to_string(work.path().join("plugin-test.log")).unwrap_or_default();
    if !logged.is_empty() {
        writeln!(out, "stderr of the calls:")?;
        for line in logged.lines().take(20) {
            writeln!(out, "  {line}")?;
        }
    }
    writeln!(out, "{}", if ok { "all checks passed" } else { "some checks failed" })?;
    Ok(ok)
}
