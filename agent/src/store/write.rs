//! Every write, portable: each runs inside the writer's batch transaction
//! (and may run twice: see [`super::writer`]), checks the transition table
//! before it changes a state, and asks the backend's driver
//! ([`super::db::Driver`]) for what differs — the locking reads, and the
//! moves it makes in one statement.

use super::db::Db;
use super::history::{apply_task, history, STEP_RUNNING, STEP_SUCCESS};
use super::model::{After, Also, FailurePlan, NewInstance, StepRow, StepStart, Success, TaskMove, ONLY};
use super::rows::ts;
use super::value::{p, V};
use super::{Result, StoreError};
use apollo_shared::state::{check_step, StepState, TaskState};
use chrono::Utc;
use serde_json::Value;

/// Moves an instance to `to` after the table allows it, with a history row.
pub(super) fn move_task(c: &dyn Db, id: &str, to: TaskState, reason: &str, actor: &str) -> Result<TaskState> {
    move_task_and(c, id, to, reason, actor, ONLY)
}

/// As [`move_task`], changing `also` with it (one statement, not two).
pub(super) fn move_task_and(
    c: &dyn Db,
    id: &str,
    to: TaskState,
    reason: &str,
    actor: &str,
    also: Also,
) -> Result<TaskState> {
    move_task_from(c, id, None, to, reason, actor, also)
}

/// [`move_task_and`]; `known`, the state this transaction has read already,
/// saves reading it again where the driver can trust it (SQLite's one
/// writer holds the database; PostgreSQL reads and locks the row as it
/// moves it).
pub(super) fn move_task_from(
    c: &dyn Db,
    id: &str,
    known: Option<TaskState>,
    to: TaskState,
    reason: &str,
    actor: &str,
    also: Also,
) -> Result<TaskState> {
    let d = c.driver();
    let m = TaskMove { id, to, reason, actor, also };
    if let Some(from) = d.move_task(c, &m)? {
        return Ok(from);
    }
    let from = d.state_before_move(c, id, known)?;
    apply_task(c, id, from, to, reason, actor, &m.also)
}

/// An instance's state, locked for the move about to be made.
pub(super) fn task_state(c: &dyn Db, id: &str) -> Result<TaskState> {
    c.driver().task_state(c, id)
}

/// Moves a step to `to` after the table allows it, with a history row.
pub(super) fn move_step(c: &dyn Db, id: &str, seq: u32, to: StepState, reason: &str, actor: &str) -> Result<StepState> {
    let from = c.driver().step_row(c, id, seq)?.state;
    check_step(from, to)?;
    c.execute("UPDATE step_runs SET state = ?3 WHERE instance_id = ?1 AND seq = ?2", p![id, seq, to.as_str()])?;
    history(c, id, Some(seq), Some(from.as_str()), to.as_str(), reason, actor)?;
    Ok(from)
}

pub fn put_def(c: &dyn Db, hash: &str, task: &str, file: &str, source: &str) -> Result<()> {
    c.execute(
        "INSERT INTO task_defs (hash, task, file, source, created_at) VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
        p![hash, task, file, source, ts(Utc::now())],
    )?;
    Ok(())
}

