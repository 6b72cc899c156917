//! The `Store` handle: the writer threads and their queue, the reader
//! pools, and which backend they reach. Operations on it live in `ops`,
//! `read`, `records` and `leases`.

use super::db::{Db, Driver};
use super::location::Location;
use super::postgres;
use super::writer::{writer_loop, Job, Pending, Work};
use super::{listen, records, schema, sqlite, Conn, Result, StoreError};
use crate::bus::Bus;
use apollo_shared::protocol::{AlertKind, EventData, Raised, Topic};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use tokio::sync::oneshot;

mod reads;

/// Reader connections a SQLite store keeps open.
const READERS: usize = 4;
/// Writer connections (and threads) of a PostgreSQL store. Two: one's
/// round trips overlap the other's, and batches stay large enough for the
/// steps' SUCCESS writes to be made together (`pg_bench 3000 1 1`, one
/// agent: 1 writer 793/762/s, 2 1,297/1,244, 3 1,217/1,104, 4 1,106/1,232).
const PG_WRITERS: usize = 2;

/// A connection for queries, on either backend.
type Reader = Box<dyn Db + Send>;

/// An idle reader, with the count of connection failures seen when it was
/// last used.
type Pooled = (Reader, u64);

/// A cheap handle; clones share the writer and the read pools.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
    /// Reads go to the replica (`database.read_url`), when there is one.
    replica: bool,
}

/// Which database, and how to reach it again.
enum Backend {
    Sqlite { path: PathBuf },
    Postgres { target: Box<postgres::Target>, read: Option<Box<postgres::Target>> },
}

struct Inner {
    backend: Backend,
    writer: Mutex<Option<mpsc::Sender<Box<dyn Job>>>>,
    writer_threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Changes to tell the other agents (PostgreSQL), sent together by one
    /// write; `notes_queued` while that write waits in the queue.
    notes: Mutex<Vec<String>>,
    notes_queued: std::sync::atomic::AtomicBool,
    /// Idle readers.
    readers: Mutex<Vec<Pooled>>,
    /// Idle readers of the replica.
    replica_readers: Mutex<Vec<Pooled>>,
    /// Connection failures seen (a cut, the database gone): an idle reader
    /// pooled before the latest one is checked before it is used again.
    failures: std::sync::atomic::AtomicU64,
    /// How many readers are kept open.
    pool: usize,
    bus: Bus,
    /// Who writes, for the history (`agent:<name>:<pid>`).
    agent: String,
    /// Why writes fail, while the database cannot be written, and the count
    /// of commits that changed something when that was noticed.
    unwritable: Mutex<Option<(String, u64)>>,
    /// Commits that changed something (a commit that changed nothing writes
    /// nothing, so it proves nothing about the disk).
    wrote: Arc<std::sync::atomic::AtomicU64>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // A PostgreSQL connection closes by blocking on its own runtime,
        // which may not happen on a thread that runs async tasks.
        let mut readers = std::mem::take(&mut *self.readers.lock().expect("reader pool"));
        readers.append(&mut self.replica_readers.lock().expect("reader pool"));
        if !readers.is_empty() {
            let _ = std::thread::spawn(move || drop(readers)).join();
        }
    }
}

impl Store {
    /// Opens (creating and migrating if needed) the SQLite database at
    /// `path`. `synchronous_full` chooses power-loss durability over speed.
    pub fn open(path: &Path, synchronous_full: bool, bus: Bus, agent: String) -> anyhow::Result<Store> {
        Store::open_at(Location::Sqlite { path: path.to_path_buf(), synchronous_full, reclaim: false }, bus, agent)
    }

