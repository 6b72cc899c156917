//! The store: the only module that writes SQL.
//!
//! SQLite has one owner. All writes go to one writer thread that owns the
//! write connection; it takes every write waiting in its queue, runs them in
//! one `BEGIN IMMEDIATE` transaction — each in its own savepoint, so one
//! failing write does not fail its batch-mates — commits, and only then
//! acknowledges each caller (group commit). Reads use a small pool of
//! read-only connections on blocking threads and never wait for the writer.
//!
//! Every state write calls the transition table in `apollo_shared::state`
//! first; a refused transition leaves the row as it was, is logged as a
//! warning and raised as an alert.

mod leases;
mod ops;
mod read;
mod records;
mod rows;
mod schema;
mod write;

pub use read::ListFilter;
pub use write::{Claimed, Decide, FailurePlan, NewInstance};

use crate::bus::Bus;
use apollo_shared::state::IllegalTransition;
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use tokio::sync::oneshot;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("{0}")]
    Illegal(#[from] IllegalTransition),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("commit failed: {0}")]
    Commit(String),
    /// The database cannot be written (disk full, read-only, I/O error).
    #[error("{0}")]
    Unwritable(String),
    #[error("the store is closed")]
    Closed,
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// A write queued for the writer thread.
trait Job: Send {
    /// Runs inside the batch transaction; returns whether it succeeded and
    /// what to tell the caller once the batch has committed (or failed to).
    fn run(self: Box<Self>, conn: &Connection) -> (bool, Ack);
    /// Tells the caller the write never ran.
    fn abort(self: Box<Self>, why: &str);
}
type Ack = Box<dyn FnOnce(Option<&str>) + Send>;

struct FnJob<F, D> {
    f: F,
    deliver: D,
}

impl<R, F, D> Job for FnJob<F, D>
where
    R: Send + 'static,
    F: FnOnce(&Connection) -> Result<R> + Send,
    D: FnOnce(Result<R>) + Send + 'static,
{
    fn run(self: Box<Self>, conn: &Connection) -> (bool, Ack) {
        let FnJob { f, deliver } = *self;
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
}

/// Largest number of writes grouped into one transaction.
const MAX_BATCH: usize = 1024;
const READERS: usize = 4;
/// SQLite's page cache of the writer, in KiB (negative: a size, not pages).
const CACHE_KIB: i64 = -32 * 1024;

/// A cheap handle; clones share the writer and the read pool.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Mutex<Option<mpsc::Sender<Box<dyn Job>>>>,
    writer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    readers: Mutex<Vec<Connection>>,
    bus: Bus,
    /// Who writes, for the history (`agent:<host>:<pid>`).
    agent: String,
    /// Why writes fail, while the database cannot be written, and the count
    /// of commits that changed something when that was noticed.
    unwritable: Mutex<Option<(String, u64)>>,
    /// Commits that changed something (a commit that changed nothing writes
    /// nothing, so it proves nothing about the disk).
    wrote: Arc<std::sync::atomic::AtomicU64>,
}

/// Whether an error means the database file cannot be written at all (as
/// opposed to a refused or malformed write), and why.
fn storage_failure(e: &StoreError) -> Option<String> {
    use rusqlite::ErrorCode::*;
    let text = match e {
        StoreError::Sql(rusqlite::Error::SqliteFailure(f, m)) => match f.code {
            DiskFull | ReadOnly | SystemIoFailure | CannotOpen => m.clone().unwrap_or_else(|| f.to_string()),
            _ => return None,
        },
        StoreError::Commit(m) => m.clone(),
        _ => return None,
    };
    let lower = text.to_ascii_lowercase();
    ["full", "readonly", "read-only", "i/o", "unable to open", "rolled the transaction back"]
        .iter()
        .any(|w| lower.contains(w))
        .then_some(text)
}

impl Store {
    /// Opens (creating and migrating if needed) the database at `path`.
    /// `synchronous_full` chooses power-loss durability over speed.
    pub fn open(path: &Path, synchronous_full: bool, bus: Bus, agent: String) -> anyhow::Result<Store> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", if synchronous_full { "FULL" } else { "NORMAL" })?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        // The pages every write touches (the heads of the indexes) stay
        // cached however large the history grows.
        conn.pragma_update(None, "cache_size", CACHE_KIB)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        schema::migrate(&mut conn)?;
        let (tx, rx) = mpsc::channel::<Box<dyn Job>>();
        let wrote = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = wrote.clone();
        let thread = std::thread::Builder::new()
            .name("apollo-store-writer".into())
            .spawn(move || writer_loop(conn, rx, &counter))?;
        Ok(Store {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                writer: Mutex::new(Some(tx)),
                writer_thread: Mutex::new(Some(thread)),
                readers: Mutex::new(Vec::new()),
                bus,
                agent,
                unwritable: Mutex::new(None),
                wrote,
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    pub fn agent(&self) -> &str {
        &self.inner.agent
    }

    pub fn bus(&self) -> &Bus {
        &self.inner.bus
    }

    /// Runs `f` in the next group-commit batch and returns its result once
    /// the batch is durable. A refused transition is also raised as an alert.
    pub async fn write<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.submit(f, move |r| {
            let _ = tx.send(r);
        })?;
        let result = rx.await.map_err(|_| StoreError::Closed)?;
        let result = self.note_health(result);
        if let Err(StoreError::Illegal(e)) = &result {
            tracing::warn!(error = %e, "refused an illegal transition");
            let message = e.to_string();
            // The refused write's savepoint was rolled back; the alert is a write
            // of its own, durable before the caller hears of the refusal.
            let (tx, rx) = oneshot::channel();
            let alert = self.submit(
                move |c| records::insert_alert(c, "illegal_transition", &message, None),
                move |r| {
                    let _ = tx.send(r);
                },
            );
            if alert.is_ok() {
                let _ = rx.await;
            }
            self.bus().publish(
                "alerts",
                "alert.raised",
                serde_json::json!({ "kind": "illegal_transition", "message": e.to_string() }),
            );
        }
        result
    }

    /// Why the store cannot be written now, if it cannot.
    pub fn unwritable(&self) -> Option<String> {
        self.inner.unwritable.lock().expect("unwritable").as_ref().map(|(m, _)| m.clone())
    }

    /// Tracks whether the database can be written: the first write that fails
    /// for want of space, permissions or I/O raises an alert (on the bus: the
    /// alerts table cannot take it then) and turns the error into one that
    /// says so; the first write that succeeds again records both alerts.
    fn note_health<R>(&self, result: Result<R>) -> Result<R> {
        match &result {
            Err(e) => {
                let Some(why) = storage_failure(e) else { return result };
                let dir = self.inner.path.parent().unwrap_or(std::path::Path::new(".")).display().to_string();
                let message = format!(
                    "the store {} cannot be written ({why}); new work is refused and running steps wait — \
                     free space on {dir} or make it writable, and the agent resumes by itself",
                    self.inner.path.display()
                );
                let wrote = self.inner.wrote.load(std::sync::atomic::Ordering::SeqCst);
                let mut state = self.inner.unwritable.lock().expect("unwritable");
                if state.is_none() {
                    tracing::error!("{message}");
                    self.bus().publish(
                        "alerts",
                        "alert.raised",
                        serde_json::json!({ "kind": "store_unwritable", "message": message }),
                    );
                }
                *state = Some((message.clone(), wrote));
                Err(StoreError::Unwritable(message))
            }
            Ok(_) => {
                let wrote = self.inner.wrote.load(std::sync::atomic::Ordering::SeqCst);
                let was = {
                    let mut state = self.inner.unwritable.lock().expect("unwritable");
                    // Writable again only once a commit has changed something since.
                    if state.as_ref().is_some_and(|(_, at)| wrote > *at) {
                        state.take().map(|(m, _)| m)
                    } else {
                        None
                    }
                };
                if let Some(message) = was {
                    let back = format!("the store {} can be written again", self.inner.path.display());
                    tracing::info!("{back}");
                    self.bus().publish(
                        "alerts",
                        "alert.raised",
                        serde_json::json!({ "kind": "store_writable", "message": back }),
                    );
                    let _ = self.submit(
                        move |c| {
                            records::insert_alert(c, "store_unwritable", &message, None)?;
                            records::insert_alert(c, "store_writable", &back, None)
                        },
                        |_| {},
                    );
                }
                result
            }
        }
    }

    fn submit<R, F, D>(&self, f: F, deliver: D) -> Result<()>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R> + Send + 'static,
        D: FnOnce(Result<R>) + Send + 'static,
    {
        let job: Box<dyn Job> = Box::new(FnJob { f, deliver });
        let guard = self.inner.writer.lock().expect("writer lock");
        let sender = guard.as_ref().ok_or(StoreError::Closed)?;
        sender.send(job).map_err(|_| StoreError::Closed)
    }

    /// Runs a query on a read-only connection on a blocking thread.
    pub async fn read<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R> + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.read_blocking(f)).await.map_err(|_| StoreError::Closed)?
    }

    pub fn read_blocking<R, F>(&self, f: F) -> Result<R>
    where
        F: FnOnce(&Connection) -> Result<R>,
    {
        let conn = self.inner.readers.lock().expect("reader pool").pop();
        let conn = match conn {
            Some(c) => c,
            None => {
                let c = Connection::open_with_flags(
                    &self.inner.path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI,
                )?;
                c.busy_timeout(std::time::Duration::from_secs(5))?;
                c.pragma_update(None, "cache_size", CACHE_KIB / 4)?;
                c
            }
        };
        let result = f(&conn);
        let mut pool = self.inner.readers.lock().expect("reader pool");
        if pool.len() < READERS {
            pool.push(conn);
        }
        result
    }

    /// Stops the writer after it has committed everything queued so far.
    pub fn close(&self) {
        self.inner.writer.lock().expect("writer lock").take();
        if let Some(t) = self.inner.writer_thread.lock().expect("writer thread").take() {
            let _ = t.join();
        }
        self.inner.readers.lock().expect("reader pool").clear();
    }
}

