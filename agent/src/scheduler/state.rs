//! The scheduler's state: what its loop, its executors and its claims
//! share, and the calls on it that start nothing (the settings, the retry
//! clock, the definitions by version, a cancel).

use crate::catalog::Catalog;
use crate::config::Config;
use crate::handles::StopReason;
use crate::plugins::Plugins;
use crate::repeats::Repeats;
use crate::settings::Settings;
use crate::store::Store;
use apollo_shared::def::TaskDef;
use chrono::Utc;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// An instance an executor is working on.
pub struct Active {
    pub token: CancellationToken,
    pub why: Mutex<Option<StopReason>>,
    pub started: Instant,
    /// Becomes true when the executor has finished.
    pub done: watch::Sender<bool>,
}

pub struct Scheduler {
    pub store: Store,
    pub catalog: Arc<RwLock<Catalog>>,
    pub registry: Arc<Plugins>,
    pub settings: Arc<Settings>,
    pub data_dir: PathBuf,
    pub tasks_dir: PathBuf,
    /// `agent.name` (or the host name), read once: it changes only at a restart.
    pub name: String,
    pub(super) wake: Notify,
    /// When the next RETRYING instance falls due, as far as this agent knows:
    /// set when a retry is scheduled, re-read from the store when it passes.
    pub(super) retry_due: Mutex<Option<chrono::DateTime<Utc>>>,
    /// When the earliest pause holding work back ends (the claim says).
    pub(super) pause_ends: Arc<crate::store::PauseEnds>,
    pub(super) active: Mutex<HashMap<String, Arc<Active>>>,
    /// Items this agent runs for other agents' fan-out steps.
    pub(super) helping: Mutex<Vec<Helping>>,
    /// Every item running here, the step's own agent's and its helpers'.
    pub(super) in_hand: InHand,
    pub(super) slots: Slots,
    pub(super) tracker: TaskTracker,
    pub(super) shutdown: CancellationToken,
    /// The wall clock and the monotonic clock read together, to notice the
    /// wall clock jumping (see [`Scheduler::watch_clock`]).
    pub(super) clock_anchor: Mutex<(chrono::DateTime<Utc>, Instant)>,
    /// Notified when the wall clock jumped (the schedules look again).
    pub clock_jumped: Arc<Notify>,
    /// Instances whose executors stopped on a store error: taken up again
    /// as soon as the store can be written.
    pub(super) stalled: Mutex<Vec<String>>,
    /// The store's work of each turn that can fail turn after turn while
    /// the store is out of reach: each logged once, then as a count.
    pub(super) failing: Failing,
    /// What claims ask: can this agent run a definition version. Its
    /// parsed versions by hash are also the executors' (an instance runs the
    /// version it was created with; see [`Scheduler::def_for`]).
    pub(super) capable: crate::store::capable::Capable,
    /// (task, def_hash, pins) whose `no_capable_agent` alert is raised
    /// (again when a capable agent came and went).
    pub(super) uncapable: Mutex<std::collections::BTreeSet<crate::store::capable::Passed>>,
    /// What makes a sub-runbook's child instance (set once the triggers exist).
    pub children: std::sync::OnceLock<Arc<dyn crate::handles::Children>>,
    /// The sweep of the files instances that have left leave behind
    /// (`leftovers.rs`).
    pub(super) sweeps: Sweeps,
}

/// When the last sweep of leftover files began, and whether one runs.
#[derive(Default)]
pub(super) struct Sweeps {
    pub(super) last: Mutex<Option<Instant>>,
    pub(super) running: AtomicBool,
}

/// A helper: it runs items of another agent's step, one after another.
pub(super) struct Helping {
    /// Tells the helpers apart.
    pub key: u64,
    pub token: CancellationToken,
}

