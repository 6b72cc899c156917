//! A step's timeout: the step's own, its plugin registration's, or learned
//! from history (`timeout: auto`, the original design's §3.2: "p99 + 50 %",
//! not picked out of thin air). A step learns from its own runs — the same
//! step of the same task under the same plugin version — since one plugin's
//! runs elsewhere do other work (a 50 ms health check is no measure of a
//! deploy); until it has enough of them its fixed timeout applies. The
//! plugin version's runs across every step give `apollo plugins` its figure.

use crate::config::AutoTimeout;
use crate::plugins::Registration;
use crate::store::Store;
use apollo_shared::def::{StepDef, Timeout};
use std::time::Duration;

/// The timeout an attempt runs under and where it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub timeout: Duration,
    pub basis: String,
    /// `timeout: auto` asked for it (recorded with the attempt).
    pub auto: bool,
}

/// Whether the step's timeout is learned: `timeout: auto` on the step, or
/// on its registration when the step sets none.
pub fn is_auto(step: &StepDef, reg: &Registration) -> bool {
    match step.timeout {
        Some(Timeout::Auto) => true,
        Some(Timeout::Secs(_)) => false,
        None => reg.auto_timeout,
    }
}

/// The timeout without history: the step's, else its registration's fixed
/// one (for `auto`, the one that applies until history is enough).
pub fn fixed(step: &StepDef, reg: &Registration) -> Applied {
    match step.timeout {
        Some(Timeout::Secs(s)) => {
            Applied { timeout: Duration::from_secs_f64(s), basis: "the step's timeout".into(), auto: false }
        }
        _ => registered(reg),
    }
}

/// The timeout learned from `runs` (`what`'s latest, `(failed, seconds)`
/// each: a definition step's under a plugin version, or the plugin
/// version's): the p99 of the successful ones × the factor, between the
/// floor and the ceiling; `fixed` while fewer than `min_runs` succeeded.
pub fn learned(runs: &[(bool, f64)], fixed: Applied, what: &str, conf: &AutoTimeout) -> Applied {
    let mut ok: Vec<f64> = runs.iter().filter(|(failed, _)| !failed).map(|(_, s)| *s).collect();
    if ok.len() < conf.min_runs.max(1) as usize {
        let basis = format!(
            "auto: {} of the {} successful runs of {what} it needs; {} ({:.0}s) until then",
            ok.len(),
            conf.min_runs,
            fixed.basis,
            fixed.timeout.as_secs_f64()
        );
        return Applied { timeout: fixed.timeout, basis, auto: true };
    }
    ok.sort_by(f64::total_cmp);
    let p99 = ok[(((ok.len() - 1) as f64) * 0.99).round() as usize];
    let raw = p99 * conf.factor;
    let floor = conf.floor.as_secs_f64();
    let ceiling = conf.ceiling.as_secs_f64().max(floor);
    let secs = raw.clamp(floor, ceiling);
    let bound = match secs {
        s if s > raw => format!(", raised to the floor {floor}s"),
        s if s < raw => format!(", cut to the ceiling {ceiling}s"),
        _ => String::new(),
    };
    let basis =
        format!("auto: p99 {p99:.3}s × {} over the last {} successful runs of {what}{bound}", conf.factor, ok.len());
    Applied { timeout: Duration::from_secs_f64(secs), basis, auto: true }
}

/// The timeout step `step` of `task` runs under: fixed, or learned from
/// one read of that step's last runs under its plugin version.
pub async fn applied(store: &Store, conf: &AutoTimeout, task: &str, step: &StepDef, reg: &Registration) -> Applied {
    if !is_auto(step, reg) {
        return fixed(step, reg);
    }
    let version = reg.version_text();
    let what = format!("step {} of {task} ({} {version})", step.name, reg.name);
    match store.step_runs_of(task, &step.name, &reg.name, version, conf.runs).await {
        Ok(runs) => learned(&runs, fixed(step, reg), &what, conf),
        Err(e) => unread(e, fixed(step, reg)),
    }
}

/// What `timeout: auto` learns from the plugin version's runs in every
/// step (`apollo plugins`' figure) for a step whose fixed timeout is `fixed`.
pub async fn auto(store: &Store, conf: &AutoTimeout, fixed: Applied, reg: &Registration) -> Applied {
    let version = reg.version_text();
    match store.plugin_runs(&reg.name, version, conf.runs, None).await {
        Ok(runs) => learned(&runs, fixed, &format!("{} {version}", reg.name), conf),
        Err(e) => unread(e, fixed),
    }
}

fn unread(e: crate::store::StoreError, fixed: Applied) -> Applied {
    let basis = format!("auto: the history cannot be read ({e}); {}", fixed.basis);
    Applied { timeout: fixed.timeout, basis, auto: true }
}

/// A registration's own fixed timeout.
pub fn registered(reg: &Registration) -> Applied {
    Applied { timeout: reg.timeout, basis: format!("the {} registration's timeout", reg.name), auto: false }
}

impl Applied {
    /// As the protocol carries it.
    pub fn wire(&self) -> apollo_shared::protocol::AppliedTimeout {
        apollo_shared::protocol::AppliedTimeout { secs: self.timeout.as_secs_f64(), basis: self.basis.clone() }
    }
}
