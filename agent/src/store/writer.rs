//! The writer threads: each takes every write waiting in the queue, runs
//! them in one transaction, commits, and only then acknowledges each caller
//! (group commit). One failing write does not fail its batch-mates: the
//! batch is run again with each write in its own savepoint. SQLite has one; a PostgreSQL store has several,
//! each with its own connection.

use super::db::{Conn, Db};
use super::model::Success;
use super::{leases, Result, StoreError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};

/// What a write does in the batch transaction. It may run more than once:
/// a batch whose writes all succeed commits without savepoints, and one that
/// has a failure is rolled back and run again, each write in its own
/// savepoint (see [`run_batch`]). A run's only effects are on the database.
pub(super) trait Work: Send {
    type Out: Send + 'static;
    fn run(&self, conn: &dyn Db) -> Result<Self::Out>;
    /// A step's SUCCESS, when this write is one and its result is what
    /// `write::step_success_and` returns: PostgreSQL makes those of a batch in one
    /// statement.
    fn success(&self) -> Option<&Success> {
        None
    }
    /// The result of [`Work::success`]'s write made with others.
    fn made(&self, _done: (bool, u32)) -> Option<Self::Out> {
        None
    }
}

impl<R, F> Work for F
where
    R: Send + 'static,
    F: Fn(&dyn Db) -> Result<R> + Send,
{
    type Out = R;
    fn run(&self, conn: &dyn Db) -> Result<R> {
        self(conn)
    }
}

impl Work for Success {
    type Out = (bool, u32);
    fn run(&self, conn: &dyn Db) -> Result<(bool, u32)> {
        super::write::step_success_and(conn, self)
    }
    fn success(&self) -> Option<&Success> {
        Some(self)
    }
    fn made(&self, done: (bool, u32)) -> Option<(bool, u32)> {
        Some(done)
    }
}

/// A write queued for the writer thread.
pub(super) trait Job: Send {
    /// Runs inside the batch transaction, keeping its result; returns
    /// whether it succeeded.
    fn run(&mut self, conn: &dyn Db) -> bool;
    /// See [`Work::success`].
    fn success(&self) -> Option<&Success>;
    /// Keeps the result of its [`Job::success`] made with others.
    fn made(&mut self, done: (bool, u32));
    /// Tells the caller the kept result once the batch has committed, or
    /// why the commit failed.
    fn finish(self: Box<Self>, commit_error: Option<&str>);
    /// Tells the caller the write never ran.
    fn abort(self: Box<Self>, why: &str);
    /// Whether it takes the cluster's turn (claims, takeovers): its batch
    /// takes the turn first, before any row lock, so no two agents' batches
    /// can wait for each other.
    fn in_turn(&self) -> bool;
}

pub(super) struct Pending<W: Work, D> {
    pub work: W,
    pub deliver: D,
    pub turn: bool,
    pub result: Option<Result<W::Out>>,
}