/// Creates a PENDING instance and its PENDING step rows. With a dedup key
/// that exists already, returns the existing instance's id and `false`.
/// `at` is its `created_at` (as `NewInstance::as_made` has it).
pub fn create(c: &dyn Db, n: &NewInstance, actor: &str, at: chrono::DateTime<Utc>) -> Result<(String, bool)> {
    if let Some(key) = &n.dedup_key {
        // The key of an archived instance still refuses a duplicate.
        let existing: Option<String> = c.value(
            "SELECT id FROM task_instances WHERE dedup_key = ?1 UNION ALL SELECT id FROM archive WHERE dedup_key = ?1",
            p![key],
        )?;
        if let Some(id) = existing {
            return Ok((id, false));
        }
    }
    if c.driver().create(c, n, actor)? {
        return Ok((n.id.clone(), true));
    }
    let now = ts(at);
    // Another agent may be creating the same key at this moment: the loser
    // of that race inserts nothing and answers with the winner's id.
    let inserted = c.execute(
        "INSERT INTO task_instances (id, task, def_hash, queue, priority, max_active, state, attempt, params, context, \
         trace_id, trigger, dedup_key, expected_secs, created_at, updated_at, pins, locks) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'PENDING', 1, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?13, ?14, ?15) ON CONFLICT DO NOTHING",
        p![
        n.id.as_str(),
        n.task.as_str(),
        n.def_hash.as_str(),
        n.queue.as_str(),
        n.priority,
        n.max_active,
        Value::Object(n.params.clone()).to_string(),
        n.context.to_string(),
        n.trace_id.as_str(),
        n.trigger.as_str(),
        n.dedup_key.as_deref(),
        n.expected_secs,
        now.as_str(),
        n.pins_json().as_deref(),
        n.locks_json().as_deref()
        ],
    )?;
    if inserted == 0 {
        let winner: Option<String> = match &n.dedup_key {
            Some(key) => c.value("SELECT id FROM task_instances WHERE dedup_key = ?1", p![key])?,
            None => None,
        };
        return match winner {
            Some(id) => Ok((id, false)),
            None => Err(StoreError::Invalid(format!("instance {} exists already", n.id))),
        };
    }
    // Every step row in one statement.
    let mut sql = String::from("INSERT INTO step_runs (instance_id, seq, name, plugin, state) VALUES ");
    let mut params = vec![V::from(n.id.as_str())];
    for (seq, (name, plugin)) in n.steps.iter().enumerate() {
        let k = params.len();
        sql.push_str(&format!(
            "{}(?1, ?{}, ?{}, ?{}, 'PENDING')",
            if seq > 0 { ", " } else { "" },
            k + 1,
            k + 2,
            k + 3
        ));
        params.extend([V::from(seq as u32), V::from(name), V::from(plugin)]);
    }
    if !n.steps.is_empty() {
        c.execute(&sql, &params)?;
    }
    // The trigger names who made it; the row's actor says so already.
    let how = n.trigger.strip_suffix(&format!(" by {actor}")).unwrap_or(&n.trigger);
    history(c, &n.id, None, None, TaskState::Pending.as_str(), &format!("created by {how}"), actor)?;
    Ok((n.id.clone(), true))
}

/// A step's state and attempts as this transaction read them with its
/// instance's claim (see [`step_start_known`]).
pub type Known = Option<(StepState, u32)>;

/// The step `seq` of an instance as its claim read it.
pub fn known_step(i: &super::model::Claimed, seq: u32) -> Known {
    i.steps.as_ref()?.iter().find(|s| s.seq == seq).map(|s| (s.state, s.attempts))
}

/// Starts a step of an instance `actor` holds: its attempt.
pub fn step_start(c: &dyn Db, s: StepStart, actor: &str) -> Result<u32> {
    step_start_known(c, s, None, actor)
}

/// [`step_start`]; `known`, the step as this transaction read it after
/// claiming its instance, saves reading the instance and the step again
/// where nothing else can have moved them (SQLite's one writer).
pub fn step_start_known(c: &dyn Db, s: StepStart, known: Known, actor: &str) -> Result<u32> {
    if let Some(attempt) = c.driver().step_starts(c, &[s], actor)?.pop().flatten() {
        return Ok(attempt);
    }
    let StepStart { id, seq, version, params } = s;
    let (from, attempts) = match known.filter(|_| !c.driver().shared()) {
        Some(k) => k,
        None => {
            let row = c.driver().held_step(c, id, seq, actor)?;
            (row.state, row.attempts)
        }
    };
    check_step(from, StepState::Running)?;
    let attempt = attempts + 1;
    c.execute(STEP_RUNNING, p![id, seq, attempt, version, params, ts(Utc::now())])?;
    history(c, id, Some(seq), Some(from.as_str()), StepState::Running.as_str(), &format!("attempt {attempt}"), actor)?;
    Ok(attempt)
}

/// Several steps' starts, as [`step_start_known`] each (a driver may make
/// them in one statement); the outcome of each. A start the driver's
/// statement did not make runs alone after, to say why.
pub fn step_starts(c: &dyn Db, starts: &[StepStart], known: &[Known], actor: &str) -> Result<Vec<Result<u32>>> {
    let fast = match starts.is_empty() {
        true => Vec::new(),
        false => c.driver().step_starts(c, starts, actor)?,
    };
    Ok(fast
        .into_iter()
        .zip(starts)
        .enumerate()
        .map(|(k, (done, s))| match done {
            Some(attempt) => Ok(attempt),
            None => step_start_known(c, *s, known.get(k).copied().flatten(), actor),
        })
        .collect())
}

