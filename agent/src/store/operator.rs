//! The moves operators ask for: retry, skip, rollback, and the cancels of
//! instances no executor works on. Each checks the transition table through
//! the portable moves of `write` and runs in one transaction.

use super::db::Db;
use super::history::history;
use super::model::FailurePlan;
use super::value::p;
use super::write::{fail, move_step, move_task, step_fail, task_state};
use super::{Result, StoreError};
use apollo_shared::state::{check_step, check_task, StepState, TaskState};

/// An operator's retry of a FAILED instance: RETRYING now, with a fresh
/// retry budget for the failed step. Its retry time is left unset (it is
/// due at once): it had ended and released its locks, so it waits for them
/// like a new instance rather than holding them as a retry's backoff does
/// (see `locks`).
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
        "UPDATE task_instances SET next_run_at = NULL, finished_at = NULL, lease_owner = NULL, lease_expires_at = NULL \
         WHERE id = ?1",
        p![id],
    )?;
    c.execute("UPDATE step_runs SET failures = 0 WHERE instance_id = ?1 AND state = 'FAILED'", p![id])?;
    Ok(())
}

/// An operator's skip of a FAILED instance's failed step: the step is
/// marked SKIPPED with who and why (it never runs again), and the instance
/// resumes from the next step as a retry would, in one transaction. Only
/// the step it failed at (or was held at) can be skipped — its first step
/// not done, which is FAILED — and never an approval step, which its
/// approvers or its timeout decide: a skip is not a way past a denial.
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
    skippable(c, id, seq)?;
    check_task(state, TaskState::Retrying)?;
    move_step(c, id, seq, StepState::Skipped, &format!("skipped by hand: {reason}"), actor)?;
    c.execute("UPDATE step_runs SET passed = 1 WHERE instance_id = ?1 AND seq = ?2", p![id, seq])?;
    manual_retry(c, id, &format!("resumed after step #{seq} was skipped: {reason}"), actor)
}

/// Refuses a skip of step `seq` unless it is the instance's failed step —
/// its first step not done (not SUCCESS, not SKIPPED, not let through),
/// when that one is FAILED — and not an approval step (the plugin
/// `steps::is_approval` names), naming the step that can be skipped.
fn skippable(c: &dyn Db, id: &str, seq: u32) -> Result<()> {
    let steps: Vec<(u32, String, String, String, bool)> = c
        .query("SELECT seq, name, state, plugin, passed FROM step_runs WHERE instance_id = ?1 ORDER BY seq", p![id])?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .collect::<Result<_>>()?;
    let approval = |plugin: &str| plugin == "approval";
    let named = steps.iter().find(|s| s.0 == seq).map(|s| s.1.clone()).unwrap_or_else(|| format!("#{seq}"));
    let gate =
        |name: &str| format!("{name:?} is an approval: it is decided by its approvers or its timeout, not skipped");
    if steps.iter().any(|s| s.0 == seq && approval(&s.3)) {
        return Err(StoreError::Invalid(format!("step {}", gate(&named))));
    }
    // A fan-out whose approval between batches was denied (or timed out
    // denying) is not skipped past either.
    let asked: Vec<(Option<String>, String)> = c
        .query("SELECT decision, on_timeout FROM approvals WHERE instance_id = ?1 AND seq = ?2", p![id, seq])?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get(1)?)))
        .collect::<Result<_>>()?;
    let approved = |(d, t): &(Option<String>, String)| {
        d.as_deref() == Some("approved") || (d.as_deref() == Some("timed_out") && t == "approve")
    };
    if !asked.is_empty() && !asked.iter().any(approved) {
        return Err(StoreError::Invalid(format!(
            "step {named:?} was stopped by its approval between batches (approve_after_batch): it is decided by its \
             approvers or its timeout, not skipped; `apollo retry {id}` asks again"
        )));
    }
    let first = steps.iter().find(|s| !s.4 && s.2 != StepState::Success.as_str() && s.2 != StepState::Skipped.as_str());
    match first.filter(|s| s.2 == StepState::Failed.as_str()) {
        Some(f) if f.0 == seq => Ok(()),
        Some(f) if approval(&f.3) => {
            Err(StoreError::Invalid(format!("step {named:?} is not the failed step; the failed step {}", gate(&f.1))))
        }
        Some(f) => Err(StoreError::Invalid(format!(
            "step {named:?} is not the failed step; the step that can be skipped is {:?}",
            f.1
        ))),
        None => {
            Err(StoreError::Invalid(format!("step {named:?} is not the failed step; instance {id} has none to skip")))
        }
    }
}

/// An operator's skip of one item of a FAILED instance's failed fan-out
/// step: the item (FAILED, or never started) is SKIPPED — done by hand, it
/// never runs again and counts against no budget — with who and why, on
/// the item and in the step's history. The instance stays FAILED: a retry
/// runs the items left.
pub fn skip_item(c: &dyn Db, id: &str, seq: u32, idx: u32, reason: &str, actor: &str) -> Result<()> {
    refuse_while_rolling_back(c, id)?;
    let state = task_state(c, id)?;
    let step = c.driver().step_row(c, id, seq)?.state;
    if state != TaskState::Failed || step != StepState::Failed {
        return Err(StoreError::Invalid(format!(
            "instance {id} is {state} and its step {seq} {step}; only an item of a FAILED instance's failed step can be \
             skipped"
        )));
    }
    let from = super::items::item_state(c, id, seq, idx)?;
    check_step(from, StepState::Skipped)
        .map_err(|e| StoreError::Invalid(format!("item {idx} of step {seq} cannot be skipped: {e}")))?;
    let label: String = c
        .value("SELECT label FROM step_items WHERE instance_id = ?1 AND seq = ?2 AND idx = ?3", p![id, seq, idx])?
        .unwrap_or_default();
    let why = format!("skipped by hand: {reason}");
    c.execute(
        "UPDATE step_items SET state = 'SKIPPED', history = history || ?4 WHERE instance_id = ?1 AND seq = ?2 AND idx = ?3",
        p![id, seq, idx, super::items::line(from, StepState::Skipped, &format!("{why} ({actor})"))],
    )?;
    let note = format!("item {label} (#{idx}) {why}");
    history(c, id, Some(seq), Some(step.as_str()), step.as_str(), &note, actor)
}

/// An operator's rollback of a FAILED instance, or of a SUCCESS one (the
/// server has checked that each of its steps can be undone): held by this
/// agent with the rollback pending; the scheduler runs it.
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
    history(c, id, None, Some(from.as_str()), from.as_str(), &format!("rollback requested: {reason}"), actor)
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
/// stood, as after a cancel of a running instance — but for a fan-out step
/// parked at its gate (RUNNING while its instance waits), which fails as
/// cancelled, its items' ledger kept.
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
    fail_running_steps(c, id, reason, actor)?;
    fail(c, id, reason, FailurePlan::Stop, actor)
}

/// Marks the instance's RUNNING steps failed as cancelled.
fn fail_running_steps(c: &dyn Db, id: &str, reason: &str, actor: &str) -> Result<()> {
    let running: Vec<u32> =
        c.column("SELECT seq FROM step_runs WHERE instance_id = ?1 AND state = 'RUNNING'", p![id])?;
    for seq in running {
        step_fail(c, id, seq, &format!("cancelled: {reason}"), false, actor)?;
    }
    Ok(())
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
    fail_running_steps(c, id, reason, actor)?;
    fail(c, id, reason, FailurePlan::Stop, actor)
}
