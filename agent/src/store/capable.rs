//! Claims that take only what this agent can run (the original design's
//! §4.3): an instance whose definition version names a plugin version this
//! agent lacks is left to an agent that has it, instead of failing here.
//! What a claim passes over is noted, for the scheduler to tell whether any
//! live agent can run it (else the instance says why it waits, and a
//! `no_capable_agent` alert is raised).

use super::db::Db;
use super::value::p;
use super::Result;
use apollo_shared::def::TaskDef;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// Whether this agent can run a definition version, as claims ask.
#[derive(Clone)]
pub struct Capable {
    /// Every step's plugin resolves here.
    pub can_run: Arc<dyn Fn(&TaskDef) -> bool + Send + Sync>,
    /// Definition versions by hash, parsed once from the store's copy
    /// (`None`: not found or not parsed; such an instance is claimed and
    /// its executor says why it cannot run).
    pub defs: Arc<Mutex<HashMap<String, Option<Arc<TaskDef>>>>>,
    /// (task, def_hash) a claim passed over for want of a plugin.
    pub passed: Arc<Mutex<BTreeSet<(String, String)>>>,
}

impl std::fmt::Debug for Capable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Capable")
    }
}

impl Capable {
    pub fn new(can_run: Arc<dyn Fn(&TaskDef) -> bool + Send + Sync>) -> Capable {
        Capable { can_run, defs: Default::default(), passed: Default::default() }
    }

    /// Whether the version `hash` can run here (inside a claim's
    /// transaction: the definition is read from the store when not known).
    pub(super) fn runs(&self, c: &dyn Db, hash: &str) -> Result<bool> {
        let known = self.defs.lock().expect("defs").get(hash).cloned();
        let def = match known {
            Some(d) => d,
            None => {
                let row = c.query_opt("SELECT file, source FROM task_defs WHERE hash = ?1", p![hash])?;
                let parsed = match row {
                    Some(r) => apollo_shared::def::parse(&r.get::<String>(1)?, &r.get::<String>(0)?).ok().map(Arc::new),
                    None => None,
                };
                self.defs.lock().expect("defs").insert(hash.to_string(), parsed.clone());
                parsed
            }
        };
        Ok(def.is_none_or(|d| (self.can_run)(&d)))
    }

    /// What claims passed over since the last call.
    pub fn take_passed(&self) -> BTreeSet<(String, String)> {
        std::mem::take(&mut *self.passed.lock().expect("passed"))
    }
}
