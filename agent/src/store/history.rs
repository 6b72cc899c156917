//! The portable half of every move: the transition table checked, the row
//! changed, the history row written. Both drivers and the portable writes
//! use these; a refused move changes nothing and says why.

use super::db::Db;
use super::model::{Also, Hist, StepRow};
use super::rows::ts;
use super::value::{p, V};
use super::{Result, StoreError};
use apollo_shared::state::{check_task, TaskState};
use chrono::Utc;

/// A history row: the move of the instance (`step` `None`) or of one step.
pub(super) fn history(
    c: &dyn Db,
    id: &str,
    step: Option<u32>,
    from: Option<&str>,
    to: &str,
    reason: &str,
    actor: &str,
) -> Result<()> {
    c.driver().history(c, &[Hist { id, step, from, to, reason, actor }])
}

/// History rows as PostgreSQL keeps them: numbered by the database, their
/// time as text.
pub(super) fn numbered_by_the_database(c: &dyn Db, rows: &[Hist]) -> Result<()> {
    let now = ts(Utc::now());
    for h in rows {
        c.execute(
            "INSERT INTO transitions (instance_id, step_seq, from_state, to_state, reason, actor, at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            p![h.id, h.step, h.from, h.to, super::rows::reason(h.reason), h.actor, now.as_str()],
        )?;
    }
    Ok(())
}

/// Moves an instance from `from` (read by the caller) to `to` after the
/// table allows it, changing `also` with it, with a history row.
pub(super) fn apply_task(
    c: &dyn Db,
    id: &str,
    from: TaskState,
    to: TaskState,
    reason: &str,
    actor: &str,
    also: &Also,
) -> Result<TaskState> {
    check_task(from, to)?;
    let mut params = vec![V::from(id), V::from(to.as_str()), V::from(ts(Utc::now()))];
    params.extend_from_slice(also.1);
    let update = c.driver().update_row();
    c.execute(
        &format!(
            "{update} task_instances SET state = ?2, updated_at = ?3{}{} WHERE id = ?1",
            if also.0.is_empty() { "" } else { ", " },
            also.0
        ),
        &params,
    )?;
    history(c, id, None, Some(from.as_str()), to.as_str(), reason, actor)?;
    Ok(from)
}

/// Why `agent` may not move the steps of instance `id`: it is in `state`,
/// held by `owner`.
pub(super) fn not_held(id: &str, state: &str, owner: Option<&str>, agent: &str) -> StoreError {
    StoreError::Invalid(format!(
        "instance {id} is {state}, held by {}; {agent} may not run its steps",
        owner.unwrap_or("nobody")
    ))
}

/// An instance's state, read by the driver's `sql` (`?1` the id).
pub(super) fn read_task_state(c: &dyn Db, sql: &str, id: &str) -> Result<TaskState> {
    let s: Option<String> = c.value(sql, p![id])?;
    parse_state(&s.ok_or_else(|| StoreError::NotFound(format!("no instance {id}")))?)
}

/// A step's row, read by the driver's `sql` (`?1` the id, `?2` the seq;
/// state, attempts, failures).
pub(super) fn read_step_row(c: &dyn Db, sql: &str, id: &str, seq: u32) -> Result<StepRow> {
    let r = c
        .query_opt(sql, p![id, seq])?
        .ok_or_else(|| StoreError::NotFound(format!("no step {seq} in instance {id}")))?;
    Ok(StepRow { state: parse_state(&r.get::<String>(0)?)?, attempts: r.get(1)?, failures: r.get(2)? })
}

/// A state as stored, parsed.
pub(super) fn parse_state<S: std::str::FromStr<Err = String>>(s: &str) -> Result<S> {
    s.parse().map_err(StoreError::Invalid)
}

/// A step's start: attempt, version, params, time.
pub(super) const STEP_RUNNING: &str =
    "UPDATE step_runs SET state = 'RUNNING', attempts = ?3, plugin_version = ?4, params = ?5, \
     started_at = ?6, finished_at = NULL, error = NULL WHERE instance_id = ?1 AND seq = ?2";
/// A step's SUCCESS: output, time.
pub(super) const STEP_SUCCESS: &str =
    "UPDATE step_runs SET state = 'SUCCESS', output = ?3, finished_at = ?4 WHERE instance_id = ?1 AND seq = ?2";
