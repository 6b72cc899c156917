//! PostgreSQL's driver: several agents share the schema, so every read a
//! move acts on locks its row until the transaction ends, claims take turns,
//! and the hot path's moves are one statement each ([`super::moves`]).

use super::moves;
use crate::store::db::{Conn, Db, Driver};
use crate::store::history::{not_held, read_step_row, read_task_state};
use crate::store::leases::CANDIDATE_COLS;
use crate::store::model::{ClaimMove, ClaimsMade, NewInstance, StepRow, StepStart, Success, TaskMove};
use crate::store::rows::{INSTANCE_COLS, RUNNABLE_TASKS, STEP_COLS};
use crate::store::value::{p, Row, V};
use crate::store::{Result, StoreError};
use apollo_shared::state::TaskState;
use std::collections::BTreeMap;
use std::sync::LazyLock;

pub struct Postgres;

/// The one PostgreSQL driver.
pub static DRIVER: Postgres = Postgres;

impl Driver for Postgres {
    fn history(&self, c: &dyn Db, rows: &[crate::store::model::Hist]) -> Result<()> {
        crate::store::history::numbered_by_the_database(c, rows)
    }

    fn explain(&self, c: &dyn Db, sql: &str, params: &[V]) -> Result<Vec<String>> {
        // An empty test table is cheapest read whole (or through a bitmap,
        // then sorted); with those priced out the plan shows whether an
        // index serves the statement in its order, as at a million rows.
        const OFF: [&str; 3] = ["enable_seqscan", "enable_bitmapscan", "enable_sort"];
        for knob in OFF {
            c.execute(&format!("SET {knob} = off"), &[])?;
        }
        let plan = c.query(&format!("EXPLAIN {sql}"), params);
        for knob in OFF {
            c.execute(&format!("RESET {knob}"), &[])?;
        }
        plan?.iter().map(|r| r.get::<String>(0)).collect()
    }

    fn shared(&self) -> bool {
        true
    }

    fn locking(&self, of: &str) -> String {
        format!(" FOR UPDATE OF {of}")
    }

    /// Locked until the transaction ends, so two agents never both move an
    /// instance from the state each one read.
    fn task_state(&self, c: &dyn Db, id: &str) -> Result<TaskState> {
        read_task_state(c, "SELECT state FROM task_instances WHERE id = ?1 FOR UPDATE", id)
    }

    /// Another agent may have moved it since: read and locked now.
    fn state_before_move(&self, c: &dyn Db, id: &str, _known: Option<TaskState>) -> Result<TaskState> {
        self.task_state(c, id)
    }

    fn step_row(&self, c: &dyn Db, id: &str, seq: u32) -> Result<StepRow> {
        let sql = "SELECT state, attempts, failures FROM step_runs WHERE instance_id = ?1 AND seq = ?2 FOR UPDATE";
        read_step_row(c, sql, id, seq)
    }

    /// The instance locked and checked, then its step locked: an executor
    /// whose instance was taken from it (cancelled, failed, taken over)
    /// must stop rather than move its steps.
    fn held_step(&self, c: &dyn Db, id: &str, seq: u32, agent: &str) -> Result<StepRow> {
        let row = c.query_opt("SELECT state, lease_owner FROM task_instances WHERE id = ?1 FOR UPDATE", p![id])?;
        let row: Option<(String, Option<String>)> =
            row.map(|r| Ok::<_, StoreError>((r.get(0)?, r.get(1)?))).transpose()?;
        match row {
            None => return Err(StoreError::NotFound(format!("no instance {id}"))),
            Some((state, owner)) if state != TaskState::Running.as_str() || owner.as_deref() != Some(agent) => {
                return Err(not_held(id, &state, owner.as_deref(), agent))
            }
            Some(_) => {}
        }
        self.step_row(c, id, seq)
    }

    fn move_task(&self, c: &dyn Db, m: &TaskMove) -> Result<Option<TaskState>> {
        moves::task(c, m)
    }

    fn create(&self, c: &dyn Db, n: &NewInstance, actor: &str) -> Result<bool> {
        moves::create(c, n, actor)
    }

    fn step_starts(&self, c: &dyn Db, starts: &[StepStart], actor: &str) -> Result<Vec<Option<u32>>> {
        moves::step_starts(c, starts, actor)
    }

    /// In one statement, when the table allows the instance's SUCCESS.
    fn step_success(&self, c: &dyn Db, w: &Success) -> Result<Option<(bool, u32)>> {
        if !w.mergeable() {
            return Ok(None);
        }
        Ok(moves::step_successes(c, &[w])?.pop().flatten())
    }

    fn merges_successes(&self) -> bool {
        true
    }

    fn step_successes(&self, c: &dyn Db, writes: &[&Success]) -> Result<Vec<Option<(bool, u32)>>> {
        moves::step_successes(c, writes)
    }

    /// A lock held until the transaction ends, the same for every agent on
    /// the schema.
    fn take_turn(&self, conn: &mut dyn Conn) -> Result<()> {
        conn.defer("SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.claim'))")
    }

