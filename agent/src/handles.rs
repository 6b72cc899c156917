//! What the API, the triggers, the schedules and the metrics hold: the
//! handles they use — the store, the definitions catalog, the plugin
//! registry, the settings — and, for starting and stopping instances, the
//! scheduler's [`Control`]; never the whole scheduler.

use crate::catalog::Catalog;
use crate::config::Config;
use crate::plugins::Plugins;
use crate::scheduler::StopReason;
use crate::settings::Settings;
use crate::store::{Claimed, Store};
use apollo_shared::def::TaskDef;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use tokio::sync::{watch, Notify};

/// The scheduler's part in what clients and triggers ask for.
pub trait Control: Send + Sync {
    /// Look for work now (a trigger, a retry request).
    fn wake(&self);
    /// Run an instance this agent holds (a rollback it took on).
    fn adopt(&self, inst: Claimed);
    /// Stop an instance this agent runs; `None` when it runs none such.
    /// The receiver turns true when its executor has finished.
    fn cancel(&self, id: &str, why: StopReason) -> Option<watch::Receiver<bool>>;
    /// Instances running here now.
    fn running(&self) -> usize;
    fn is_shutting_down(&self) -> bool;
    /// The sum of a definition's step timeouts, in seconds.
    fn expected_secs(&self, def: &TaskDef) -> f64;
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
}
