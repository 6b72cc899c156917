//! What a claim reads of the queues when a limit or an ordered queue asks:
//! the instances under way, and an ordered queue's head; and what it
//! reads of each runnable row.

use super::super::db::Db;
use super::super::model::Claimed;
use super::super::value::p;
use super::super::Result;
use std::collections::HashMap;

/// A runnable instance as a claim weighs it (the columns of
/// [`CANDIDATE_COLS`], in order), with the whole row and its step 0 when
/// the claim read them (see [`super::claim_noting`]).
pub(super) struct Candidate {
    pub(super) priority: i64,
    pub(super) id: String,
    pub(super) task: String,
    pub(super) queue: String,
    pub(super) max_active: Option<u32>,
    pub(super) state: String,
    pub(super) def_hash: String,
    pub(super) pins: Option<String>,
    /// The locks it takes (JSON).
    pub(super) locks: Option<String>,
    /// Why it waits, as last recorded.
    pub(super) waiting: Option<String>,
    pub(super) whole: Option<Box<Claimed>>,
}

/// What a claim reads of each runnable row, in [`Candidate`]'s order; the
/// drivers' head queries select these first.
pub const CANDIDATE_COLS: &str = "priority, id, task, queue, max_active, state, def_hash, pins, locks, waiting";

impl Candidate {
    pub(super) fn read(r: &super::super::value::Row, whole: Option<Box<Claimed>>) -> Result<Candidate> {
        Ok(Candidate {
            priority: r.get(0)?,
            id: r.get(1)?,
            task: r.get(2)?,
            queue: r.get(3)?,
            max_active: r.get(4)?,
            state: r.get(5)?,
            def_hash: r.get(6)?,
            pins: r.get(7)?,
            locks: r.get(8)?,
            waiting: r.get(9)?,
            whole,
        })
    }
}

/// Instances under way per queue and per task.
pub(super) type Running = (HashMap<String, u32>, HashMap<String, u32>);

/// Instances under way (RUNNING, or FAILED with a rollback pending) per
/// queue and per task, read once per claim when first needed.
pub(super) fn running_counts<'a>(c: &dyn Db, running: &'a mut Option<Running>) -> Result<&'a mut Running> {
    if running.is_none() {
        let (mut per_queue, mut per_task): Running = Default::default();
        for r in c.query(
            // Two indexed lookups rather than an OR that scans the table.
            "SELECT queue, task, COUNT(*) FROM task_instances WHERE state = 'RUNNING' GROUP BY queue, task \
             UNION ALL \
             SELECT queue, task, COUNT(*) FROM task_instances INDEXED BY task_instances_rolling_back \
             WHERE rollback_pending = 1 GROUP BY queue, task",
            &[],
        )? {
            let count: u32 = r.get(2)?;
            *per_queue.entry(r.get(0)?).or_default() += count;
            *per_task.entry(r.get(1)?).or_default() += count;
        }
        *running = Some((per_queue, per_task));
    }
    Ok(running.as_mut().expect("read above"))
}

/// The oldest instance of `task` in `queue` still to run (PENDING or
/// RETRYING), when it may start now.
pub(super) fn ordered_head(c: &dyn Db, task: &str, queue: &str) -> Result<Option<Candidate>> {
    let head = c.query_opt(
        "SELECT priority, id, task, queue, max_active, state, def_hash, pins, locks, waiting, \
         CASE WHEN next_run_at IS NULL OR next_run_at <= apollo_now() THEN 1 ELSE 0 END \
         FROM task_instances INDEXED BY task_instances_runnable_task \
         WHERE task = ?1 AND queue = ?2 AND state IN ('PENDING', 'RETRYING') ORDER BY id LIMIT 1",
        p![task, queue],
    )?;
    let Some(r) = head else { return Ok(None) };
    if !r.get::<bool>(10)? {
        return Ok(None);
    }
    Ok(Some(Candidate::read(&r, None)?))
}
