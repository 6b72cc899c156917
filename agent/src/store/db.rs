//! What a backend provides: [`Db`] runs the store's SQL on a connection (or
//! the transaction on it), [`Conn`] is the writer's connection, and
//! [`Driver`] makes the operations whose SQL differs between SQLite and
//! PostgreSQL. Each backend's driver lives in its own directory
//! (`sqlite/driver.rs`, `postgres/driver.rs`) and owns its SQL; what is
//! portable — the history rows, the transition checks, why a move was
//! refused — is written once, in `history.rs` and `write.rs`.

use super::model::{ClaimMove, ClaimsMade, Hist, NewInstance, StepRow, StepStart, Success, TaskMove};
use super::value::{FromV, Row, V};
use super::Result;
use apollo_shared::state::TaskState;
use std::collections::BTreeMap;

/// A connection (or the transaction on it) the store's SQL runs on.
pub trait Db {
    /// Runs a statement; the number of rows it changed.
    fn execute(&self, sql: &str, params: &[V]) -> Result<u64>;
    /// Runs a query; all its rows.
    fn query(&self, sql: &str, params: &[V]) -> Result<Vec<Row>>;
    /// The backend's driver, for the operations whose SQL differs.
    fn driver(&self) -> &'static dyn Driver;

    /// Runs each statement with its parameters, in order; the rows of each.
    /// PostgreSQL sends them all at once (one round trip, not one each).
    fn query_batch(&self, statements: &[(&str, Vec<V>)]) -> Result<Vec<Vec<Row>>> {
        statements.iter().map(|(sql, p)| self.query(sql, p)).collect()
    }

    /// Runs a statement with neither placeholders nor result; PostgreSQL
    /// sends it with the next statement or the commit, in that round trip,
    /// where its error (if any) is that statement's or the commit's.
    fn execute_later(&self, sql: &str) -> Result<()> {
        self.execute(sql, &[]).map(|_| ())
    }

    /// Whether a connection that sat idle still works (a PostgreSQL
    /// connection may have been cut meanwhile).
    fn alive(&self) -> bool {
        true
    }
}

impl dyn Db + '_ {
    /// Runs one query once per set of `params` (see [`Db::query_batch`]).
    pub fn query_each(&self, sql: &str, params: &[Vec<V>]) -> Result<Vec<Vec<Row>>> {
        let statements: Vec<(&str, Vec<V>)> = params.iter().map(|p| (sql, p.clone())).collect();
        self.query_batch(&statements)
    }

    /// The first row, if any.
    pub fn query_opt(&self, sql: &str, params: &[V]) -> Result<Option<Row>> {
        Ok(self.query(sql, params)?.into_iter().next())
    }

    /// Column 0 of the first row, if there is one.
    pub fn value<T: FromV>(&self, sql: &str, params: &[V]) -> Result<Option<T>> {
        self.query_opt(sql, params)?.map(|r| r.get(0)).transpose()
    }

    /// Column 0 of every row.
    pub fn column<T: FromV>(&self, sql: &str, params: &[V]) -> Result<Vec<T>> {
        self.query(sql, params)?.iter().map(|r| r.get(0)).collect()
    }
}

/// What the writer thread needs of its connection besides running SQL.
pub trait Conn: Send {
    fn db(&self) -> &dyn Db;
    /// Starts the batch transaction (SQLite takes the write lock at once).
    fn begin(&mut self) -> Result<()>;
    /// Runs statements without results (savepoints, commit, rollback).
    fn batch(&mut self, sql: &str) -> Result<()>;
    /// As [`Conn::batch`], or later: with the next statement, in the same
    /// round trip (PostgreSQL).
    fn defer(&mut self, sql: &str) -> Result<()> {
        self.batch(sql)
    }
    /// Whether the batch transaction is still open (SQLite rolls the whole
    /// transaction back on disk full or I/O errors; a PostgreSQL connection
    /// can drop).
    fn in_transaction(&self) -> bool;
    /// Rows changed so far on this connection.
    fn changes(&self) -> u64;
    /// Connects again if the connection was lost.
    fn reopen(&mut self) -> Result<()> {
        Ok(())
    }
}

/// The operations whose SQL differs between the backends, River's way: each
/// backend's driver (`sqlite/driver.rs`, `postgres/driver.rs`) owns its
/// statements for them. Reads a move acts on lock what they read where
/// agents share the database. A move a driver may make in one statement
/// answers `None` (or `false`) when it did not make it: the portable move in
/// `write.rs` then runs, changes nothing either and says exactly why.
pub trait Driver: Sync {
    /// Whether several agents share this database: claims take turns, the
    /// others are told of changes, and each agent recovers only its own.
    fn shared(&self) -> bool;

    /// What a read ends with to lock the rows of table `of` it reads until
    /// the transaction ends (` FOR UPDATE OF of`); nothing where one writer
    /// does all.
    fn locking(&self, _of: &str) -> String {
        String::new()
    }

    /// The plan of `sql` as the backend would run it, a line per step
    /// (SQLite's `EXPLAIN QUERY PLAN`; PostgreSQL's `EXPLAIN`, with
    /// sequential scans priced out so an index that can serve is shown).
    fn explain(&self, c: &dyn Db, sql: &str, params: &[V]) -> Result<Vec<String>>;

