//! Approval steps' requests and decisions. An instance reaching an approval
//! step is parked — RUNNING → PENDING, no lease, not runnable — in the same
//! write that records the request (one request per instance, step and
//! attempt); a decision (or the timeout) makes it runnable again, and the
//! claim that takes it runs the step, which reads the decision here. So it
//! holds no slot and no process while it waits, a restart or a takeover
//! finds the request and the decision where they were, and nobody is asked
//! twice.

use super::db::Db;
use super::history::history;
use super::model::Also;
use super::value::{p, Row};
use super::write::move_task_from;
use super::{Result, StoreError};
use apollo_shared::protocol::Approval;
use apollo_shared::state::TaskState;

const COLS: &str = "id, instance_id, task, step, seq, attempt, message, approvers, requested_by, distinct_approver, \
    requested_at, deadline, on_timeout, decision, decided_by, decided_at, reason";

/// A parked instance's `next_run_at`: after any time a claim compares it with.
pub(super) const PARKED: &str = "9999-12-31T00:00:00.000000Z";

fn approval(r: &Row) -> Result<Approval> {
    let approvers: String = r.get(7)?;
    Ok(Approval {
        id: r.get(0)?,
        instance: r.get(1)?,
        task: r.get(2)?,
        step: r.get(3)?,
        seq: r.get(4)?,
        message: r.get(6)?,
        approvers: serde_json::from_str(&approvers).unwrap_or_default(),
        requested_by: r.get(8)?,
        distinct_approver: r.get(9)?,
        requested_at: r.get(10)?,
        deadline: r.get(11)?,
        on_timeout: r.get(12)?,
        decision: r.get(13)?,
        decided_by: r.get(14)?,
        decided_at: r.get(15)?,
        reason: r.get(16)?,
    })
}

/// The request of step `seq` of the instance's attempt, if made.
pub fn for_step(c: &dyn Db, instance: &str, seq: u32, attempt: u32) -> Result<Option<Approval>> {
    let row = c.query_opt(
        &format!("SELECT {COLS} FROM approvals WHERE instance_id = ?1 AND seq = ?2 AND attempt = ?3"),
        p![instance, seq, attempt],
    )?;
    row.as_ref().map(approval).transpose()
}

/// Who triggered the instance (its first history row's actor).
pub fn requested_by(c: &dyn Db, instance: &str) -> Result<String> {
    let actor: Option<String> = c.value(
        "SELECT actor FROM transitions WHERE instance_id = ?1 AND step_seq IS NULL AND from_state IS NULL \
         ORDER BY at LIMIT 1",
        p![instance],
    )?;
    Ok(actor.unwrap_or_default())
}

/// Records the request (its time the store's clock) and parks the RUNNING
/// instance on it; `None` when one was made already for this attempt (the
/// instance is parked on it again, and nobody is asked twice).
pub fn park(c: &dyn Db, a: &Approval, attempt: u32, agent: &str) -> Result<Option<Approval>> {
    let inserted = c.execute(
        &format!(
            "INSERT INTO approvals ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, apollo_now(), ?11, ?12, \
             NULL, NULL, NULL, NULL) ON CONFLICT DO NOTHING"
        ),
        p![
            a.id.as_str(),
            a.instance.as_str(),
            a.task.as_str(),
            a.step.as_str(),
            a.seq,
            attempt,
            a.message.as_str(),
            serde_json::to_string(&a.approvers).unwrap_or_default(),
            a.requested_by.as_str(),
            a.distinct_approver,
            a.deadline.as_deref(),
            a.on_timeout.as_str()
        ],
    )?;
    let stored = for_step(c, &a.instance, a.seq, attempt)?
        .ok_or_else(|| StoreError::NotFound(format!("approval of {} step {}", a.instance, a.seq)))?;
    if stored.decision.is_some() {
        // Decided already (a decision landed between the read and this
        // write): the instance goes on as it is.
        return Ok(None);
    }
    let reason = format!("parked: {}", stored.waiting_line());
    let also = "lease_owner = NULL, lease_expires_at = NULL, next_run_at = ?4, waiting = ?5, approval = ?6";
    let waiting = stored.waiting_line();
    let params = p![PARKED, waiting.as_str(), stored.id.as_str()];
    move_task_from(
        c,
        &a.instance,
        Some(TaskState::Running),
        TaskState::Pending,
        &reason,
        agent,
        Also(also, &params[..]),
    )?;
    Ok((inserted > 0).then_some(stored))
}