    /// Opens the store at `location`, migrating its schema (a schema newer
    /// than this build knows is refused). Blocks: call it off the async
    /// runtime's threads (PostgreSQL's client runs its own).
    pub fn open_at(location: Location, bus: Bus, agent: String) -> anyhow::Result<Store> {
        let (conns, backend, pool): (Vec<Box<dyn Conn>>, Backend, usize) = match location {
            Location::Sqlite { path, synchronous_full, reclaim } => {
                let writer = sqlite::open_writer(&path, synchronous_full, reclaim)?;
                (vec![Box::new(writer)], Backend::Sqlite { path }, READERS)
            }
            Location::Postgres { target, read, pool } => {
                let connect = || target.connect().map_err(|e| anyhow::anyhow!("{}: cannot connect: {e}", target.shown));
                let mut first = connect()?;
                schema::migrate_postgres(&mut first, &target.schema)
                    .map_err(|e| anyhow::anyhow!("{}: {e:#}", target.shown))?;
                // Several writers, each with its own connection and batches:
                // the round trips of one overlap with the others'.
                let mut conns: Vec<Box<dyn Conn>> = vec![Box::new(first)];
                for _ in 1..PG_WRITERS {
                    conns.push(Box::new(connect()?));
                }
                (conns, Backend::Postgres { target, read }, pool)
            }
        };
        let (tx, rx) = mpsc::channel::<Box<dyn Job>>();
        let rx = Arc::new(Mutex::new(rx));
        let wrote = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut threads = Vec::new();
        for conn in conns {
            let (rx, counter) = (rx.clone(), wrote.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("apollo-store-writer".into())
                    .spawn(move || writer_loop(conn, &rx, &counter))?,
            );
        }
        Ok(Store {
            inner: Arc::new(Inner {
                backend,
                writer: Mutex::new(Some(tx)),
                writer_threads: Mutex::new(threads),
                notes: Mutex::new(Vec::new()),
                notes_queued: std::sync::atomic::AtomicBool::new(false),
                readers: Mutex::new(Vec::new()),
                replica_readers: Mutex::new(Vec::new()),
                failures: std::sync::atomic::AtomicU64::new(0),
                pool,
                bus,
                agent,
                unwritable: Mutex::new(None),
                wrote,
            }),
            replica: false,
        })
    }

    /// The store as `agent.status` and messages name it: `sqlite:PATH` or
    /// the PostgreSQL URL without its password, and the schema.
    pub fn location(&self) -> String {
        match &self.inner.backend {
            Backend::Sqlite { path } => format!("sqlite:{}", path.display()),
            Backend::Postgres { target, .. } => target.shown.clone(),
        }
    }

    /// A handle whose reads go to the replica (`database.read_url`) when
    /// there is one: for what clients list, never for what the agent decides.
    pub fn for_listing(&self) -> Store {
        Store { inner: self.inner.clone(), replica: true }
    }

