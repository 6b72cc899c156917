//! The writer threads: each takes every write waiting in the queue, runs
//! them in one transaction — each in its own savepoint, so one failing write
//! does not fail its batch-mates — commits, and only then acknowledges each
//! caller (group commit). SQLite has one; a PostgreSQL store has several,
//! each with its own connection.

use super::db::Db;
use super::{leases, Result, StoreError};
use std::sync::{mpsc, Mutex};

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

/// A write queued for the writer thread.
pub(super) trait Job: Send {
    /// Runs inside the batch transaction; returns whether it succeeded and
    /// what to tell the caller once the batch has committed (or failed to).
    fn run(self: Box<Self>, conn: &dyn Db) -> (bool, Ack);
    /// Tells the caller the write never ran.
    fn abort(self: Box<Self>, why: &str);
    /// Whether it takes the cluster's turn (claims, takeovers): its batch
    /// takes the turn first, before any row lock, so no two agents' batches
    /// can wait for each other.
    fn in_turn(&self) -> bool;
}
pub(super) type Ack = Box<dyn FnOnce(Option<&str>) + Send>;

pub(super) struct FnJob<F, D> {
    pub f: F,
    pub deliver: D,
    pub turn: bool,
}

impl<R, F, D> Job for FnJob<F, D>
where
    R: Send + 'static,
    F: FnOnce(&dyn Db) -> Result<R> + Send,
    D: FnOnce(Result<R>) + Send + 'static,
{
    fn run(self: Box<Self>, conn: &dyn Db) -> (bool, Ack) {
        let FnJob { f, deliver, .. } = *self;
        let result = f(conn);
        let ok = result.is_ok();
        let ack: Ack = Box::new(move |commit_error| match (commit_error, result) {
            (Some(e), Ok(_)) => deliver(Err(StoreError::Commit(e.to_string()))),
            (_, r) => deliver(r),
        });
        (ok, ack)
    }

    fn abort(self: Box<Self>, why: &str) {
        (self.deliver)(Err(StoreError::Commit(why.to_string())))
    }

    fn in_turn(&self) -> bool {
        self.turn
    }
}

/// Largest number of writes grouped into one transaction.
const MAX_BATCH: usize = 1024;
pub(super) fn writer_loop(
    mut conn: Box<dyn Conn>,
    rx: &Mutex<mpsc::Receiver<Box<dyn Job>>>,
    wrote: &std::sync::atomic::AtomicU64,
) {
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

fn run_batch(conn: &mut dyn Conn, batch: Vec<Box<dyn Job>>, wrote: &std::sync::atomic::AtomicU64) {
    let changes_before = conn.changes();
    if let Err(e) = conn.reopen().and_then(|()| conn.begin()) {
        let msg = e.to_string();
        // Nothing ran; each caller learns why.
        batch.into_iter().for_each(|job| job.abort(&msg));
        return;
    }
    if batch.iter().any(|j| j.in_turn()) {
        if let Err(e) = leases::take_turn(conn) {
            let msg = e.to_string();
            let _ = conn.batch("ROLLBACK");
            batch.into_iter().for_each(|job| job.abort(&msg));
            return;
        }
    }
    let mut acks = Vec::with_capacity(batch.len());
    // A write alone in its batch needs no savepoint: if it fails, the whole
    // transaction is rolled back instead of committed.
    let alone = batch.len() == 1;
    let mut failed_alone = false;
    let mut jobs = batch.into_iter();
    // The end of one write's savepoint goes with the start of the next (one
    // round trip, not two).
    let mut end = "";
    while let Some(job) = jobs.next() {
        if !alone {
            if let Err(e) = conn.defer(&format!("{end}SAVEPOINT w")) {
                tracing::error!(error = %e, "savepoint failed");
            }
        }
        let (ok, ack) = job.run(conn.db());
        failed_alone = alone && !ok;
        acks.push(ack);
        if !conn.in_transaction() {
            // The whole transaction is gone (SQLite rolled it back on disk
            // full or an I/O error; the PostgreSQL connection dropped): the
            // writes released before this one are gone with it. Each of them
            // fails; the rest of the queue runs in a new transaction.
            let msg = "the store rolled the transaction back (disk full, I/O error or a lost connection); nothing of it was written";
            tracing::error!("{msg}");
            acks.into_iter().for_each(|ack| ack(Some(msg)));
            let rest: Vec<Box<dyn Job>> = jobs.collect();
            if !rest.is_empty() {
                run_batch(conn, rest, wrote);
            }
            return;
        }
        end = match (alone, ok) {
            (true, _) => "",
            (false, true) => "RELEASE w; ",
            (false, false) => "ROLLBACK TO w; RELEASE w; ",
        };
    }
    if failed_alone {
        // Nothing of it is kept; its caller learns its own error.
        if let Err(e) = conn.batch("ROLLBACK") {
            tracing::error!(error = %e, "rollback failed");
        }
        acks.into_iter().for_each(|ack| ack(None));
        return;
    }
    crate::crash_point!("store.before_commit");
    let committing = std::time::Instant::now();
    let m = crate::metrics::get();
    m.batch_size.observe(acks.len() as f64);
    let committed = conn.batch(&format!("{end}COMMIT"));
    m.commit_seconds.observe(committing.elapsed().as_secs_f64());
    match committed {
        Ok(()) => {
            if conn.changes() > changes_before {
                wrote.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            crate::crash_point!("store.after_commit");
            acks.into_iter().for_each(|ack| ack(None))
        }
        Err(e) => {
            tracing::error!(error = %e, "group commit failed");
            let _ = conn.batch("ROLLBACK");
            let msg = e.to_string();
            acks.into_iter().for_each(|ack| ack(Some(&msg)));
        }
    }
}