impl<W, D> Job for Pending<W, D>
where
    W: Work,
    D: FnOnce(Result<W::Out>) + Send + 'static,
{
    fn run(&mut self, conn: &dyn Db) -> bool {
        let result = self.work.run(conn);
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn success(&self) -> Option<&Success> {
        self.work.success()
    }

    fn made(&mut self, done: (bool, u32)) {
        self.result = self.work.made(done).map(Ok);
    }

    fn finish(self: Box<Self>, commit_error: Option<&str>) {
        let Pending { deliver, result, .. } = *self;
        match (commit_error, result) {
            (_, None) => deliver(Err(StoreError::Commit("the write never ran".into()))),
            (Some(e), Some(Ok(_))) => deliver(Err(StoreError::Commit(e.to_string()))),
            (_, Some(r)) => deliver(r),
        }
    }

    fn abort(self: Box<Self>, why: &str) {
        (self.deliver)(Err(StoreError::Commit(why.to_string())))
    }

    fn in_turn(&self) -> bool {
        self.turn
    }
}

/// Runs every write of a batch once, stopping at the first failure. Where
/// the driver can (PostgreSQL), the steps' SUCCESS writes of different
/// instances are made together first, in one statement
/// ([`super::db::Driver::step_successes`]); one that statement does not make
/// runs on its own, to say why.
fn run_all(db: &dyn Db, batch: &mut [Box<dyn Job>]) -> bool {
    let mut made = vec![false; batch.len()];
    if db.driver().merges_successes() {
        let mut ids = std::collections::HashSet::new();
        let together: Vec<usize> = (0..batch.len())
            .filter(|&i| batch[i].success().is_some_and(|s| s.mergeable() && ids.insert(s.id.clone())))
            .collect();
        if together.len() > 1 {
            let writes: Vec<&Success> = together.iter().filter_map(|&i| batch[i].success()).collect();
            let done = match db.driver().step_successes(db, &writes) {
                Ok(done) => done,
                Err(e) => {
                    // The batch runs again, each write on its own.
                    tracing::warn!(error = %e, writes = writes.len(), "the steps' SUCCESS writes made together failed");
                    return false;
                }
            };
            for (&i, done) in together.iter().zip(done) {
                if let Some(done) = done {
                    batch[i].made(done);
                    made[i] = true;
                    crate::metrics::get().merged_writes.inc();
                }
            }
        }
    }
    batch.iter_mut().zip(made).all(|(job, made)| made || job.run(db))
}

/// Largest number of writes grouped into one transaction.
const MAX_BATCH: usize = 1024;
pub(super) fn writer_loop(mut conn: Box<dyn Conn>, rx: &Mutex<mpsc::Receiver<Box<dyn Job>>>, wrote: &AtomicU64) {
    loop {
        // The writer that is free takes what waits (one, on SQLite).
        let batch = {
            let rx = rx.lock().expect("write queue");
            let Ok(first) = rx.recv() else { return };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            batch
        };
        run_batch(conn.as_mut(), batch, wrote);
    }
}

/// Begins the batch's transaction and takes the cluster's turn when a
/// write needs it; on failure every write learns why and `None` is returned.
fn open(conn: &mut dyn Conn, batch: Vec<Box<dyn Job>>) -> Option<Vec<Box<dyn Job>>> {
    let opened = conn.reopen().and_then(|()| conn.begin()).and_then(|()| {
        if batch.iter().any(|j| j.in_turn()) {
            leases::take_turn(conn).inspect_err(|_| {
                let _ = conn.batch("ROLLBACK");
            })
        } else {
            Ok(())
        }
    });
    match opened {
        Ok(()) => Some(batch),
        Err(e) => {
            // Nothing ran; each caller learns why.
            let msg = e.to_string();
            batch.into_iter().for_each(|job| job.abort(&msg));
            None
        }
    }
}

/// Commits the batch and tells each write's caller.
fn commit(conn: &mut dyn Conn, jobs: Vec<Box<dyn Job>>, end: &str, changes_before: u64, wrote: &AtomicU64) {
    crate::crash_point!("store.before_commit");
    let committing = std::time::Instant::now();
    let m = crate::metrics::get();
    m.batch_size.observe(jobs.len() as f64);
    let committed = conn.batch(&format!("{end}COMMIT"));
    m.commit_seconds.observe(committing.elapsed().as_secs_f64());
    match committed {
        Ok(()) => {
            if conn.changes() > changes_before {
                wrote.fetch_add(1, Ordering::SeqCst);
            }
            crate::crash_point!("store.after_commit");
            jobs.into_iter().for_each(|job| job.finish(None))
        }
        Err(e) => {
            tracing::error!(error = %e, "group commit failed");
            let _ = conn.batch("ROLLBACK");
            let msg = e.to_string();
            jobs.into_iter().for_each(|job| job.finish(Some(&msg)));
        }
    }
}

/// Runs a batch in one transaction. First without savepoints (they cost
/// the server as much as the writes): when every write succeeds, that is
/// the commit. When one fails, the transaction is rolled back and the batch
/// runs again with each write in its own savepoint, so only the failing
/// ones are left out. A write alone needs neither: if it fails, nothing of
/// its transaction is kept.
fn run_batch(conn: &mut dyn Conn, batch: Vec<Box<dyn Job>>, wrote: &AtomicU64) {
    let changes_before = conn.changes();
    let Some(mut batch) = open(conn, batch) else { return };
    let all_ok = run_all(conn.db(), &mut batch);
    if all_ok && conn.in_transaction() {
        return commit(conn, batch, "", changes_before, wrote);
    }
    if batch.len() == 1 && conn.in_transaction() {
        // Nothing of it is kept; its caller learns its own error.
        if let Err(e) = conn.batch("ROLLBACK") {
            tracing::error!(error = %e, "rollback failed");
        }
        return batch.into_iter().for_each(|job| job.finish(None));
    }
    if conn.in_transaction() {
        let _ = conn.batch("ROLLBACK");
    }
    crate::metrics::get().batch_retries.inc();
    run_in_savepoints(conn, batch, wrote);
}

/// Runs a batch again, each write in its own savepoint: one failing write
/// does not fail its batch-mates.
fn run_in_savepoints(conn: &mut dyn Conn, batch: Vec<Box<dyn Job>>, wrote: &AtomicU64) {
    let changes_before = conn.changes();
    let Some(batch) = open(conn, batch) else { return };
    let mut done: Vec<Box<dyn Job>> = Vec::with_capacity(batch.len());
    let mut jobs = batch.into_iter();
    // The end of one write's savepoint goes with the start of the next (one
    // round trip, not two).
    let mut end = "";
    while let Some(mut job) = jobs.next() {
        if let Err(e) = conn.defer(&format!("{end}SAVEPOINT w")) {
            tracing::error!(error = %e, "savepoint failed");
        }
        let ok = job.run(conn.db());
        done.push(job);
        if !conn.in_transaction() {
            // The whole transaction is gone (SQLite rolled it back on disk
            // full or an I/O error; the PostgreSQL connection dropped): the
            // writes released before this one are gone with it. Each of them
            // fails; the rest of the queue runs in a new transaction.
            let msg = "the store rolled the transaction back (disk full, I/O error or a lost connection); nothing of it was written";
            tracing::error!("{msg}");
            done.into_iter().for_each(|job| job.finish(Some(msg)));
            let rest: Vec<Box<dyn Job>> = jobs.collect();
            if !rest.is_empty() {
                run_in_savepoints(conn, rest, wrote);
            }
            return;
        }
        end = if ok { "RELEASE w; " } else { "ROLLBACK TO w; RELEASE w; " };
    }
    commit(conn, done, end, changes_before, wrote);
}
