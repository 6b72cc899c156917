//! The SQL of every write. Each function runs inside the writer's batch
//! transaction (in its own savepoint) and checks the transition table before
//! it changes a state.

use super::rows::ts;
use super::{Result, StoreError};
use apollo_shared::protocol::Instance;
use apollo_shared::state::{check_step, check_task, StepState, TaskState};
use chrono::{DateTime, Utc};
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{Map, Value};

/// What a trigger asks the store to create.
#[derive(Debug, Clone)]
pub struct NewInstance {
    pub id: String,
    pub task: String,
    pub def_hash: String,
    pub queue: String,
    pub priority: u8,
    pub max_active: Option<u32>,
    pub params: Map<String, Value>,
    /// The initial context (trace id, params, work dir, event).
    pub context: Value,
    pub trace_id: String,
    pub trigger: String,
    pub dedup_key: Option<String>,
    /// (name, plugin) of each step, in order.
    pub steps: Vec<(String, String)>,
    /// Sum of the steps' timeouts, for the zombie reaper.
    pub expected_secs: f64,
}

/// What follows a failure that ended an attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FailurePlan {
    /// Wait in RETRYING until this time.
    Retry(DateTime<Utc>),
    /// Stay FAILED and held while the rollback runs.
    Rollback,
    /// Stay FAILED for an operator (on_failure: stop, cancel).
    Stop,
}

/// An instance a claim or a recovery handed to this agent, with its steps.
pub type Claimed = Instance;

