//! SQLite's driver: one agent per file, whose one writer holds the
//! database, so nothing is locked row by row and a state this transaction
//! read stays true; the planner is told which index to use (`INDEXED BY`).

use crate::store::db::{Db, Driver};
use crate::store::history::{not_held, parse_state, read_step_row, read_task_state, STEP_RUNNING, STEP_SUCCESS};
use crate::store::leases::CANDIDATE_COLS;
use crate::store::model::{After, Hist, StepRow, Success};
use crate::store::rows::{parse_ts, ts};
use crate::store::schema::{reason_code, state_code};
use crate::store::value::{p, Row, V};
use crate::store::{Result, StoreError};
use apollo_shared::state::{check_step, StepState, TaskState};
use chrono::Utc;
use std::collections::BTreeMap;

pub struct Sqlite;

/// The last history row's number given (see [`history_ids`]).
static LAST: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// At open: the numbers given from now on are above every row of the
/// instances still to end and of the operators' rows (those an instance
/// may add rows after), so an instance's rows stay in order across a
/// restart even when the clock went back meanwhile. A seek per such
/// instance, not a scan of the history.
pub fn raise_history_floor(c: &dyn Db) -> Result<()> {
    let top: Option<Option<i64>> = c.value(
        &format!(
            "SELECT MAX(m) FROM (\
               SELECT (SELECT MAX(t.id) FROM transitions t WHERE t.instance_id = i.id) AS m FROM task_instances i \
               INDEXED BY task_instances_state WHERE i.state IN ('PENDING', 'RUNNING', 'RETRYING', 'FAILED') \
               UNION ALL SELECT MAX(o.id) FROM transitions o INDEXED BY transitions_operator WHERE {})",
            Sqlite.operator_rows("o")
        ),
        &[],
    )?;
    LAST.fetch_max(top.flatten().unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// The next history row's number: the clock in microseconds, or one past
/// the last number given when the clock has not moved on since. Returns
/// the first of `n` consecutive numbers.
fn history_ids(n: i64, now_us: i64) -> i64 {
    use std::sync::atomic::Ordering;
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let first = last.max(now_us - 1) + 1;
        match LAST.compare_exchange_weak(last, first + n - 1, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return first,
            Err(seen) => last = seen,
        }
    }
}

/// The one SQLite driver.
pub static DRIVER: Sqlite = Sqlite;

impl Driver for Sqlite {
    fn explain(&self, c: &dyn Db, sql: &str, params: &[V]) -> Result<Vec<String>> {
        c.query(&format!("EXPLAIN QUERY PLAN {sql}"), params)?.iter().map(|r| r.get::<String>(3)).collect()
    }

    fn shared(&self) -> bool {
        false
    }

    fn compresses_documents(&self) -> bool {
        true
    }

    fn update_row(&self) -> &'static str {
        "UPDATE OR FAIL"
    }

    fn operator_rows(&self, t: &str) -> String {
        format!("({t}.actor < 'agent:' OR {t}.actor >= 'agent;') AND {t}.actor <> 'scheduler'")
    }

    fn task_state(&self, c: &dyn Db, id: &str) -> Result<TaskState> {
        read_task_state(c, "SELECT state FROM task_instances WHERE id = ?1", id)
    }

    fn state_before_move(&self, c: &dyn Db, id: &str, known: Option<TaskState>) -> Result<TaskState> {
        match known {
            Some(from) => Ok(from),
            None => self.task_state(c, id),
        }
    }

    fn step_row(&self, c: &dyn Db, id: &str, seq: u32) -> Result<StepRow> {
        read_step_row(c, "SELECT state, attempts, failures FROM step_runs WHERE instance_id = ?1 AND seq = ?2", id, seq)
    }

    /// The instance and its step in one statement.
    fn held_step(&self, c: &dyn Db, id: &str, seq: u32, agent: &str) -> Result<StepRow> {
        let row = c.query_opt(
            "SELECT i.state, i.lease_owner, s.state, s.attempts, s.failures FROM task_instances i \
             LEFT JOIN step_runs s ON s.instance_id = i.id AND s.seq = ?2 WHERE i.id = ?1",
            p![id, seq],
        )?;
        let Some(r) = row else { return Err(StoreError::NotFound(format!("no instance {id}"))) };
        let (state, owner): (String, Option<String>) = (r.get(0)?, r.get(1)?);
        if state != TaskState::Running.as_str() || owner.as_deref() != Some(agent) {
            return Err(not_held(id, &state, owner.as_deref(), agent));
        }
        let step: Option<String> = r.get(2)?;
        let step = step.ok_or_else(|| StoreError::NotFound(format!("no step {seq} in instance {id}")))?;
        Ok(StepRow { state: parse_state(&step)?, attempts: r.get(3)?, failures: r.get(4)? })
    }

    /// A step's SUCCESS and what follows it, in the fewest statements: one
    /// read of the instance and both steps, one insert for both history
    /// rows; the moves and their checks are those of the portable writes.
    /// Always made or refused here (never `None`).
    fn step_success(&self, c: &dyn Db, w: &Success) -> Result<Option<(bool, u32)>> {
        let (id, seq, output, actor) = (w.id.as_str(), w.seq, w.output.as_str(), &w.actor);
        let after = w.after();
        let next = match after {
            After::Start(n, ..) => i64::from(n),
            _ => -1,
        };
        // A range of the key, not `IN (?2, ?3)`: an IN list of parameters
        // builds a temporary b-tree on every call. The steps between (ones
        // skipped on the way) are read and left out.
        let (lo, hi) = match next {
            -1 => (i64::from(seq), i64::from(seq)),
            n => (i64::from(seq).min(n), i64::from(seq).max(n)),
        };
        let rows = c.query(
            "SELECT i.state, i.lease_owner, s.seq, s.state, s.attempts FROM task_instances i \
             LEFT JOIN step_runs s ON s.instance_id = i.id AND s.seq BETWEEN ?2 AND ?3 WHERE i.id = ?1",
            p![id, lo, hi],
        )?;
        let Some(first) = rows.first() else { return Err(StoreError::NotFound(format!("no instance {id}"))) };
        let (state, owner): (String, Option<String>) = (first.get(0)?, first.get(1)?);
        if state != TaskState::Running.as_str() || owner.as_deref() != Some(actor) {
            return Err(not_held(id, &state, owner.as_deref(), actor));
        }
        // At most two steps: the one that succeeded and the one to start.
        let mut steps = Vec::with_capacity(2);
        for r in &rows {
            if let Some(s) = r.get::<Option<u32>>(2)?.filter(|&s| s == seq || i64::from(s) == next) {
                let st: String = r.get(3)?;
                steps.push((s, st.parse::<StepState>().map_err(StoreError::Invalid)?, r.get::<u32>(4)?));
            }
        }
        let step = |s: u32| {
            steps
                .iter()
                .find(|t| t.0 == s)
                .map(|&(_, state, attempts)| (state, attempts))
                .ok_or_else(|| StoreError::NotFound(format!("no step {s} in instance {id}")))
        };
        let (from, _) = step(seq)?;
        check_step(from, StepState::Success)?;
        // The follow-up, when the table allows it.
        let after = match after {
            After::Start(n, v, p) => {
                match step(n).and_then(|(f, a)| Ok(check_step(f, StepState::Running).map(|()| (f, a))?)) {
                    Ok((f, a)) => Some((Some(n), f.as_str(), a + 1, v, p)),
                    Err(StoreError::Illegal(_) | StoreError::Invalid(_) | StoreError::NotFound(_)) => None,
                    Err(e) => return Err(e),
                }
            }
            After::Finish => Some((None, TaskState::Running.as_str(), 0, "", "")),
            After::Nothing => None,
        };
        let now = ts(Utc::now());
        c.execute(STEP_SUCCESS, p![id, seq, output, now.as_str()])?;
        let succeeded =
            Hist { id, step: Some(seq), from: Some(from.as_str()), to: "SUCCESS", reason: "succeeded", actor };
        match after {
            Some((Some(n), nfrom, attempt, version, params)) => {
                // The instance's row is left as it is: its context is made
                // again from the steps' outputs (`Context::of`).
                c.execute(STEP_RUNNING, p![id, n, attempt, version, params, now.as_str()])?;
                let reason = format!("attempt {attempt}");
                let started = Hist { step: Some(n), from: Some(nfrom), to: "RUNNING", reason: &reason, ..succeeded };
                self.history(c, &[succeeded, started])?;
                Ok(Some((true, attempt)))
            }
            Some((None, ..)) => {
                c.execute(
                    "UPDATE OR FAIL task_instances SET updated_at = ?2, state = 'SUCCESS', finished_at = ?2, error = NULL, \
                     lease_owner = NULL, lease_expires_at = NULL WHERE id = ?1",
                    p![id, now.as_str()],
                )?;
                let ended = Hist {
                    step: None,
                    from: Some("RUNNING"),
                    to: "SUCCESS",
                    reason: "all steps succeeded",
                    ..succeeded
                };
                self.history(c, &[succeeded, ended])?;
                Ok(Some((true, 0)))
            }
            None => {
                self.history(c, &[succeeded])?;
                Ok(Some((false, 0)))
            }
        }
    }

    /// History rows kept by instance (`transitions` is clustered on
    /// `(instance_id, id)`: no index beside it), each numbered from the
    /// clock in microseconds — in time order across instances, for the
    /// audit — and never below a number given before (see
    /// [`raise_history_floor`]); the time is kept as how far it lies behind
    /// the number, the states and common reasons as codes (schema 26).
    fn history(&self, c: &dyn Db, rows: &[Hist]) -> Result<()> {
        static SQL: std::sync::LazyLock<[String; 2]> = std::sync::LazyLock::new(|| {
            let row = |k: usize| {
                let b = 2 + k * 6;
                format!("(?1, ?2 + {k}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{})", b + 1, b + 2, b + 3, b + 4, b + 5, b + 6)
            };
            let head =
                "INSERT OR FAIL INTO transitions (instance_id, id, step_seq, from_code, to_code, reason_code, actor, at_lag) VALUES ";
            [format!("{head}{}", row(0)), format!("{head}{}, {}", row(0), row(1))]
        });
        let now = Utc::now().timestamp_micros();
        for chunk in rows.chunks(2) {
            // Rows of one statement are one instance's (the subquery's).
            if chunk.len() == 2 && chunk[0].id != chunk[1].id {
                self.history(c, &chunk[..1])?;
                self.history(c, &chunk[1..])?;
                continue;
            }
            let first = history_ids(chunk.len() as i64, now);
            let mut params = vec![V::from(chunk[0].id), V::Int(first)];
            for (k, h) in chunk.iter().enumerate() {
                params.extend([
                    V::from(h.step),
                    h.from.map_or(V::Null, state_code),
                    state_code(h.to),
                    reason_code(&crate::store::rows::reason(h.reason)),
                    V::from(h.actor),
                    V::Int(first + k as i64 - now),
                ]);
            }
            c.execute(&SQL[chunk.len() - 1], &params)?;
        }
        Ok(())
    }

    /// One query per task with runnable work, the tasks found one seek at a
    /// time on the per-task index (a recursive query cost twice as much).
    fn heads(&self, c: &dyn Db, n: usize, _whole: bool) -> Result<BTreeMap<String, Vec<Row>>> {
        const NEXT_TASK: &str = "SELECT task FROM task_instances INDEXED BY task_instances_runnable_task \
             WHERE state IN ('PENDING', 'RETRYING') AND task > ?1 ORDER BY task LIMIT 1";
        static HEAD: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            format!(
                "SELECT {CANDIDATE_COLS} FROM task_instances INDEXED BY task_instances_runnable_task \
                 WHERE task = ?1 AND state IN ('PENDING', 'RETRYING') \
                   AND (next_run_at IS NULL OR next_run_at <= apollo_now()) \
                 ORDER BY priority DESC, id LIMIT ?2"
            )
        });
        let mut heads = BTreeMap::new();
        let mut after = String::new();
        while let Some(task) = c.value::<String>(NEXT_TASK, p![after.as_str()])? {
            let rows = c.query(&HEAD, p![task.as_str(), n])?;
            after.clone_from(&task);
            heads.insert(task, rows);
        }
        Ok(heads)
    }

    /// The leases and retry times are this host's clock's: they move with it.
    fn shift_times(&self, c: &dyn Db, delta: chrono::TimeDelta) -> Result<usize> {
        let rows = c.query(
            "SELECT id, next_run_at, lease_expires_at FROM task_instances WHERE state = 'RETRYING' \
             UNION ALL SELECT id, NULL, lease_expires_at FROM task_instances WHERE state = 'RUNNING' \
             UNION ALL SELECT id, NULL, lease_expires_at FROM task_instances INDEXED BY task_instances_rolling_back \
             WHERE rollback_pending = 1",
            &[],
        )?;
        let shift = |t: Option<String>| parse_ts(t).map(|t| ts(t + delta));
        for r in &rows {
            let (id, next, lease): (String, Option<String>, Option<String>) = (r.get(0)?, r.get(1)?, r.get(2)?);
            c.execute(
                "UPDATE task_instances SET next_run_at = COALESCE(?2, next_run_at), lease_expires_at = COALESCE(?3, lease_expires_at) WHERE id = ?1",
                p![id, shift(next), shift(lease)],
            )?;
        }
        Ok(rows.len())
    }

    /// At most 2,000 pages (8 MB) back to the file system per call; a store
    /// made before incremental vacuum (auto_vacuum off) reuses them instead.
    fn reclaim(&self, c: &dyn Db) -> Result<()> {
        c.query("PRAGMA incremental_vacuum(2000)", &[])?;
        Ok(())
    }

    fn oldest_ended(&self, c: &dyn Db, cutoff: &str, max: usize) -> Result<Vec<String>> {
        c.column(OLDEST_ENDED, p![cutoff, max])
    }

    /// The ended states' counts as the triggers keep them; the live
    /// states' counted on the state index (the instances in flight, not
    /// the store's history: see schema 27).
    fn state_counts(&self, c: &dyn Db) -> Result<Vec<(String, u64)>> {
        c.query(
            "SELECT state, n FROM state_counts UNION ALL \
             SELECT state, COUNT(*) FROM task_instances INDEXED BY task_instances_state \
             WHERE state IN ('PENDING', 'RUNNING', 'FAILED', 'RETRYING') GROUP BY state",
            &[],
        )?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get(1)?)))
        .collect()
    }
}

/// The ended instances finished before ?1, oldest first, at most ?2.
/// (`finished_at` is set only on an ended instance: a retry or a rollback
/// clears it; the index holds only those, oldest first.)
pub const OLDEST_ENDED: &str = "SELECT id FROM task_instances INDEXED BY task_instances_finished \
     WHERE finished_at IS NOT NULL AND finished_at < ?1 \
     AND state IN ('SUCCESS', 'ROLLED_BACK', 'FAILED') AND rollback_pending = 0 \
     ORDER BY finished_at LIMIT ?2";