/// Records a step's SUCCESS with its output (the portable moves: they run
/// when the driver's statement refused the SUCCESS, to say why).
fn step_success(c: &dyn Db, id: &str, seq: u32, output: &str, actor: &str) -> Result<()> {
    let from = c.driver().held_step(c, id, seq, actor)?.state;
    check_step(from, StepState::Success)?;
    let now = ts(Utc::now());
    c.execute(STEP_SUCCESS, p![id, seq, output, now.as_str()])?;
    history(c, id, Some(seq), Some(from.as_str()), StepState::Success.as_str(), "succeeded", actor)
}

/// A step's SUCCESS and what follows it: the driver makes it in the fewest
/// statements it can ([`super::db::Driver::step_success`]). Returns the
/// started step's attempt (0 when nothing started), and whether the
/// follow-up was done: one the table refuses is left out, the SUCCESS
/// stands. When the driver did not make it, the portable moves
/// ([`step_success`], [`step_start`], [`finish_success`]) run and say why.
pub(super) fn step_success_and(c: &dyn Db, w: &Success) -> Result<(bool, u32)> {
    if let Some(done) = c.driver().step_success(c, w)? {
        return Ok(done);
    }
    let (id, seq, output, actor) = (w.id.as_str(), w.seq, w.output.as_str(), &w.actor);
    step_success(c, id, seq, output, actor)?;
    let followed = match w.after() {
        After::Nothing => return Ok((false, 0)),
        After::Start(seq, version, params) => {
            step_start(c, StepStart { id, seq, version, params }, actor).map(|a| (true, a))
        }
        After::Finish => finish_success(c, id, actor).map(|()| (true, 0)),
    };
    match followed {
        Err(StoreError::Illegal(_) | StoreError::Invalid(_)) => Ok((false, 0)),
        other => other,
    }
}

/// Records a failed attempt; `counts` is false when the attempt was
/// interrupted (agent restart) rather than failed by the plugin.
pub fn step_fail(c: &dyn Db, id: &str, seq: u32, error: &str, counts: bool, actor: &str) -> Result<u32> {
    let StepRow { state: from, failures, .. } = c.driver().step_row(c, id, seq)?;
    check_step(from, StepState::Failed)?;
    let failures = failures + u32::from(counts);
    let now = ts(Utc::now());
    // The attempt as it ended, kept: the row is overwritten by the next one.
    c.execute(
        "INSERT INTO step_attempts (instance_id, seq, attempt, plugin_version, params, error, started_at, finished_at, outcome, \
         timeout_secs, timeout_basis) \
         SELECT instance_id, seq, attempts, plugin_version, params, ?3, started_at, ?4, ?5, timeout_secs, timeout_basis \
         FROM step_runs \
         WHERE instance_id = ?1 AND seq = ?2 ON CONFLICT DO NOTHING",
        p![id, seq, error, now.as_str(), if counts { "failed" } else { "interrupted" }],
    )?;
    c.execute(
        "UPDATE step_runs SET state = 'FAILED', error = ?3, finished_at = ?4, failures = ?5 WHERE instance_id = ?1 AND seq = ?2",
        p![id, seq, error, now, failures],
    )?;
    history(c, id, Some(seq), Some(from.as_str()), StepState::Failed.as_str(), error, actor)?;
    Ok(failures)
}

/// What a failed attempt leads to, decided inside the transaction that
/// records it from the step's failure count after this one.
pub type Decide = Box<dyn Fn(u32) -> (FailurePlan, String) + Send>;

/// Records a failed attempt and the instance's FAILED (and RETRYING, or the
/// pending rollback) in one transaction: a crash can never leave the step
/// failed with the instance still RUNNING. Returns the failure count and the
/// plan taken.
pub fn fail_step(
    c: &dyn Db,
    id: &str,
    seq: u32,
    error: &str,
    counts: bool,
    decide: &Decide,
    actor: &str,
) -> Result<(u32, FailurePlan)> {
    let failures = step_fail(c, id, seq, error, counts, actor)?;
    let (plan, message) = decide(failures);
    if plan == FailurePlan::Continue {
        // The instance stays RUNNING; the history says why it goes on.
        c.execute("UPDATE step_runs SET passed = 1 WHERE instance_id = ?1 AND seq = ?2", p![id, seq])?;
        c.execute("UPDATE task_instances SET failed_steps = failed_steps + 1 WHERE id = ?1", p![id])?;
        history(c, id, Some(seq), Some("FAILED"), "FAILED", &message, actor)?;
        return Ok((failures, plan));
    }
    fail(c, id, &message, plan, actor)?;
    Ok((failures, plan))
}