/// The request the instance waits on, if any.
pub fn open_for(c: &dyn Db, instance: &str) -> Result<Option<Approval>> {
    let row = c.query_opt(
        &format!("SELECT {COLS} FROM approvals WHERE instance_id = ?1 AND decision IS NULL ORDER BY requested_at DESC LIMIT 1"),
        p![instance],
    )?;
    row.as_ref().map(approval).transpose()
}

/// Decides `a` (once: a second decision is refused, naming the first) and
/// makes its instance runnable again.
pub fn decide(c: &dyn Db, a: &Approval, decision: &str, reason: &str, actor: &str) -> Result<Approval> {
    let moved = c.execute(
        "UPDATE approvals SET decision = ?2, decided_by = ?3, decided_at = apollo_now(), reason = ?4 \
         WHERE id = ?1 AND decision IS NULL",
        p![a.id.as_str(), decision, actor, reason],
    )?;
    let row = c.query_opt(&format!("SELECT {COLS} FROM approvals WHERE id = ?1"), p![a.id.as_str()])?;
    let now =
        row.as_ref().map(approval).transpose()?.ok_or_else(|| StoreError::NotFound(format!("approval {}", a.id)))?;
    if moved == 0 {
        return Err(StoreError::Invalid(format!(
            "the approval of step {} of {} was {} already by {} at {}",
            a.step,
            a.instance,
            now.decision.as_deref().unwrap_or("decided"),
            now.decided_by.as_deref().unwrap_or("?"),
            now.decided_at.as_deref().unwrap_or("?")
        )));
    }
    c.execute(
        "UPDATE task_instances SET next_run_at = NULL, waiting = NULL WHERE id = ?1 AND approval = ?2 AND state = 'PENDING'",
        p![a.instance.as_str(), a.id.as_str()],
    )?;
    let what = format!("step {} {decision}: {reason}", a.step);
    history(c, &a.instance, Some(a.seq), Some("PENDING"), "PENDING", &what, actor)?;
    Ok(now)
}

/// Decides every request whose deadline passed as its `on_timeout` says
/// (`timed_out`: the step reads which); returns them.
pub fn expire(c: &dyn Db) -> Result<Vec<Approval>> {
    let due: Vec<Approval> = c
        .query(
            &format!(
                "SELECT {COLS} FROM approvals INDEXED BY approvals_open WHERE decision IS NULL \
                 AND deadline IS NOT NULL AND deadline <= apollo_now()"
            ),
            &[],
        )?
        .iter()
        .map(approval)
        .collect::<Result<_>>()?;
    let mut out = Vec::new();
    for a in due {
        let why = format!("no decision by {} (on_timeout: {})", a.deadline.as_deref().unwrap_or("?"), a.on_timeout);
        if let Ok(done) = decide(c, &a, "timed_out", &why, "timeout") {
            out.push(done);
        }
    }
    Ok(out)
}

/// Closes the instance's open request (it was cancelled).
pub fn cancel(c: &dyn Db, instance: &str, actor: &str) -> Result<()> {
    c.execute(
        "UPDATE approvals SET decision = 'cancelled', decided_by = ?2, decided_at = apollo_now(), reason = 'instance cancelled' \
         WHERE instance_id = ?1 AND decision IS NULL",
        p![instance, actor],
    )?;
    Ok(())
}

/// The requests waiting, oldest first, then the latest decided.
pub fn list(c: &dyn Db, limit: u32) -> Result<Vec<Approval>> {
    let mut out: Vec<Approval> = c
        .query(&format!("SELECT {COLS} FROM approvals WHERE decision IS NULL ORDER BY requested_at, id"), &[])?
        .iter()
        .map(approval)
        .collect::<Result<_>>()?;
    let decided = c.query(
        &format!("SELECT {COLS} FROM approvals WHERE decision IS NOT NULL ORDER BY decided_at DESC, id DESC LIMIT ?1"),
        p![limit],
    )?;
    for r in &decided {
        out.push(approval(r)?);
    }
    Ok(out)
}