    /// The backend's driver.
    pub fn driver(&self) -> &'static dyn Driver {
        match self.inner.backend {
            Backend::Sqlite { .. } => &sqlite::DRIVER,
            Backend::Postgres { .. } => &postgres::DRIVER,
        }
    }

    /// Whether several agents share this store (PostgreSQL): changes are
    /// told to the others, and each agent recovers only its own work.
    pub fn shared(&self) -> bool {
        self.driver().shared()
    }

    pub fn agent(&self) -> &str {
        &self.inner.agent
    }

    pub fn bus(&self) -> &Bus {
        &self.inner.bus
    }

    /// Publishes a committed change on this agent's bus and, on a shared
    /// database, to the other agents (a notification after this change's
    /// commit; see [`listen::listen`]).
    pub fn announce(&self, topic: Topic, data: EventData) {
        if self.shared() {
            let payload = listen::note(topic, &data);
            // PostgreSQL carries at most 8000 bytes; a longer one (an alert
            // with a long message) is left to the others' next read.
            if payload.len() < listen::MAX_NOTIFY {
                self.inner.notes.lock().expect("notes").push(payload);
                // One write sends what has gathered by the time it runs.
                if !self.inner.notes_queued.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    let store = self.clone();
                    // Taken at the write's first run and kept: a batch run
                    // again (see `writer::run_batch`) sends the same ones.
                    let taken: Mutex<Option<Vec<String>>> = Mutex::new(None);
                    let _ = self.submit(
                        move |c| {
                            let mut taken = taken.lock().expect("notes taken");
                            let notes = taken.get_or_insert_with(|| {
                                store.inner.notes_queued.store(false, std::sync::atomic::Ordering::SeqCst);
                                std::mem::take(&mut *store.inner.notes.lock().expect("notes"))
                            });
                            listen::notify(c, store.agent(), notes)
                        },
                        |_| {},
                    );
                }
            }
        }
        self.bus().publish(topic, data);
    }

    /// On a shared database: hears the other agents' changes until
    /// `shutdown`, publishing each on this agent's bus and calling `wake`
    /// for changes to instances (new work, or a place freed).
    pub fn listen(
        &self,
        wake: std::sync::Arc<dyn Fn(listen::Change) + Send + Sync>,
        tasks: &crate::shutdown::Shutdown,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let Backend::Postgres { target, .. } = &self.inner.backend else { return None };
        Some(tasks.spawn(listen::listen(
            (**target).clone(),
            self.agent().to_string(),
            self.bus().clone(),
            wake,
            tasks.token(),
        )))
    }

    /// Runs `f` in the next group-commit batch and returns its result once
    /// the batch is durable. A refused transition is also raised as an alert.
    pub async fn write<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: Fn(&dyn Db) -> Result<R> + Send + 'static,
    {
        self.write_job(f, false).await
    }

    /// As [`Store::write`], for a step's SUCCESS: the writer makes those of
    /// one batch together.
    pub(super) async fn write_success(&self, w: super::model::Success) -> Result<(bool, u32)> {
        self.write_job(w, false).await
    }

    /// As [`Store::write`], for a claim or a takeover: on PostgreSQL its
    /// batch takes the cluster's turn before anything else.
    pub(crate) async fn write_in_turn<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: Fn(&dyn Db) -> Result<R> + Send + 'static,
    {
        self.write_job(f, true).await
    }

    async fn write_job<R, W>(&self, f: W, turn: bool) -> Result<R>
    where
        R: Send + 'static,
        W: Work<Out = R> + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.submit_job(
            f,
            move |r| {
                let _ = tx.send(r);
            },
            turn,
        )?;
        let result = rx.await.map_err(|_| StoreError::Closed)?;
        let result = self.note_health(result);
        if let Err(StoreError::Illegal(e)) = &result {
            tracing::warn!(error = %e, "refused an illegal transition");
            let message = e.to_string();
            // The refused write's savepoint was rolled back; the alert is a write
            // of its own, durable before the caller hears of the refusal.
            let (tx, rx) = oneshot::channel();
            let alert = self.submit(
                move |c| records::insert_alert(c, AlertKind::IllegalTransition, &message, None),
                move |r| {
                    let _ = tx.send(r);
                },
            );
            if alert.is_ok() {
                let _ = rx.await;
            }
            let raised = Raised { kind: AlertKind::IllegalTransition, message: e.to_string(), instance: None };
            self.announce(Topic::Alerts, EventData::AlertRaised(raised));
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
                let failure = match self.inner.backend {
                    Backend::Sqlite { .. } => sqlite::storage_failure(e),
                    Backend::Postgres { .. } => postgres::storage_failure(e),
                };
                let Some(why) = failure else { return result };
                self.inner.failures.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let message = match &self.inner.backend {
                    Backend::Sqlite { path } => format!(
                        "the store {} cannot be written ({why}); new work is refused and running steps wait — \
                         free space on {} or make it writable, and the agent resumes by itself",
                        path.display(),
                        path.parent().unwrap_or(Path::new(".")).display()
                    ),
                    Backend::Postgres { target, .. } => format!(
                        "the store {} cannot be reached ({why}); new work is refused and running steps wait — \
                         the agent reconnects by itself",
                        target.shown
                    ),
                };
                let wrote = self.inner.wrote.load(std::sync::atomic::Ordering::SeqCst);
                let mut state = self.inner.unwritable.lock().expect("unwritable");
                if state.is_none() {
                    tracing::error!("{message}");
                    let raised = Raised { kind: AlertKind::StoreUnwritable, message: message.clone(), instance: None };
                    self.bus().publish(Topic::Alerts, EventData::AlertRaised(raised));
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
                    let back = format!("the store {} can be written again", self.location());
                    tracing::info!("{back}");
                    let raised = Raised { kind: AlertKind::StoreWritable, message: back.clone(), instance: None };
                    self.bus().publish(Topic::Alerts, EventData::AlertRaised(raised));
                    let _ = self.submit(
                        move |c| {
                            records::insert_alert(c, AlertKind::StoreUnwritable, &message, None)?;
                            records::insert_alert(c, AlertKind::StoreWritable, &back, None)
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
        F: Fn(&dyn Db) -> Result<R> + Send + 'static,
        D: FnOnce(Result<R>) + Send + 'static,
    {
        self.submit_job(f, deliver, false)
    }

    fn submit_job<R, W, D>(&self, work: W, deliver: D, turn: bool) -> Result<()>
    where
        R: Send + 'static,
        W: Work<Out = R> + 'static,
        D: FnOnce(Result<R>) + Send + 'static,
    {
        let job: Box<dyn Job> = Box::new(Pending { work, deliver, turn, result: None });
        let guard = self.inner.writer.lock().expect("writer lock");
        let sender = guard.as_ref().ok_or(StoreError::Closed)?;
        sender.send(job).map_err(|_| StoreError::Closed)
    }

    /// Stops the writer after it has committed everything queued so far.
    pub fn close(&self) {
        self.inner.writer.lock().expect("writer lock").take();
        for t in std::mem::take(&mut *self.inner.writer_threads.lock().expect("writer threads")) {
            let _ = t.join();
        }
        let mut readers = std::mem::take(&mut *self.inner.readers.lock().expect("reader pool"));
        readers.append(&mut self.inner.replica_readers.lock().expect("reader pool"));
        let _ = std::thread::spawn(move || drop(readers)).join();
    }
}