/// The items running on this agent (instance, step, index), whoever runs
/// them here. An item is put in hand by the write that claims it, before
/// that write commits, and leaves the hand when its run ends (or is
/// dropped): a new life of the step, whose write waits for the claims
/// under way, keeps exactly the items that still run here.
#[derive(Clone, Default)]
pub(crate) struct InHand(Arc<Mutex<HashMap<ItemAt, u32>>>);

/// An item's place: its instance, step and index.
type ItemAt = (String, u32, u32);

/// An item held in hand until this is dropped.
pub(crate) struct Held {
    hand: InHand,
    key: ItemAt,
}

impl InHand {
    pub(crate) fn take(&self, id: &str, seq: u32, index: u32) -> Held {
        let key = (id.to_string(), seq, index);
        *self.0.lock().expect("in hand").entry(key.clone()).or_default() += 1;
        Held { hand: self.clone(), key }
    }

    pub(crate) fn has(&self, id: &str, seq: u32, index: u32) -> bool {
        self.0.lock().expect("in hand").contains_key(&(id.to_string(), seq, index))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut hand = self.hand.0.lock().expect("in hand");
        if let Some(n) = hand.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                hand.remove(&self.key);
            }
        }
    }
}

/// One [`Repeats`] for each store call the loop makes every turn.
pub(super) struct Failing {
    pub(super) retry_due: Repeats,
    pub(super) leases: Repeats,
    pub(super) heartbeat: Repeats,
    pub(super) lease_check: Repeats,
    pub(super) fold: Repeats,
    pub(super) archive: Repeats,
    pub(super) claim: Repeats,
    pub(super) reaper: Repeats,
    pub(super) parents: Repeats,
}

impl Failing {
    const fn new() -> Failing {
        Failing {
            retry_due: Repeats::new("cannot read the next retry time"),
            leases: Repeats::new("lease renewal failed"),
            heartbeat: Repeats::new("heartbeat not recorded"),
            lease_check: Repeats::new("lease check failed"),
            fold: Repeats::new("state counts not folded"),
            archive: Repeats::new("archiving failed"),
            claim: Repeats::new("claim failed"),
            reaper: Repeats::new("the zombie reaper cannot read the store"),
            parents: Repeats::new("cannot release parents whose child ended"),
        }
    }
}

/// Logs a failing call through its [`Repeats`], or that it works again.
pub(super) fn noted<T, E: std::fmt::Display>(r: Result<T, E>, repeats: &Repeats) -> Option<T> {
    match r {
        Ok(v) => {
            repeats.ok();
            Some(v)
        }
        Err(e) => {
            repeats.failed(&e);
            None
        }
    }
}

pub(super) struct Slots {
    /// Slots held by claims in flight: what runs plus these never exceeds
    /// `scheduler.concurrency`.
    pub(super) reserved: Mutex<usize>,
    /// Whether work may be waiting for a slot here: the loop was woken and
    /// has not looked yet, or its last claim filled every free slot or left
    /// work a limit held back. Then an ending instance wakes the loop, and a
    /// trigger leaves its claim to the loop (which claims in batches).
    pub(super) backlog: AtomicBool,
    /// Whether the last claim left runnable work that a limit, an ordered
    /// queue or the claim's size held back: then another agent's instance
    /// that ends may make room for it here.
    pub(super) limited: AtomicBool,
    /// Told when a claim of the loop's releases the slots it held: a
    /// trigger that found them all held by it waits for that instead of
    /// leaving its claim to the loop's next turn.
    pub(super) released: Arc<tokio::sync::Notify>,
    /// Whether a claim of the loop holds slots now.
    pub(super) looping: AtomicBool,
}

impl Slots {
    pub(super) fn new() -> Slots {
        // Down at the start: the loop's first turn claims whatever waits
        // from before, and a trigger's claim takes what comes first anyway.
        // (Up, a trigger right after the start would wait for that turn.)
        Slots {
            reserved: Mutex::new(0),
            backlog: AtomicBool::new(false),
            limited: AtomicBool::new(false),
            released: Arc::default(),
            looping: AtomicBool::new(false),
        }
    }