    /// Every task's heads in one query, where a row another transaction is
    /// moving is not a candidate now; with `whole`, each head's whole row
    /// and its step 0 too, for a claim that makes first steps ready before
    /// it moves them.
    fn heads(&self, c: &dyn Db, n: usize, whole: bool) -> Result<BTreeMap<String, Vec<Row>>> {
        static HEADS: LazyLock<[String; 2]> = LazyLock::new(|| {
            use crate::store::rows::qualified as cols;
            let sql = |whole: bool| {
                let (inner, outer, first) = match whole {
                    true => (
                        format!("i.max_active, {}", cols("i", INSTANCE_COLS)),
                        format!(", {}, {}", cols("h", INSTANCE_COLS), cols("s0", STEP_COLS)),
                        format!(
                            " LEFT JOIN LATERAL (SELECT {STEP_COLS} FROM step_runs \
                             WHERE instance_id = h.id AND seq = 0) s0 ON true"
                        ),
                    ),
                    false => (cols("i", CANDIDATE_COLS), String::new(), String::new()),
                };
                format!(
                    "{RUNNABLE_TASKS} SELECT {}{outer} FROM t \
                     CROSS JOIN LATERAL (SELECT {inner} \
                     FROM task_instances i WHERE i.task = t.task AND i.state IN ('PENDING', 'RETRYING') \
                       AND (i.next_run_at IS NULL OR i.next_run_at <= apollo_now()) \
                     ORDER BY i.priority DESC, i.id LIMIT ?1 FOR UPDATE SKIP LOCKED) h{first} \
                     WHERE t.task IS NOT NULL",
                    cols("h", CANDIDATE_COLS)
                )
            };
            [sql(false), sql(true)]
        });
        let mut heads: BTreeMap<String, Vec<Row>> = BTreeMap::new();
        for r in c.query(&HEADS[usize::from(whole)], p![n])? {
            heads.entry(r.get(2)?).or_default().push(r);
        }
        Ok(heads)
    }

    fn claims(
        &self,
        c: &dyn Db,
        moves: &[ClaimMove],
        agent: &str,
        lease_secs: f64,
        starts: &[StepStart],
    ) -> Result<ClaimsMade> {
        moves::claims(c, moves, agent, lease_secs, starts)
    }

    /// Leases follow the database's clock, which did not move, and retry
    /// times of other agents are theirs: nothing is moved.
    fn shift_times(&self, _c: &dyn Db, _delta: chrono::TimeDelta) -> Result<usize> {
        Ok(0)
    }

    /// What another agent is archiving now is left to it.
    fn oldest_ended(&self, c: &dyn Db, cutoff: &str, max: usize) -> Result<Vec<String>> {
        c.column(
            "SELECT id FROM task_instances WHERE finished_at IS NOT NULL AND finished_at < ?1 \
             AND state IN ('SUCCESS', 'ROLLED_BACK', 'FAILED') AND rollback_pending = 0 \
             ORDER BY finished_at LIMIT ?2 FOR UPDATE SKIP LOCKED",
            p![cutoff, max],
        )
    }

    /// Another agent of that name whose heartbeat is younger than its lease
    /// is alive, unless it is a dead process on this host.
    fn refuse_namesake(&self, c: &dyn Db, id: &str, name: &str, host: &str) -> Result<()> {
        let other = c.query_opt(
            "SELECT id, host, CASE WHEN heartbeat_at > apollo_now_plus(-lease_secs) AND stopped_at IS NULL THEN 1 ELSE 0 END \
             FROM agents WHERE name = ?1",
            p![name],
        )?;
        let Some(r) = other else { return Ok(()) };
        let (other_id, other_host, alive): (String, String, bool) = (r.get(0)?, r.get(1)?, r.get(2)?);
        // On this host a dead process is known dead.
        let pid_alive = |id: &str| {
            id.rsplit(':')
                .next()
                .and_then(|p| p.parse::<i32>().ok())
                .is_some_and(|pid| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok())
        };
        if alive && other_id != id && (other_host != host || pid_alive(&other_id)) {
            return Err(StoreError::Invalid(format!(
                "another agent named {name:?} ({other_id} on {other_host}) is alive on this store; give this one \
                 another agent.name (or --name), or stop that one"
            )));
        }
        Ok(())
    }

    /// The counts as last folded plus the deltas since (moves count into
    /// `state_deltas`, not one contended row per state).
    fn state_counts(&self, c: &dyn Db) -> Result<Vec<(String, u64)>> {
        c.query(
            "SELECT state, CAST(SUM(n) AS BIGINT) FROM (SELECT state, n FROM state_counts \
             UNION ALL SELECT state, d FROM state_deltas) AS c GROUP BY state",
            &[],
        )?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get(1)?)))
        .collect()
    }

    fn fold_counts(&self, c: &dyn Db) -> Result<()> {
        c.execute(
            "WITH moved AS (DELETE FROM state_deltas RETURNING state, d), \
             sums AS (SELECT state, SUM(d) AS d FROM moved GROUP BY state) \
             UPDATE state_counts SET n = state_counts.n + sums.d FROM sums WHERE state_counts.state = sums.state",
            &[],
        )?;
        Ok(())
    }
}
