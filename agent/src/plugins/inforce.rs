//! The registry in force, and the views of it each instance's rollout arms
//! make (see `rollout`).

use super::rollout::{rules, Rule};
use super::Registry;
use apollo_shared::protocol::{Pins, Rollout};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

/// The registry in force, swapped whole when plugins are reloaded (SIGHUP);
/// a step in flight keeps the registration it resolved. Beside it, each
/// plugin's latest rollout (refreshed from the store every maintenance tick
/// and at once when this agent starts or ends one), and the views of the
/// registry those make for each set of rules.
#[derive(Default)]
pub struct Plugins {
    current: RwLock<Arc<Registry>>,
    latest: crate::store::capable::Rollouts,
    /// Views by the rules they apply.
    views: Mutex<HashMap<BTreeMap<String, Rule>, Arc<Registry>>>,
    me: String,
}

impl Plugins {
    pub fn new(r: Registry, me: &str) -> Plugins {
        Plugins { current: RwLock::new(Arc::new(r)), me: me.to_string(), ..Default::default() }
    }
    /// The registry itself, without any rollout's rule.
    pub fn get(&self) -> Arc<Registry> {
        self.current.read().expect("plugins").clone()
    }
    pub fn set(&self, r: Registry) {
        *self.current.write().expect("plugins") = Arc::new(r);
        self.views.lock().expect("views").clear();
    }
    /// Each plugin's latest rollout, as this agent knows it.
    pub fn rollouts(&self) -> Arc<BTreeMap<String, Rollout>> {
        self.latest.read().expect("rollouts").clone()
    }
    /// What a read of the store found (never going back to an older
    /// state: see `learn_rollouts`). Views are kept by their rules, so a
    /// change of rollouts needs none of them dropped.
    pub fn set_rollouts(&self, latest: BTreeMap<String, Rollout>) {
        crate::store::capable::learn_rollouts(&self.latest, latest);
    }
    /// The rollouts as this agent knows them, shared with its claims (which
    /// read them anew when an instance names a rollout not known yet).
    pub fn rollout_cell(&self) -> crate::store::capable::Rollouts {
        self.latest.clone()
    }
    /// The registry as an instance with these arms resolves its steps.
    pub fn view(&self, pins: Option<&Pins>) -> Arc<Registry> {
        let latest = self.rollouts();
        if latest.is_empty() {
            return self.get();
        }
        let rules = rules(&latest, pins);
        if rules.is_empty() {
            return self.get();
        }
        let mut views = self.views.lock().expect("views");
        if let Some(v) = views.get(&rules) {
            return v.clone();
        }
        let mut r = (*self.get()).clone();
        r.rules = rules.clone();
        r.me = self.me.clone();
        let r = Arc::new(r);
        views.insert(rules, r.clone());
        r
    }
}