    /// Work may be waiting (the loop is to look).
    pub(super) fn note_backlog(&self) {
        self.backlog.store(true, Ordering::Relaxed);
    }

    pub(super) fn backlog(&self) -> bool {
        self.backlog.load(Ordering::Relaxed)
    }
}

impl Scheduler {
    pub fn new(
        store: Store,
        catalog: Arc<RwLock<Catalog>>,
        registry: Arc<Plugins>,
        settings: Arc<Settings>,
        shutdown: CancellationToken,
    ) -> Arc<Scheduler> {
        let config = settings.get();
        let plugins = registry.clone();
        let rollouts = registry.rollout_cell();
        let can_run = Arc::new(move |d: &TaskDef, pins: Option<&str>| {
            let pins: Option<apollo_shared::protocol::Pins> = pins.and_then(|p| serde_json::from_str(p).ok());
            let registry = plugins.view(pins.as_ref());
            d.steps.iter().all(|s| registry.resolve(&s.plugin, s.version.as_deref()).is_ok())
        });
        Arc::new(Scheduler {
            data_dir: config.data_dir(),
            tasks_dir: config.tasks_dir(),
            name: config.agent_name(),
            store,
            catalog,
            registry,
            settings,
            wake: Notify::new(),
            retry_due: Mutex::new(None),
            pause_ends: Arc::default(),
            active: Mutex::new(HashMap::new()),
            helping: Mutex::new(Vec::new()),
            in_hand: InHand::default(),
            slots: Slots::new(),
            tracker: TaskTracker::new(),
            shutdown,
            clock_anchor: Mutex::new((Utc::now(), Instant::now())),
            clock_jumped: Arc::new(Notify::new()),
            stalled: Mutex::new(Vec::new()),
            failing: Failing::new(),
            capable: crate::store::capable::Capable::new(can_run, rollouts),
            uncapable: Mutex::new(Default::default()),
            children: std::sync::OnceLock::new(),
            sweeps: Default::default(),
        })
    }
    /// The settings in force now (SIGHUP may change them between two reads).
    pub fn config(&self) -> Arc<Config> {
        self.settings.get()
    }
    /// Notes a retry scheduled for `at`, so the loop wakes for it.
    pub fn retry_at(&self, at: chrono::DateTime<Utc>) {
        let mut due = self.retry_due.lock().expect("retry due");
        if due.is_none_or(|d| at < d) {
            *due = Some(at);
            drop(due);
            self.wake();
        }
    }
    /// The first retry due after `after`, from the store.
    pub(super) async fn load_retry_due(&self, after: chrono::DateTime<Utc>) {
        if let Some(t) = noted(self.store.next_retry_due(after).await, &self.failing.retry_due) {
            *self.retry_due.lock().expect("retry due") = t;
        }
    }
    /// Asks the loop to look for work now; until it has, triggers leave
    /// their claims to it.
    pub fn wake(&self) {
        self.slots.note_backlog();
        self.wake.notify_one();
    }
    /// Instances executed here and items run here for other agents' steps.
    pub fn running(&self) -> usize {
        self.active.lock().expect("active").len() + self.helping.lock().expect("helping").len()
    }
    /// Whether this agent takes work of `queue` (`queues.<q>.agents`).
    pub fn serves(&self, queue: &str) -> bool {
        let config = self.config();
        config.scheduler.queues.get(queue).is_none_or(|q| q.agents.is_empty() || q.agents.contains(&self.name))
    }
    /// How long a claim holds an instance without renewal (measured by the
    /// store's clock).
    pub(super) fn lease(&self) -> Duration {
        self.config().scheduler.lease
    }
    pub(super) fn queue_policy(&self) -> crate::store::QueuePolicy {
        let config = self.config();
        let queues = &config.scheduler.queues;
        crate::store::QueuePolicy {
            limits: queues.iter().filter_map(|(q, c)| c.limit.map(|l| (q.clone(), l))).collect(),
            excluded: config.queues_excluded(&self.name),
            ordered: queues.iter().filter(|(_, c)| c.ordered).map(|(q, _)| q.clone()).collect(),
            affinity: queues
                .iter()
                .filter(|(_, c)| c.affinity.is_some())
                .map(|(q, c)| (q.clone(), c.agents.clone()))
                .collect(),
            me: self.name.clone(),
            capable: Some(self.capable.clone()),
            frozen: config.scheduler.frozen_at(Utc::now()),
            pause_ends: Some(self.pause_ends.clone()),
        }
    }
    /// Whether the store answers a read now.
    pub(super) async fn store_answers(&self) -> bool {
        self.store.counts().await.is_ok()
    }
    /// What this agent says of itself in the store (`apollo agents`).
    pub fn heartbeat(&self) -> crate::store::Heartbeat {
        let config = self.config();
        crate::store::Heartbeat {
            name: self.name.clone(),
            host: nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default(),
            version: env!("CARGO_PKG_VERSION").into(),
            queues: config.queues_served(&self.name),
            running: self.running(),
            lease_secs: config.scheduler.lease.as_secs_f64(),
            plugins: self.registry.get().all().map(|r| r.cap()).collect(),
        }
    }
    /// The sum of a definition's step timeouts.
    pub fn expected_for(&self, d: &TaskDef) -> f64 {
        self.step_timeouts(d).iter().sum()
    }
    /// Each step's timeout in seconds without history: its own, else its
    /// plugin registration's fixed one, else `scheduler.default_timeout`.
    pub fn step_timeouts(&self, d: &TaskDef) -> Vec<f64> {
        let plugins = self.registry.get();
        d.steps
            .iter()
            .map(|s| match plugins.resolve(&s.plugin, s.version.as_deref()) {
                Ok(reg) => crate::timeouts::fixed(s, reg).timeout.as_secs_f64(),
                Err(_) => match s.timeout {
                    Some(apollo_shared::def::Timeout::Secs(secs)) => secs,
                    _ => self.config().scheduler.default_timeout.as_secs_f64(),
                },
            })
            .collect()
    }
    /// The definition version with this hash: from the catalog when it is
    /// the one in force, else parsed from the store's copy.
    pub async fn def_for(&self, hash: &str) -> Result<Arc<TaskDef>, String> {
        // One cache of parsed versions with the claims' (`Capable::defs`).
        if let Some(Some(d)) = self.capable.defs.lock().expect("defs").get(hash) {
            return Ok(d.clone());
        }
        let current =
            self.catalog.read().expect("catalog").defs.values().find(|l| l.hash == hash).map(|l| l.def.clone());
        let d = match current {
            Some(d) => d,
            None => {
                let (file, source) =
                    self.store.def_source(hash).await.map_err(|e| format!("definition version {hash}: {e}"))?;
                Arc::new(apollo_shared::def::parse(&source, &file).map_err(|e| e.to_string())?)
            }
        };
        self.capable.defs.lock().expect("defs").insert(hash.to_string(), Some(d.clone()));
        Ok(d)
    }
    /// Asks the executor of a running instance to stop; returns a receiver
    /// that turns true when it has, or `None` when nothing runs it here.
    pub fn cancel(&self, id: &str, reason: StopReason) -> Option<watch::Receiver<bool>> {
        let a = self.active.lock().expect("active").get(id).cloned()?;
        a.why.lock().expect("why").get_or_insert(reason);
        a.token.cancel();
        Some(a.done.subscribe())
    }
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }
}

/// Counts an instance that ended, for the metrics.
pub(super) fn finished(task: &str, state: apollo_shared::state::TaskState) {
    crate::metrics::get()
        .finished
        .get_or_create(&crate::metrics::labels(("task", task), ("state", state.as_str())))
        .inc();
}
