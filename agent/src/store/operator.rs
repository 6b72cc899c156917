//! The moves operators ask for: retry, skip, rollback, and the cancels of
//! instances no executor works on. Each checks the transition table through
//! the portable moves of `write` and runs in one transaction.

use super::db::Db;
use super::history::history;
use super::model::FailurePlan;
use super::rows::ts;
use super::value::p;
use super::write::{fail, move_step, move_task, step_fail, task_state};
use super::{Result, StoreError};
use apollo_shared::state::{check_step, check_task, StepState, TaskState};
use chrono::Utc;

/// An operator's retry of a FAILED instance: RETRYING now, with a fresh
/// retry budget for the failed step.
pub fn manual_retry(c: &dyn Db, id: &str, reason: &str, actor: &str) -> Result<()> {
    refuse_while_rolling_back(c, id)?;
    // Steps let through or skipped by hand are past: they never run again.
    let steps: Vec<(String, u32, String)> = c
        .query("SELECT name, seq, state FROM step_runs WHERE instance_id = ?1 AND passed = 0 ORDER BY seq", p![id])?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .collect::<Result<_>>()?;
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
    c.execute(
        "UPDATE task_instances SET next_run_at = ?2, finished_at = NULL, lease_owner = NULL, lease_expires_at = NULL WHERE id = ?1",
        p![id, ts(Utc::now())],
    )?;
    c.execute("UPDATE step_runs SET failures = 0 WHERE instance_id = ?1 AND state = 'FAILED'", p![id])?;
    Ok(())
}

/// An operator's skip of a FAILED instance's failed step: the step is
/// marked SKIPPED with who and why (it never runs again), and the instance
/// resumes from the next step as a retry would, in one transaction.
pub fn skip_step(c: &dyn Db, id: &str, seq: u32, reason: &str, actor: &str) -> Result<()> {
    refuse_while_rolling_back(c, id)?;
    let state = task_state(c, id)?;
    let step = c.driver().step_row(c, id, seq)?.state;
    if state != TaskState::Failed {
        return Err(StoreError::Invalid(format!(
            "instance {id} is {state}; only a FAILED instance's failed step can be skipped"
        )));
    }
    check_step(step, StepState::Skipped)
        .map_err(|e| StoreError::Invalid(format!("step #{seq} cannot be skipped: {e}")))?;
    check_task(state, TaskState::Retrying)?;
    move_step(c, id, seq, StepState::Skipped, &format!("skipped by hand: {reason}"), actor)?;
    c.execute("UPDATE step_runs SET passed = 1 WHERE instance_id = ?1 AND seq = ?2", p![id, seq])?;
    manual_retry(c, id, &format!("resumed after step #{seq} was skipped: {reason}"), actor)
}

/// An operator's rollback of a FAILED instance: held by this agent with the
/// rollback pending; the scheduler runs it.
/// `owner` is the agent that will run the rollback; `actor` the operator who asked.
pub fn manual_rollback(c: &dyn Db, id: &str, lease_secs: f64, reason: &str, owner: &str, actor: &str) -> Result<()> {
    refuse_while_rolling_back(c, id)?;
    let from = task_state(c, id)?;
    check_task(from, TaskState::RolledBack)?;
    c.execute(
        // Not finished while its rollback runs.
        "UPDATE task_instances SET rollback_pending = 1, finished_at = NULL, lease_owner = ?2, \
         lease_expires_at = apollo_now_plus(?3) WHERE id = ?1",
        p![id, owner, lease_secs],
    )?;
    history(
        c,
        id,
        None,
        Some(TaskState::Failed.as_str()),
        TaskState::Failed.as_str(),
        &format!("rollback requested: {reason}"),
        actor,
    )
}

fn refuse_while_rolling_back(c: &dyn Db, id: &str) -> Result<()> {
    let pending: Option<bool> = c.value("SELECT rollback_pending FROM task_instances WHERE id = ?1", p![id])?;
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
pub fn cancel_waiting(c: &dyn Db, id: &str, reason: &str, actor: &str) -> Result<()> {
    let from = task_state(c, id)?;
    if !matches!(from, TaskState::Pending | TaskState::Retrying) {
        return Err(StoreError::Invalid(format!(
            "instance {id} is {from}; only PENDING, RETRYING and RUNNING instances can be cancelled"
        )));
    }
    move_task(c, id, TaskState::Running, "cancel requested", actor)?;
    // A parked instance's approval is moot now.
    super::approvals::cancel(c, id, actor)?;
    c.execute("UPDATE task_instances SET approval = NULL, next_run_at = NULL WHERE id = ?1", p![id])?;
    fail(c, id, reason, FailurePlan::Stop, actor)
}

/// Cancels a RUNNING instance that no executor works on (its lease has run
/// out): its running step is marked failed as cancelled, the instance FAILED.
pub fn cancel_orphan(c: &dyn Db, id: &str, reason: &str, actor: &str) -> Result<()> {
    let expired: Option<bool> = c.value(
        "SELECT CASE WHEN lease_expires_at IS NULL OR lease_expires_at < apollo_now() THEN 1 ELSE 0 END \
         FROM task_instances WHERE id = ?1 AND state = 'RUNNING'",
        p![id],
    )?;
    if expired != Some(true) {
        return Err(StoreError::Invalid(format!("instance {id} is not RUNNING with an expired lease")));
    }
    let running: Vec<u32> =
        c.column("SELECT seq FROM step_runs WHERE instance_id = ?1 AND state = 'RUNNING'", p![id])?;
    for seq in running {
        step_fail(c, id, seq, &format!("cancelled: {reason}"), false, actor)?;
    }
    fail(c, id, reason, FailurePlan::Stop, actor)
}
