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
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};

/// Each plugin's latest rollout as this agent knows it (shared with the
/// registry's views, `plugins::Plugins`).
pub type Rollouts = Arc<RwLock<Arc<BTreeMap<String, apollo_shared::protocol::Rollout>>>>;

/// Puts what a read of the store found into `cell`, never going back: of
/// the rollout known here and the one read, per plugin, the later one
/// stands (the later start; of one rollout, its end over its running). A
/// read made before this agent ended a rollout, or before another agent's
/// end it already learned of, may be written after; it must not bring the
/// running rollout back (its new arm would run again until the next tick).
pub fn learn_rollouts(cell: &Rollouts, read: BTreeMap<String, apollo_shared::protocol::Rollout>) {
    use apollo_shared::protocol::{Rollout, RolloutState};
    let rank = |r: &Rollout| (r.started_at.clone(), r.id.clone(), r.state != RolloutState::Running);
    let mut known = cell.write().expect("rollouts");
    let mut out = read;
    for (plugin, mine) in known.iter() {
        match out.get(plugin) {
            Some(theirs) if rank(theirs) >= rank(mine) => {}
            _ => {
                out.insert(plugin.clone(), mine.clone());
            }
        }
    }
    *known = Arc::new(out);
}

/// Whether every step of a definition version resolves here for an
/// instance with these rollout arms (JSON as stored).
pub type CanRun = Arc<dyn Fn(&TaskDef, Option<&str>) -> bool + Send + Sync>;

/// What a claim passed over: task, definition version, rollout arms.
pub type Passed = (String, String, Option<String>);

/// Whether this agent can run a definition version, as claims ask.
#[derive(Clone)]
pub struct Capable {
    /// Every step's plugin resolves here, for an instance with these
    /// rollout arms (as stored: JSON, or `None`).
    pub can_run: CanRun,
    /// Definition versions by hash, parsed once from the store's copy
    /// (`None`: not found or not parsed; such an instance is claimed and
    /// its executor says why it cannot run).
    pub defs: Arc<Mutex<HashMap<String, Option<Arc<TaskDef>>>>>,
    /// (task, def_hash, pins) a claim passed over for want of a plugin.
    pub passed: Arc<Mutex<BTreeSet<Passed>>>,
    /// The rollouts `can_run` sees: read anew inside the claim when an
    /// instance's arms name a rollout not known here yet (one another agent
    /// started since this one's last maintenance tick), so an arm is never
    /// run as if there were no rollout.
    pub rollouts: Rollouts,
}

impl std::fmt::Debug for Capable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Capable")
    }
}

impl Capable {
    pub fn new(can_run: CanRun, rollouts: Rollouts) -> Capable {
        Capable { can_run, defs: Default::default(), passed: Default::default(), rollouts }
    }

    /// Reads the rollouts anew when `pins` names one not known here, or
    /// gives the new arm of one known as running: another agent may have
    /// ended it since this one's last maintenance tick, and the arm of an
    /// ended rollout is not acted on. (Only instances of a running rollout's
    /// new arm pay for the read.)
    fn learn(&self, c: &dyn Db, pins: &str) -> Result<()> {
        let Ok(pins) = serde_json::from_str::<apollo_shared::protocol::Pins>(pins) else { return Ok(()) };
        let known = {
            let latest = self.rollouts.read().expect("rollouts");
            pins.values().all(|p| match latest.values().find(|r| r.id == p.rollout) {
                None => false,
                Some(r) => !(p.new && r.state == apollo_shared::protocol::RolloutState::Running),
            })
        };
        if !known {
            learn_rollouts(&self.rollouts, super::rollouts::latest(c)?);
        }
        Ok(())
    }

    /// Whether the version `hash` can run here with these rollout arms
    /// (inside a claim's transaction: the definition is read from the store
    /// when not known).
    pub(super) fn runs(&self, c: &dyn Db, hash: &str, pins: Option<&str>) -> Result<bool> {
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
        if let Some(p) = pins {
            self.learn(c, p)?;
        }
        Ok(def.is_none_or(|d| (self.can_run)(&d, pins)))
    }

    /// What claims passed over since the last call.
    pub fn take_passed(&self) -> BTreeSet<Passed> {
        std::mem::take(&mut *self.passed.lock().expect("passed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apollo_shared::protocol::{Rollout, RolloutState};

    fn rollout(id: &str, at: &str, state: RolloutState) -> Rollout {
        serde_json::from_value(serde_json::json!({
            "id": id, "plugin": "ver", "version": "2.0.0", "base": "1.0.0", "share_pct": 50.0,
            "state": state, "started_at": at, "started_by": "root", "reason": "r",
            "abort_margin_pct": 20.0, "min_runs": 4,
        }))
        .unwrap()
    }

    #[test]
    fn a_read_begun_before_an_end_never_brings_the_running_rollout_back() {
        let cell: Rollouts = Default::default();
        let one = |r: Rollout| BTreeMap::from([("ver".to_string(), r)]);
        learn_rollouts(&cell, one(rollout("r1", "2026-12-06T10:00:00Z", RolloutState::Running)));
        learn_rollouts(&cell, one(rollout("r1", "2026-12-06T10:00:00Z", RolloutState::Aborted)));
        // The stale read lands after the end was learned.
        learn_rollouts(&cell, one(rollout("r1", "2026-12-06T10:00:00Z", RolloutState::Running)));
        assert_eq!(cell.read().unwrap()["ver"].state, RolloutState::Aborted);
        // A later rollout of the plugin replaces the ended one; an older read does not undo it.
        learn_rollouts(&cell, one(rollout("r2", "2026-12-06T11:00:00Z", RolloutState::Running)));
        learn_rollouts(&cell, one(rollout("r1", "2026-12-06T10:00:00Z", RolloutState::Aborted)));
        let now = cell.read().unwrap()["ver"].clone();
        assert_eq!((now.id.as_str(), now.state), ("r2", RolloutState::Running));
    }
}
