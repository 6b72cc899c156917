//! Mapping between rows and the protocol's types, and the text form of times.

use super::db::Db;
use super::value::{p, Row, When};
use super::{Result, StoreError};
use apollo_shared::context::Context;
use apollo_shared::protocol::{Alert, AlertKind, AppliedTimeout, AttemptRun, Instance, StepRun, Transition};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value;

/// Times are stored as fixed-width RFC 3339 UTC text, so they sort as text.
pub fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Characters kept of a history row's reason: a row is one line of a
/// table (`apollo show`, the console's timeline). The whole error stays
/// with the step and the instance.
const REASON_CHARS: usize = 300;

/// A history row's reason: the text on one line, bounded.
pub fn reason(text: &str) -> String {
    // Most reasons are short words the agent wrote: kept as they are.
    let plain = text.len() <= REASON_CHARS
        && !text.starts_with(' ')
        && !text.ends_with(' ')
        && !text.contains("  ")
        && !text.chars().any(|ch| ch.is_whitespace() && ch != ' ');
    match plain {
        true => text.to_string(),
        false => apollo_shared::text::one_line(text, REASON_CHARS),
    }
}

pub fn parse_ts(s: Option<String>) -> Option<DateTime<Utc>> {
    s.and_then(|s| DateTime::parse_from_rfc3339(&s).ok()).map(|t| t.with_timezone(&Utc))
}

fn json(s: Option<String>) -> Option<Value> {
    s.and_then(|s| serde_json::from_str(&s).ok())
}

pub const INSTANCE_COLS: &str = "id, task, def_hash, state, attempt, trace_id, priority, queue, trigger, dedup_key, \
     params, created_at, started_at, finished_at, next_run_at, error, context, lease_owner, lease_expires_at, waiting, failed_steps, pins, locks";

/// The columns of a list item: the context is left out (a list carries
/// summaries; `tasks.get` has the context).
pub const SUMMARY_COLS: &str = "id, task, def_hash, state, attempt, trace_id, priority, queue, trigger, dedup_key, \
     params, created_at, started_at, finished_at, next_run_at, error, NULL, lease_owner, lease_expires_at, waiting, failed_steps, pins, locks";

pub fn instance(r: &Row) -> Result<Instance> {
    let state: String = r.get(3)?;
    Ok(Instance {
        id: r.get(0)?,
        task: r.get(1)?,
        def_hash: r.get(2)?,
        state: state.parse().map_err(StoreError::Invalid)?,
        attempt: r.get(4)?,
        trace_id: r.get(5)?,
        priority: r.get(6)?,
        queue: r.get(7)?,
        trigger: r.get(8)?,
        dedup_key: r.get(9)?,
        params: json(r.get(10)?).unwrap_or(Value::Null),
        created_at: parse_ts(r.get(11)?).unwrap_or_default(),
        started_at: parse_ts(r.get(12)?),
        finished_at: parse_ts(r.get(13)?),
        next_run_at: parse_ts(r.get(14)?),
        error: r.get(15)?,
        context: json(r.get(16)?).unwrap_or(Value::Null),
        lease_owner: r.get(17)?,
        lease_expires_at: parse_ts(r.get(18)?),
        waiting: r.get(19)?,
        failed_steps: r.get(20)?,
        pins: r.get::<Option<String>>(21)?.and_then(|s| serde_json::from_str(&s).ok()),
        locks: r.get::<Option<String>>(22)?.and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default(),
        steps: None,
        transitions: None,
    })
}

/// `list` (as [`INSTANCE_COLS`]) with each column named through `table`.
pub fn qualified(table: &str, list: &str) -> String {
    list.split(',').map(|c| format!("{table}.{}", c.trim())).collect::<Vec<_>>().join(", ")
}

pub const STEP_COLS: &str =
    "seq, name, plugin, plugin_version, state, attempts, failures, params, output, error, started_at, finished_at, passed";

pub fn step(r: &Row) -> Result<StepRun> {
    let state: String = r.get(4)?;
    Ok(StepRun {
        seq: r.get(0)?,
        name: r.get(1)?,
        plugin: r.get(2)?,
        plugin_version: r.get(3)?,
        state: state.parse().map_err(StoreError::Invalid)?,
        attempts: r.get(5)?,
        failures: r.get(6)?,
        params: json(r.get(7)?),
        output: json(r.get(8)?),
        error: r.get(9)?,
        started_at: parse_ts(r.get(10)?),
        finished_at: parse_ts(r.get(11)?),
        earlier: Vec::new(),
        passed: r.get(12)?,
        timeout: None,
        items: None,
    })
}

pub fn transition(r: &Row) -> Result<Transition> {
    Ok(Transition {
        at: r.get::<When>(0)?.0.unwrap_or_default(),
        step: r.get(1)?,
        from: r.get(2)?,
        to: r.get(3)?,
        reason: r.get(4)?,
        actor: r.get(5)?,
    })
}

pub fn alert(r: &Row) -> Result<Alert> {
    Ok(Alert {
        id: r.get(0)?,
        at: parse_ts(r.get(1)?).unwrap_or_default(),
        kind: r.get::<String>(2)?.parse().unwrap_or(AlertKind::Other),
        message: r.get(3)?,
        instance: r.get(4)?,
    })
}