pub(super) fn history(
    c: &Connection,
    id: &str,
    step: Option<u32>,
    from: Option<&str>,
    to: &str,
    reason: &str,
    actor: &str,
) -> Result<()> {
    c.prepare_cached(
        "INSERT INTO transitions (instance_id, step_seq, from_state, to_state, reason, actor, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![id, step, from, to, reason, actor, ts(Utc::now())])?;
    Ok(())
}

pub(super) fn task_state(c: &Connection, id: &str) -> Result<TaskState> {
    let s: Option<String> =
        c.prepare_cached("SELECT state FROM task_instances WHERE id = ?1")?.query_row([id], |r| r.get(0)).optional()?;
    let s = s.ok_or_else(|| StoreError::NotFound(format!("no instance {id}")))?;
    s.parse().map_err(StoreError::Invalid)
}

/// Moves an instance to `to` after the table allows it, with a history row.
pub(super) fn move_task(c: &Connection, id: &str, to: TaskState, reason: &str, actor: &str) -> Result<TaskState> {
    let from = task_state(c, id)?;
    check_task(from, to)?;
    c.prepare_cached("UPDATE task_instances SET state = ?2, updated_at = ?3 WHERE id = ?1")?.execute(params![
        id,
        to.as_str(),
        ts(Utc::now())
    ])?;
    history(c, id, None, Some(from.as_str()), to.as_str(), reason, actor)?;
    Ok(from)
}

fn step_state(c: &Connection, id: &str, seq: u32) -> Result<StepState> {
    let s: Option<String> = c
        .prepare_cached("SELECT state FROM step_runs WHERE instance_id = ?1 AND seq = ?2")?
        .query_row(params![id, seq], |r| r.get(0))
        .optional()?;
    let s = s.ok_or_else(|| StoreError::NotFound(format!("no step {seq} in instance {id}")))?;
    s.parse().map_err(StoreError::Invalid)
}

/// Moves a step to `to` after the table allows it, with a history row.
pub(super) fn move_step(
    c: &Connection,
    id: &str,
    seq: u32,
    to: StepState,
    reason: &str,
    actor: &str,
) -> Result<StepState> {
    let from = step_state(c, id, seq)?;
    check_step(from, to)?;
    c.prepare_cached("UPDATE step_runs SET state = ?3 WHERE instance_id = ?1 AND seq = ?2")?.execute(params![
        id,
        seq,
        to.as_str()
    ])?;
    history(c, id, Some(seq), Some(from.as_str()), to.as_str(), reason, actor)?;
    Ok(from)
}

pub fn put_def(c: &Connection, hash: &str, task: &str, file: &str, source: &str) -> Result<()> {
    c.prepare_cached(
        "INSERT OR IGNORE INTO task_defs (hash, task, file, source, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![hash, task, file, source, ts(Utc::now())])?;
    Ok(())
}

/// Creates a PENDING instance and its PENDING step rows. With a dedup key
/// that exists already, returns the existing instance's id and `false`.
pub fn create(c: &Connection, n: &NewInstance, actor: &str) -> Result<(String, bool)> {
    if let Some(key) = &n.dedup_key {
        // The key of an archived instance still refuses a duplicate.
        let existing: Option<String> = c
            .prepare_cached(
                "SELECT id FROM task_instances WHERE dedup_key = ?1 UNION ALL SELECT id FROM archive WHERE dedup_key = ?1",
            )?
            .query_row([key], |r| r.get(0))
            .optional()?;
        if let Some(id) = existing {
            return Ok((id, false));
        }
    }
    let now = ts(Utc::now());
    c.prepare_cached(
        "INSERT INTO task_instances (id, task, def_hash, queue, priority, max_active, state, attempt, params, context, \
         trace_id, trigger, dedup_key, expected_secs, created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'PENDING', 1, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?13)",
    )?
    .execute(params![
        n.id,
        n.task,
        n.def_hash,
        n.queue,
        n.priority,
        n.max_active,
        Value::Object(n.params.clone()).to_string(),
        n.context.to_string(),
        n.trace_id,
        n.trigger,
        n.dedup_key,
        n.expected_secs,
        now
    ])?;
    let mut ins = c.prepare_cached(
        "INSERT INTO step_runs (instance_id, seq, name, plugin, state) VALUES (?1, ?2, ?3, ?4, 'PENDING')",
    )?;
    for (seq, (name, plugin)) in n.steps.iter().enumerate() {
        ins.execute(params![n.id, seq as u32, name, plugin])?;
    }
    history(c, &n.id, None, None, "PENDING", &format!("created by {}", n.trigger), actor)?;
    Ok((n.id.clone(), true))
}

/// Refuses a step write on an instance this agent does not hold RUNNING:
/// an executor whose instance was taken from it (cancelled, failed, taken
/// over) must stop rather than move its steps.
fn ensure_held(c: &Connection, id: &str, agent: &str) -> Result<()> {
    let row: Option<(String, Option<String>)> = c
        .prepare_cached("SELECT state, lease_owner FROM task_instances WHERE id = ?1")?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match row {
        None => Err(StoreError::NotFound(format!("no instance {id}"))),
        Some((state, owner)) if state == "RUNNING" && owner.as_deref() == Some(agent) => Ok(()),
        Some((state, owner)) => Err(StoreError::Invalid(format!(
            "instance {id} is {state}, held by {}; {agent} may not run its steps",
            owner.as_deref().unwrap_or("nobody")
        ))),
    }
}

pub fn step_start(c: &Connection, id: &str, seq: u32, version: &str, params_json: &str, actor: &str) -> Result<u32> {
    ensure_held(c, id, actor)?;
    let attempt: u32 =
        c.query_row("SELECT attempts FROM step_runs WHERE instance_id = ?1 AND seq = ?2", params![id, seq], |r| {
            r.get::<_, u32>(0)
        })? + 1;
    move_step(c, id, seq, StepState::Running, &format!("attempt {attempt}"), actor)?;
    c.prepare_cached(
        "UPDATE step_runs SET attempts = ?3, plugin_version = ?4, params = ?5, started_at = ?6, finished_at = NULL, error = NULL \
         WHERE instance_id = ?1 AND seq = ?2",
    )?
    .execute(params![id, seq, attempt, version, params_json, ts(Utc::now())])?;
    Ok(attempt)
}

/// Records a step's SUCCESS, its output and the new context together.
pub fn step_success(c: &Connection, id: &str, seq: u32, output: &str, context: &str, actor: &str) -> Result<()> {
    ensure_held(c, id, actor)?;
    move_step(c, id, seq, StepState::Success, "succeeded", actor)?;
    let now = ts(Utc::now());
    c.prepare_cached("UPDATE step_runs SET output = ?3, finished_at = ?4 WHERE instance_id = ?1 AND seq = ?2")?
        .execute(params![id, seq, output, now])?;
    c.prepare_cached("UPDATE task_instances SET context = ?2, updated_at = ?3 WHERE id = ?1")?
        .execute(params![id, context, now])?;
    Ok(())
}

/// Records a failed attempt; `counts` is false when the attempt was
/// interrupted (agent restart) rather than failed by the plugin.
pub fn step_fail(c: &Connection, id: &str, seq: u32, error: &str, counts: bool, actor: &str) -> Result<u32> {
    move_step(c, id, seq, StepState::Failed, error, actor)?;
    c.prepare_cached(
        "UPDATE step_runs SET error = ?3, finished_at = ?4, failures = failures + ?5 WHERE instance_id = ?1 AND seq = ?2",
    )?
    .execute(params![id, seq, error, ts(Utc::now()), counts as i64])?;
    Ok(c.query_row("SELECT failures FROM step_runs WHERE instance_id = ?1 AND seq = ?2", params![id, seq], |r| {
        r.get(0)
    })?)
}

/// What a failed attempt leads to, decided inside the transaction that
/// records it from the step's failure count after this one.
pub type Decide = Box<dyn FnOnce(u32) -> (FailurePlan, String) + Send>;

/// Records a failed attempt and the instance's FAILED (and RETRYING, or the
/// pending rollback) in one transaction: a crash can never leave the step
/// failed with the instance still RUNNING. Returns the failure count and the
/// plan taken.
pub fn fail_step(
    c: &Connection,
    id: &str,
    seq: u32,
    error: &str,
    counts: bool,
    decide: Decide,
    actor: &str,
) -> Result<(u32, FailurePlan)> {
    let failures = step_fail(c, id, seq, error, counts, actor)?;
    let (plan, message) = decide(failures);
    fail(c, id, &message, plan, actor)?;
    Ok((failures, plan))
}

pub fn finish_success(c: &Connection, id: &str, actor: &str) -> Result<()> {
    move_task(c, id, TaskState::Success, "all steps succeeded", actor)?;
    c.prepare_cached(
        "UPDATE task_instances SET finished_at = ?2, error = NULL, lease_owner = NULL, lease_expires_at = NULL WHERE id = ?1",
    )?
    .execute(params![id, ts(Utc::now())])?;
    Ok(())
}

/// RUNNING → FAILED, then what the plan says.
pub fn fail(c: &Connection, id: &str, error: &str, plan: FailurePlan, actor: &str) -> Result<()> {
    move_task(c, id, TaskState::Failed, error, actor)?;
    c.prepare_cached("UPDATE task_instances SET error = ?2 WHERE id = ?1")?.execute(params![id, error])?;
    match plan {
        FailurePlan::Retry(at) => {
            let wait = (at - Utc::now()).num_milliseconds().max(0) as f64 / 1000.0;
            move_task(c, id, TaskState::Retrying, &format!("retry in {wait:.1}s"), actor)?;
            c.prepare_cached(
                "UPDATE task_instances SET next_run_at = ?2, lease_owner = NULL, lease_expires_at = NULL WHERE id = ?1",
            )?
            .execute(params![id, ts(at)])?;
        }
        FailurePlan::Rollback => {
            c.prepare_cached("UPDATE task_instances SET rollback_pending = 1 WHERE id = ?1")?.execute([id])?;
        }
        FailurePlan::Stop => release(c, id)?,
    }
    Ok(())
}

fn release(c: &Connection, id: &str) -> Result<()> {
    c.prepare_cached(
        "UPDATE task_instances SET finished_at = ?2, lease_owner = NULL, lease_expires_at = NULL, rollback_pending = 0 WHERE id = ?1",
    )?
    .execute(params![id, ts(Utc::now())])?;
    Ok(())
}

pub fn step_rolled_back(c: &Connection, id: &str, seq: u32, actor: &str) -> Result<()> {
    move_step(c, id, seq, StepState::RolledBack, "rolled back", actor)?;
    Ok(())
}

pub fn step_note_error(c: &Connection, id: &str, seq: u32, error: &str) -> Result<()> {
    c.prepare_cached("UPDATE step_runs SET error = ?3 WHERE instance_id = ?1 AND seq = ?2")?
        .execute(params![id, seq, error])?;
    Ok(())
}

fn skip_pending_steps(c: &Connection, id: &str, actor: &str) -> Result<()> {
    let pending: Vec<u32> = c
        .prepare_cached("SELECT seq FROM step_runs WHERE instance_id = ?1 AND state = 'PENDING' ORDER BY seq")?
        .query_map([id], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for seq in pending {
        move_step(c, id, seq, StepState::Skipped, "instance ended before this step", actor)?;
    }
    Ok(())
}

pub fn finish_rolled_back(c: &Connection, id: &str, actor: &str) -> Result<()> {
    skip_pending_steps(c, id, actor)?;
    move_task(c, id, TaskState::RolledBack, "rollback completed", actor)?;
    release(c, id)
}

pub fn rollback_failed(c: &Connection, id: &str, error: &str, actor: &str) -> Result<()> {
    release(c, id)?;
    c.prepare_cached("UPDATE task_instances SET error = ?2 WHERE id = ?1")?.execute(params![id, error])?;
    history(c, id, None, Some("FAILED"), "FAILED", error, actor)?;
    super::records::insert_alert(c, "rollback_failed", error, Some(id))
}

/// An operator's retry of a FAILED instance: RETRYING now, with a fresh
/// retry budget for the failed step.
pub fn manual_retry(c: &Connection, id: &str, reason: &str, actor: &str) -> Result<()> {
    refuse_while_rolling_back(c, id)?;
    let steps: Vec<(String, u32, String)> = c
        .prepare_cached("SELECT name, seq, state FROM step_runs WHERE instance_id = ?1 ORDER BY seq")?
        .query_map([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let states: Vec<(&str, u32, StepState)> = steps
        .iter()
        .map(|(n, seq, st)| st.parse().map(|st| (n.as_str(), *seq, st)).map_err(StoreError::Invalid))
        .collect::<Result<_>>()?;
    let state = task_state(c, id)?;
    if state == TaskState::Failed {
        apollo_shared::state::check_resume(states)
            .map_err(|e| StoreError::Invalid(format!("instance {id} cannot be retried: {e}")))?;
    }
    move_task(c, id, TaskState::Retrying, reason, actor)?;
    c.prepare_cached(
        "UPDATE task_instances SET next_run_at = ?2, finished_at = NULL, lease_owner = NULL, lease_expires_at = NULL WHERE id = ?1",
    )?
    .execute(params![id, ts(Utc::now())])?;
    c.prepare_cached("UPDATE step_runs SET failures = 0 WHERE instance_id = ?1 AND state = 'FAILED'")?.execute([id])?;
    Ok(())
}

/// An operator's rollback of a FAILED instance: held by this agent with the
/// rollback pending; the scheduler runs it.
/// `owner` is the agent that will run the rollback; `actor` the operator who asked.
pub fn manual_rollback(
    c: &Connection,
    id: &str,
    lease_until: DateTime<Utc>,
    reason: &str,
    owner: &str,
    actor: &str,
) -> Result<()> {
    refuse_while_rolling_back(c, id)?;
    let from = task_state(c, id)?;
    check_task(from, TaskState::RolledBack)?;
    c.prepare_cached(
        // Not finished while its rollback runs.
        "UPDATE task_instances SET rollback_pending = 1, finished_at = NULL, lease_owner = ?2, lease_expires_at = ?3 WHERE id = ?1",
    )?
    .execute(params![id, owner, ts(lease_until)])?;
    history(c, id, None, Some("FAILED"), "FAILED", &format!("rollback requested: {reason}"), actor)
}

fn refuse_while_rolling_back(c: &Connection, id: &str) -> Result<()> {
    let pending: Option<bool> =
        c.query_row("SELECT rollback_pending FROM task_instances WHERE id = ?1", [id], |r| r.get(0)).optional()?;
    match pending {
        None => Err(StoreError::NotFound(format!("no instance {id}"))),
        Some(true) => Err(StoreError::Invalid(format!("instance {id} is being rolled back; wait for it to finish"))),
        Some(false) => Ok(()),
    }
}

/// Cancels an instance that is waiting (PENDING or RETRYING): it passes
/// through RUNNING to FAILED, as the table requires, without running a step.
/// Its steps keep their states, so an operator's retry resumes it where it
/// stood, as after a cancel of a running instance.
pub fn cancel_waiting(c: &Connection, id: &str, reason: &str, actor: &str) -> Result<()> {
    let from = task_state(c, id)?;
    if !matches!(from, TaskState::Pending | TaskState::Retrying) {
        return Err(StoreError::Invalid(format!(
            "instance {id} is {from}; only PENDING, RETRYING and RUNNING instances can be cancelled"
        )));
    }
    move_task(c, id, TaskState::Running, "cancel requested", actor)?;
    fail(c, id, reason, FailurePlan::Stop, actor)
}

/// Cancels a RUNNING instance that no executor works on (its lease has run
/// out): its running step is marked failed as cancelled, the instance FAILED.
pub fn cancel_orphan(c: &Connection, id: &str, reason: &str, actor: &str) -> Result<()> {
    let expired: Option<bool> = c
        .query_row(
            "SELECT lease_expires_at IS NULL OR lease_expires_at < ?2 FROM task_instances WHERE id = ?1 AND state = 'RUNNING'",
            params![id, ts(Utc::now())],
            |r| r.get(0),
        )
        .optional()?;
    if expired != Some(true) {
        return Err(StoreError::Invalid(format!("instance {id} is not RUNNING with an expired lease")));
    }
    let running: Vec<u32> = c
        .prepare_cached("SELECT seq FROM step_runs WHERE instance_id = ?1 AND state = 'RUNNING'")?
        .query_map([id], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for seq in running {
        step_fail(c, id, seq, &format!("cancelled: {reason}"), false, actor)?;
    }
    fail(c, id, reason, FailurePlan::Stop, actor)
}
