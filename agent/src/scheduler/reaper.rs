//! The zombie reaper (the original design's §4.1): an instance RUNNING
//! longer than `zombie_factor` (default 2) × its expected time is marked
//! FAILED, with the reason and a `zombie_reaped` alert.
//!
//! Its expected time is the sum over its steps of each step's p99 in the
//! task's recent successful runs, for a step with enough of them (at most
//! its timeout), else the step's timeout. Every RUNNING instance in the
//! store is considered, whoever holds it:
//! - one this agent runs: its executor is stopped (the step's process gets
//!   SIGTERM, then SIGKILL) and records the FAILED; if it does not within
//!   the kill grace and one lease, the store is written directly;
//! - one held elsewhere (another agent's executor lost, a watchdog that
//!   never fired) or by nobody: after one more lease, so its holder's own
//!   reaper acts first, the store is written directly, fenced on the
//!   holder seen: a holder that finished or moved it meanwhile wins.
//!
//! A reaped instance is not retried and not rolled back by itself: what
//! its steps did is unknown; `apollo retry` or `apollo rollback` decide.

use super::state::noted;
use super::Scheduler;
use crate::handles::StopReason;
use crate::store::{Running, StepDurations};
use apollo_shared::def::TaskDef;
use apollo_shared::protocol::AlertKind;
use chrono::Utc;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// A step's history counts once it has this many successful runs...
pub const MIN_RUNS: usize = 20;
/// ...among its task's last this many instances.
pub const RECENT_INSTANCES: u32 = 100;

/// How long an instance is expected to run, and on what that rests.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    pub secs: f64,
    /// Steps whose time came from their history; the rest from timeouts.
    pub from_history: usize,
    pub steps: usize,
}

impl Expected {
    /// What an operator reads: "expected 12s (the p99 of their recent runs
    /// for 2 of 3 steps, timeouts for the rest)".
    pub fn basis(&self) -> String {
        match (self.from_history, self.steps) {
            (0, _) => "the sum of its step timeouts".to_string(),
            (h, n) if h == n => "the sum of its steps' p99 over their recent runs".to_string(),
            (h, n) => format!("the p99 of recent runs for {h} of {n} steps, timeouts for the rest"),
        }
    }
}

/// The expected time of an instance of `def`, from `history` (see the
/// module's comment) and each step's timeout.
pub fn expected(s: &Scheduler, def: &TaskDef, history: &StepDurations) -> Expected {
    let timeouts = s.step_timeouts(def);
    let mut out = Expected { secs: 0.0, from_history: 0, steps: def.steps.len() };
    for (seq, (step, timeout)) in def.steps.iter().zip(timeouts).enumerate() {
        let runs = history.get(&(seq as u32, step.name.clone()));
        match runs.filter(|r| r.len() >= MIN_RUNS) {
            Some(runs) => {
                let mut runs = runs.clone();
                runs.sort_by(f64::total_cmp);
                let p99 = runs[(((runs.len() - 1) as f64) * 0.99).round() as usize];
                out.secs += p99.min(timeout);
                out.from_history += 1;
            }
            None => out.secs += timeout,
        }
    }
    out
}

/// One pass over the store's RUNNING instances.
pub(super) async fn reap(s: &Arc<Scheduler>) {
    // The fault tests' agent whose reaper never looks (another agent's must).
    fail::fail_point!("reaper.off", |_| ());
    let config = s.config();
    let conf = &config.scheduler;
    let Some(rows) = noted(s.store.running().await, &s.failing.reaper) else { return };
    let held: HashMap<String, Arc<super::Active>> =
        s.active.lock().expect("active").iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut histories: HashMap<String, StepDurations> = HashMap::new();
    for r in rows {
        let local = held.get(&r.id);
        let ran = match local {
            Some(a) => a.started.elapsed(),
            None => r.since.and_then(|t| (Utc::now() - t).to_std().ok()).unwrap_or_default(),
        };
        // Most instances are far younger than the floor: nothing to read.
        if ran <= conf.zombie_min {
            continue;
        }
        let Ok(def) = s.def_for(&r.def_hash).await else { continue };
        if !histories.contains_key(&r.task) {
            let h = noted(s.store.step_durations(&r.task, RECENT_INSTANCES).await, &s.failing.reaper);
            histories.insert(r.task.clone(), h.unwrap_or_default());
        }
        let expected = expected(s, &def, &histories[&r.task]);
        let limit = Duration::from_secs_f64(expected.secs * conf.zombie_factor).max(conf.zombie_min);
        if ran <= limit {
            continue;
        }
        let said = format!(
            "reaped: RUNNING for {:.0}s, more than {} × its expected {:.0}s ({})",
            ran.as_secs_f64(),
            conf.zombie_factor,
            expected.secs,
            expected.basis()
        );
        match local {
            Some(a) if !a.token.is_cancelled() => {
                // The executor stops the step and records the FAILED.
                tracing::warn!(task_id = %r.id, "{said}");
                let _ = s.store.alert(AlertKind::ZombieReaped, &said, Some(&r.id)).await;
                crate::metrics::get().reaped.inc();
                a.why.lock().expect("why").get_or_insert(StopReason::Zombie(said));
                a.token.cancel();
            }
            Some(_) if ran > limit + conf.kill_grace + conf.lease => {
                let said = format!("{said}; its executor did not stop, so the store was written directly");
                reap_in_store(s, &r, &said).await;
            }
            Some(_) => {}
            None if ran > limit + conf.lease => reap_in_store(s, &r, &said).await,
            None => {}
        }
    }
}

async fn reap_in_store(s: &Scheduler, r: &Running, said: &str) {
    let held_by = r.owner.as_deref().unwrap_or("nobody");
    let said = format!("{said}; it was held by {held_by}");
    match s.store.reap(&r.id, r.owner.as_deref(), &said).await {
        Ok(true) => {
            tracing::warn!(task_id = %r.id, "{said}");
            crate::metrics::get().reaped.inc();
        }
        Ok(false) => tracing::debug!(task_id = %r.id, "not reaped: it moved meanwhile"),
        Err(e) => tracing::warn!(task_id = %r.id, error = %e, "could not reap"),
    }
}