/// Copies the database at `db` to `to` with SQLite's online backup API: a
/// consistent snapshot even while an agent writes (the copy is taken in one
/// read transaction), checked with `PRAGMA quick_check`, written to a
/// `.partial` file and renamed, so `to` is whole or absent.
pub fn backup(db: &Path, to: &Path) -> anyhow::Result<String> {
    use anyhow::Context as _;
    if !db.exists() {
        anyhow::bail!("{}: no store here (is --data-dir or the config right?)", db.display());
    }
    let src = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .with_context(|| format!("{}: cannot open the store", db.display()))?;
    src.busy_timeout(std::time::Duration::from_secs(30))?;
    let partial = to.with_extension("partial");
    let _ = std::fs::remove_file(&partial);
    {
        let mut dst = Connection::open(&partial).with_context(|| format!("{}: cannot create", partial.display()))?;
        let b = rusqlite::backup::Backup::new(&src, &mut dst)?;
        // Every page in one step: one read transaction, one snapshot.
        loop {
            use rusqlite::backup::StepResult;
            match b.step(-1).with_context(|| format!("copying {} to {}", db.display(), partial.display()))? {
                StepResult::Done => break,
                StepResult::More | StepResult::Busy | StepResult::Locked => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                _ => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
    }
    let dst = Connection::open(&partial)?;
    let check: String = dst.query_row("PRAGMA quick_check", [], |r| r.get(0))?;
    if check != "ok" {
        anyhow::bail!("{}: the copy does not check out: {check}", partial.display());
    }
    let instances: i64 = dst.query_row("SELECT COUNT(*) FROM task_instances", [], |r| r.get(0))?;
    let version: i64 = dst.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    drop(dst);
    std::fs::rename(&partial, to).with_context(|| format!("{}: cannot rename into place", to.display()))?;
    Ok(format!("{}: backup of {} ({instances} instances, schema {version})", to.display(), db.display()))
}

fn writer_loop(conn: Connection, rx: mpsc::Receiver<Box<dyn Job>>, wrote: &std::sync::atomic::AtomicU64) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        run_batch(&conn, batch, wrote);
    }
}

