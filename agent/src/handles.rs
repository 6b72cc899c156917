//! What the API, the triggers, the schedules and the metrics hold: the
//! handles they use — the store, the definitions catalog, the plugin
//! registry, the settings — and, for starting and stopping instances, the
//! scheduler's [`Control`]; never the whole scheduler.

use crate::catalog::Catalog;
use crate::config::Config;
use crate::plugins::Plugins;
use crate::settings::Settings;
use crate::steps::FirstStart;
use crate::store::{ClaimTerms, Claimed, Store};
use apollo_shared::def::TaskDef;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use tokio::sync::{watch, Notify};

/// Why an executor was told to stop.
#[derive(Debug, Clone)]
pub enum StopReason {
    /// An operator cancelled the instance: who (the history row's actor),
    /// and why.
    Cancel { actor: String, reason: String },
    /// The reaper found it running far longer than expected.
    Zombie(String),
    /// The agent is shutting down; the instance stays RUNNING and is
    /// resumed by the next start.
    Shutdown,
}

/// How an executor starts a sub-runbook's child instance: the triggers do
/// (its params filled and checked as any trigger's), behind this, so the
/// scheduler never names them. `key` is the child's dedup key: asked
/// twice, the same child answers. Its id, or why it cannot be made.
pub trait Children: Send + Sync {
    fn create<'a>(
        &'a self,
        task: &'a str,
        params: serde_json::Map<String, serde_json::Value>,
        key: String,
        by: String,
        trace_id: String,
    ) -> futures::future::BoxFuture<'a, Result<String, String>>;
}

/// The scheduler's part in what clients and triggers ask for.
pub trait Control: Send + Sync {
    /// Look for work now (a trigger, a retry request).
    fn wake(&self);
    /// Run an instance this agent holds (a rollback it took on, what a
    /// trigger's write claimed); `first`, when its first step's start was
    /// committed with the claim.
    fn adopt(&self, inst: Claimed, first: Option<Box<FirstStart>>);
    /// Stop an instance this agent runs; `None` when it runs none such.
    /// The receiver turns true when its executor has finished.
    fn cancel(&self, id: &str, why: StopReason) -> Option<watch::Receiver<bool>>;
    /// Instances running here now.
    fn running(&self) -> usize;
    fn is_shutting_down(&self) -> bool;
    /// The sum of a definition's step timeouts, in seconds.
    fn expected_secs(&self, def: &TaskDef) -> f64;
    /// Holds a free slot for an instance a trigger's write claims (`None`
    /// when this agent is full or stopping), with the terms of that claim.
    fn reserve(&self) -> Option<ClaimTerms>;
    /// Frees a slot [`Control::reserve`] held.
    fn release(&self);
    /// When every free slot is held by a claim of the scheduler's own loop
    /// in flight: what tells its release.
    fn claim_release(&self) -> Option<std::sync::Arc<tokio::sync::Notify>>;
    /// Whether this agent claims from `queue` (not dedicated to others).
    fn serves(&self, queue: &str) -> bool;
}

/// A slot held for what a trigger's write claims: freed when dropped, after
/// [`Slot::fill`] has handed the claimed instances to the scheduler (or the
/// write failed).
pub struct Slot {
    control: Arc<dyn Control>,
}

impl Slot {
    /// Runs what the write claimed (`first`: the started first step of the
    /// instance with that id); the slot is freed after.
    pub fn fill(self, claimed: Vec<Claimed>, mut first: Option<(String, Box<FirstStart>)>) {
        for i in claimed {
            let started = first.take_if(|(id, _)| *id == i.id).map(|(_, s)| s);
            self.control.adopt(i, started);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.control.release();
    }
}

#[derive(Clone)]
pub struct Handles {
    pub store: Store,
    pub catalog: Arc<RwLock<Catalog>>,
    pub plugins: Arc<Plugins>,
    pub settings: Arc<Settings>,
    pub data_dir: PathBuf,
    pub control: Arc<dyn Control>,
    /// Notified when the wall clock jumped (the schedules look again).
    pub clock_jumped: Arc<Notify>,
}

impl Handles {
    /// The settings in force now.
    pub fn config(&self) -> Arc<Config> {
        self.settings.get()
    }

    /// A free slot on this agent for what a trigger creates, and the terms
    /// its claim follows.
    pub fn reserve(&self) -> Option<(Slot, ClaimTerms)> {
        let terms = self.control.reserve()?;
        Some((Slot { control: self.control.clone() }, terms))
    }

    /// [`Handles::reserve`], or, when the loop's own claim holds the free
    /// slots at this moment (it releases them in a commit's time when it
    /// found nothing), that slot once it is released (a second at most).
    pub async fn reserve_soon(&self) -> Option<(Slot, ClaimTerms)> {
        if let Some(r) = self.reserve() {
            return Some(r);
        }
        let released = self.control.claim_release()?;
        let notified = released.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(r) = self.reserve() {
            return Some(r);
        }
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), notified).await;
        self.reserve()
    }
}