pub fn finish_success(c: &dyn Db, id: &str, actor: &str) -> Result<()> {
    let also = "finished_at = ?4, error = NULL, lease_owner = NULL, lease_expires_at = NULL";
    move_task_and(c, id, TaskState::Success, "all steps succeeded", actor, Also(also, p![ts(Utc::now())]))?;
    Ok(())
}

/// RUNNING → FAILED, then what the plan says.
pub fn fail(c: &dyn Db, id: &str, error: &str, plan: FailurePlan, actor: &str) -> Result<()> {
    move_task_and(c, id, TaskState::Failed, error, actor, Also("error = ?4", p![error]))?;
    match plan {
        FailurePlan::Retry(at) => {
            let wait = (at - Utc::now()).num_milliseconds().max(0) as f64 / 1000.0;
            move_task(c, id, TaskState::Retrying, &format!("retry in {wait:.1}s"), actor)?;
            c.execute(
                "UPDATE task_instances SET next_run_at = ?2, lease_owner = NULL, lease_expires_at = NULL WHERE id = ?1",
                p![id, ts(at)],
            )?;
        }
        FailurePlan::Rollback => {
            c.execute("UPDATE task_instances SET rollback_pending = 1 WHERE id = ?1", p![id])?;
        }
        FailurePlan::Stop => release(c, id)?,
        FailurePlan::Continue => {}
    }
    Ok(())
}

fn release(c: &dyn Db, id: &str) -> Result<()> {
    c.execute(
        "UPDATE task_instances SET finished_at = ?2, lease_owner = NULL, lease_expires_at = NULL, rollback_pending = 0 WHERE id = ?1",
        p![id, ts(Utc::now())],
    )?;
    Ok(())
}

pub fn skip_by_condition(c: &dyn Db, id: &str, seq: u32, reason: &str, actor: &str) -> Result<()> {
    move_step(c, id, seq, StepState::Skipped, reason, actor)?;
    c.execute("UPDATE step_runs SET passed = 1 WHERE instance_id = ?1 AND seq = ?2", p![id, seq])?;
    Ok(())
}

pub fn step_rolled_back(c: &dyn Db, id: &str, seq: u32, actor: &str) -> Result<()> {
    move_step(c, id, seq, StepState::RolledBack, "rolled back", actor)?;
    Ok(())
}

pub fn step_note_error(c: &dyn Db, id: &str, seq: u32, error: &str) -> Result<()> {
    c.execute("UPDATE step_runs SET error = ?3 WHERE instance_id = ?1 AND seq = ?2", p![id, seq, error])?;
    Ok(())
}

fn skip_pending_steps(c: &dyn Db, id: &str, actor: &str) -> Result<()> {
    let pending: Vec<u32> =
        c.column("SELECT seq FROM step_runs WHERE instance_id = ?1 AND state = 'PENDING' ORDER BY seq", p![id])?;
    for seq in pending {
        move_step(c, id, seq, StepState::Skipped, "instance ended before this step", actor)?;
    }
    Ok(())
}

pub fn finish_rolled_back(c: &dyn Db, id: &str, actor: &str) -> Result<()> {
    skip_pending_steps(c, id, actor)?;
    move_task(c, id, TaskState::RolledBack, "rollback completed", actor)?;
    release(c, id)
}

pub fn rollback_failed(c: &dyn Db, id: &str, error: &str, actor: &str) -> Result<()> {
    // A SUCCESS instance partly undone is not a success any more: FAILED, a
    // move outside the table that only its rollback in progress may make.
    let undone = c.execute(
        "UPDATE task_instances SET state = 'FAILED' WHERE id = ?1 AND state = 'SUCCESS' AND rollback_pending = 1",
        p![id],
    )?;
    let from = if undone == 1 { TaskState::Success } else { TaskState::Failed };
    release(c, id)?;
    c.execute("UPDATE task_instances SET error = ?2 WHERE id = ?1", p![id, error])?;
    history(c, id, None, Some(from.as_str()), TaskState::Failed.as_str(), error, actor)?;
    super::records::insert_alert(c, apollo_shared::protocol::AlertKind::RollbackFailed, error, Some(id))
}

/// The timeout a `timeout: auto` step's attempt runs under, with its basis.
pub fn step_note_timeout(c: &dyn Db, id: &str, seq: u32, secs: f64, basis: &str) -> Result<()> {
    c.execute(
        "UPDATE step_runs SET timeout_secs = ?3, timeout_basis = ?4 WHERE instance_id = ?1 AND seq = ?2",
        p![id, seq, secs, basis],
    )?;
    Ok(())
}