fn run_batch(conn: &Connection, batch: Vec<Box<dyn Job>>, wrote: &std::sync::atomic::AtomicU64) {
    let changes_before = conn.total_changes();
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let msg = e.to_string();
        // Nothing ran; each caller learns why.
        batch.into_iter().for_each(|job| job.abort(&msg));
        return;
    }
    let mut acks = Vec::with_capacity(batch.len());
    let mut jobs = batch.into_iter();
    while let Some(job) = jobs.next() {
        if let Err(e) = conn.execute_batch("SAVEPOINT w") {
            tracing::error!(error = %e, "savepoint failed");
        }
        let (ok, ack) = job.run(conn);
        acks.push(ack);
        if conn.is_autocommit() {
            // SQLite rolled the whole transaction back (disk full, I/O error):
            // the writes released before this one are gone with it. Each of
            // them fails; the rest of the queue runs in a new transaction.
            let msg = "the store rolled the transaction back (disk full or I/O error); nothing of it was written";
            tracing::error!("{msg}");
            acks.into_iter().for_each(|ack| ack(Some(msg)));
            let rest: Vec<Box<dyn Job>> = jobs.collect();
            if !rest.is_empty() {
                run_batch(conn, rest, wrote);
            }
            return;
        }
        let end = if ok { "RELEASE w" } else { "ROLLBACK TO w; RELEASE w" };
        if let Err(e) = conn.execute_batch(end) {
            tracing::error!(error = %e, "savepoint release failed");
        }
    }
    crate::crash_point!("store.before_commit");
    let committing = std::time::Instant::now();
    let m = crate::metrics::get();
    m.batch_size.observe(acks.len() as f64);
    let committed = conn.execute_batch("COMMIT");
    m.commit_seconds.observe(committing.elapsed().as_secs_f64());
    match committed {
        Ok(()) => {
            if conn.total_changes() > changes_before {
                wrote.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            crate::crash_point!("store.after_commit");
            acks.into_iter().for_each(|ack| ack(None))
        }
        Err(e) => {
            tracing::error!(error = %e, "group commit failed");
            let _ = conn.execute_batch("ROLLBACK");
            let msg = e.to_string();
            acks.into_iter().for_each(|ack| ack(Some(&msg)));
        }
    }
}