/// The tasks with runnable work, by a loose scan of the per-task index.
pub const RUNNABLE_TASKS: &str = "WITH RECURSIVE t(task) AS (\
    SELECT MIN(task) FROM task_instances INDEXED BY task_instances_runnable_task \
    WHERE state IN ('PENDING', 'RETRYING') \
    UNION ALL \
    SELECT (SELECT MIN(task) FROM task_instances INDEXED BY task_instances_runnable_task \
            WHERE state IN ('PENDING', 'RETRYING') AND task > t.task) FROM t WHERE t.task IS NOT NULL)";

pub(super) fn instance_with_steps(c: &dyn Db, id: &str) -> Result<Instance> {
    static SQL: std::sync::LazyLock<[String; 2]> = std::sync::LazyLock::new(|| {
        [
            format!("SELECT {INSTANCE_COLS} FROM task_instances WHERE id = ?1"),
            format!("SELECT {STEP_COLS} FROM step_runs WHERE instance_id = ?1 ORDER BY seq"),
        ]
    });
    let row = c.query_opt(&SQL[0], p![id])?.ok_or_else(|| StoreError::NotFound(format!("no instance {id}")))?;
    let mut inst = instance(&row)?;
    let steps = c.query(&SQL[1], p![id])?.iter().map(step).collect::<Result<_>>()?;
    inst.steps = Some(steps);
    compose(&mut inst);
    Ok(inst)
}

/// An instance's whole context, made from what the store kept of it and
/// its row and steps (`Context::of`); a listing's (no context) is left so.
pub(super) fn compose(inst: &mut Instance) {
    if !inst.context.is_null() {
        inst.context = Context::of(inst).to_value();
    }
}

/// The context as the archive keeps it: its stored form (`Context::stored`)
/// when that makes the same whole context again, else whole (a context an
/// earlier version kept, whose fields stand).
pub(super) fn compacted(inst: &Instance) -> Value {
    let stored = Context::of(inst).stored();
    let mut probe = Instance { context: stored.clone(), steps: inst.steps.clone(), ..inst.clone() };
    probe.transitions = None;
    match Context::of(&probe).to_value() == inst.context {
        true => stored,
        false => inst.context.clone(),
    }
}

/// Puts each step's earlier attempts on it (for `tasks.get` and the archive;
/// claims do without).
pub(super) fn add_earlier_attempts(c: &dyn Db, inst: &mut Instance) -> Result<()> {
    let rows = c.query(
        "SELECT seq, attempt, plugin_version, params, error, started_at, finished_at, timeout_secs, timeout_basis \
         FROM step_attempts WHERE instance_id = ?1 ORDER BY seq, attempt",
        p![inst.id.as_str()],
    )?;
    for r in &rows {
        let seq: u32 = r.get(0)?;
        let a = AttemptRun {
            attempt: r.get(1)?,
            plugin_version: r.get(2)?,
            params: r.get::<Option<String>>(3)?.and_then(|p| serde_json::from_str(&p).ok()),
            error: r.get(4)?,
            started_at: parse_ts(r.get(5)?),
            finished_at: parse_ts(r.get(6)?),
            timeout: applied_timeout(r, 7)?,
        };
        if let Some(step) = inst.steps.iter_mut().flatten().find(|s| s.seq == seq) {
            step.earlier.push(a);
        }
    }
    // The learned timeouts of the last attempts (only `timeout: auto` steps have one).
    let learned = c.query(
        "SELECT seq, timeout_secs, timeout_basis FROM step_runs WHERE instance_id = ?1 AND timeout_secs IS NOT NULL",
        p![inst.id.as_str()],
    )?;
    for r in &learned {
        let seq: u32 = r.get(0)?;
        if let Some(step) = inst.steps.iter_mut().flatten().find(|s| s.seq == seq) {
            step.timeout = applied_timeout(r, 1)?;
        }
    }
    Ok(())
}

/// A learned timeout from columns `at` (seconds) and `at + 1` (basis).
fn applied_timeout(r: &Row, at: usize) -> Result<Option<AppliedTimeout>> {
    let secs: Option<f64> = r.get(at)?;
    Ok(secs
        .map(|secs| AppliedTimeout { secs, basis: r.get::<Option<String>>(at + 1).ok().flatten().unwrap_or_default() }))
}

pub(super) fn transitions(c: &dyn Db, id: &str) -> Result<Vec<Transition>> {
    c.query(
        "SELECT at, step_seq, from_state, to_state, reason, actor FROM transitions WHERE instance_id = ?1 ORDER BY id",
        p![id],
    )?
    .iter()
    .map(transition)
    .collect()
}

#[cfg(test)]
mod tests {
    /// The short path keeps exactly what the whole one would.
    #[test]
    fn a_reason_is_what_one_line_makes_of_it() {
        let long = "x".repeat(400);
        for text in
            ["", "claimed", "attempt 2", " lead", "trail ", "two  spaces", "a\nb", "tab\there", "nbsp\u{a0}x", &long]
        {
            assert_eq!(super::reason(text), apollo_shared::text::one_line(text, super::REASON_CHARS), "{text:?}");
        }
    }
}