    /// An instance's state, locked for the move about to be made.
    fn task_state(&self, c: &dyn Db, id: &str) -> Result<TaskState>;
    /// The state a move starts from: `known`, read by this transaction
    /// already, where nobody else can have moved it since; else read now.
    fn state_before_move(&self, c: &dyn Db, id: &str, known: Option<TaskState>) -> Result<TaskState>;
    /// A step's row, locked for the move about to be made.
    fn step_row(&self, c: &dyn Db, id: &str, seq: u32) -> Result<StepRow>;
    /// Step `seq` of an instance `agent` holds RUNNING; refused (naming who
    /// holds it) when it does not.
    fn held_step(&self, c: &dyn Db, id: &str, seq: u32, agent: &str) -> Result<StepRow>;

    /// How a single-row UPDATE of an instance begins: SQLite's `UPDATE OR
    /// FAIL` writes no statement journal (the pages a statement changes,
    /// copied first so the statement alone can be undone): the writer
    /// undoes a failed write with its whole transaction or its savepoint
    /// (`writer::run_batch`), never the statement alone.
    fn update_row(&self) -> &'static str {
        "UPDATE"
    }

    /// The condition that picks the history rows operators caused (not an
    /// agent, not the schedule), as the operators' index has it; `t` is the
    /// history table's name in the statement. SQLite's has no function in it
    /// (schema 28).
    fn operator_rows(&self, t: &str) -> String {
        format!("substr({t}.actor, 1, 6) <> 'agent:' AND {t}.actor <> 'scheduler'")
    }

    /// Whether archived documents are kept compressed (`docs::keep`): a
    /// column of bytes (SQLite's), not text.
    fn compresses_documents(&self) -> bool {
        false
    }

    /// History rows, stamped with the time now (each row's reason bounded
    /// to one line first).
    fn history(&self, c: &dyn Db, rows: &[Hist]) -> Result<()>;

    /// An instance's move in one statement (`None`: not made).
    fn move_task(&self, _c: &dyn Db, _m: &TaskMove) -> Result<Option<TaskState>> {
        Ok(None)
    }
    /// A new instance in one statement (`false`: not made).
    fn create(&self, _c: &dyn Db, _n: &NewInstance, _actor: &str) -> Result<bool> {
        Ok(false)
    }
    /// Steps' starts in one statement: each one's attempt, or `None`.
    fn step_starts(&self, _c: &dyn Db, starts: &[StepStart], _actor: &str) -> Result<Vec<Option<u32>>> {
        Ok(vec![None; starts.len()])
    }
    /// A step's SUCCESS with its follow-up (see `model::Success`): whether the
    /// follow-up was made and the started step's attempt, or `None`.
    fn step_success(&self, c: &dyn Db, w: &Success) -> Result<Option<(bool, u32)>>;
    /// Whether a batch's SUCCESS writes are made together
    /// ([`Driver::step_successes`]).
    fn merges_successes(&self) -> bool {
        false
    }
    /// SUCCESS writes of different instances in one statement: for each,
    /// as [`Driver::step_success`].
    fn step_successes(&self, _c: &dyn Db, writes: &[&Success]) -> Result<Vec<Option<(bool, u32)>>> {
        Ok(vec![None; writes.len()])
    }

    /// The claim's turn (see `leases::take_turn`): sent with the batch's
    /// first statement where agents share the database.
    fn take_turn(&self, _conn: &mut dyn Conn) -> Result<()> {
        Ok(())
    }
    /// The runnable heads of every task, up to `n` each, by task: the
    /// columns of `rows::HEAD_COLS`, then (with `whole`, where the driver
    /// reads it in the same query) the whole row and its step 0.
    fn heads(&self, c: &dyn Db, n: usize, whole: bool) -> Result<BTreeMap<String, Vec<Row>>>;
    /// A claim's moves and its first steps' starts in one round trip: for
    /// each move its row as moved (`None`: not made) and the instance's
    /// steps; and each start made. Empty when the driver makes none.
    fn claims(
        &self,
        _c: &dyn Db,
        _moves: &[ClaimMove],
        _agent: &str,
        _lease_secs: f64,
        _starts: &[StepStart],
    ) -> Result<ClaimsMade> {
        Ok(ClaimsMade::default())
    }
    /// Leases and retry times moved by `delta` (the wall clock jumped);
    /// how many instances were moved.
    fn shift_times(&self, c: &dyn Db, delta: chrono::TimeDelta) -> Result<usize>;

    /// Gives the space of deleted rows back to the system, a little at a
    /// time (SQLite's incremental vacuum; PostgreSQL's autovacuum does it).
    fn reclaim(&self, _c: &dyn Db) -> Result<()> {
        Ok(())
    }
    /// The ended instances to archive first, finished before `cutoff`.
    fn oldest_ended(&self, c: &dyn Db, cutoff: &str, max: usize) -> Result<Vec<String>>;
    /// Refuses a first heartbeat under the name of another agent alive on
    /// this database.
    fn refuse_namesake(&self, _c: &dyn Db, _id: &str, _name: &str, _host: &str) -> Result<()> {
        Ok(())
    }
    /// The instances in each state.
    fn state_counts(&self, c: &dyn Db) -> Result<Vec<(String, u64)>>;
    /// Folds what the moves counted into the state counts.
    fn fold_counts(&self, _c: &dyn Db) -> Result<()> {
        Ok(())
    }
}
