//! Canary rollouts of a plugin version (the original design's §4.3): a new
//! version goes to a share of new instances first, is compared side by side
//! with the version it replaces, then promoted or aborted.

use super::PluginStats;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

names! {
    /// Where a rollout stands.
    pub enum RolloutState {
        /// A share of new instances goes to the new version.
        Running = "running",
        /// The new version is the one for every step that accepts it.
        Promoted = "promoted",
        /// Everything is sent back to the version it replaced.
        Aborted = "aborted",
    }
    "rollout state"
}

impl<'de> Deserialize<'de> for RolloutState {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// The rollout arm an instance was given when it was created, for one
/// plugin: `new` runs the rollout's version, the other arm the one it
/// replaces. An instance keeps its arm for its life while the rollout runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    pub rollout: String,
    pub version: String,
    pub new: bool,
}

/// An instance's arms, by plugin name (none outside a rollout).
pub type Pins = BTreeMap<String, Pin>;

/// A rollout, with the two versions' figures since it started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rollout {
    pub id: String,
    pub plugin: String,
    /// The version rolled out.
    pub version: String,
    /// The version it replaces (the newest other one live agents had).
    pub base: String,
    /// The percentage of new instances sent to `version`.
    pub share_pct: f64,
    /// The agents that run `version` for it (empty: every one that has it).
    #[serde(default)]
    pub agents: Vec<String>,
    pub state: RolloutState,
    pub started_at: String,
    pub started_by: String,
    pub reason: String,
    #[serde(default)]
    pub ended_at: Option<String>,
    #[serde(default)]
    pub ended_by: Option<String>,
    #[serde(default)]
    pub end_reason: Option<String>,
    /// The automatic abort: when `version`'s failure rate exceeds `base`'s
    /// by more than this many points, over at least `min_runs` runs of it.
    pub abort_margin_pct: f64,
    pub min_runs: u32,
    /// `version`'s attempts since the start.
    #[serde(default)]
    pub new: Option<PluginStats>,
    /// `base`'s attempts since the start.
    #[serde(default)]
    pub old: Option<PluginStats>,
}

impl Rollout {
    /// Its heading as the CLI and the console show it (after its state).
    pub fn heading(&self) -> String {
        let on = match self.agents.is_empty() {
            true => String::new(),
            false => format!(" on {}", self.agents.join(", ")),
        };
        format!(
            "{} {} over {}: {}% of new instances{on}, since {} (by {}: {})",
            self.plugin, self.version, self.base, self.share_pct, self.started_at, self.started_by, self.reason
        )
    }

    /// How it ended, if it did.
    pub fn ending(&self) -> Option<String> {
        let at = self.ended_at.as_deref()?;
        Some(format!(
            "{} at {at} by {}: {}",
            self.state,
            self.ended_by.as_deref().unwrap_or("?"),
            self.end_reason.as_deref().unwrap_or("")
        ))
    }

    /// The two versions side by side since the start: VERSION, RUNS, FAIL%,
    /// P50, P99 (the new version first).
    pub fn comparison(&self) -> [[String; 5]; 2] {
        let row = |label: String, s: Option<&PluginStats>| {
            let [runs, fail, p50, p99, _] = PluginStats::columns(s);
            [label, runs, fail, p50, p99]
        };
        [
            row(format!("{} (new)", self.version), self.new.as_ref()),
            row(format!("{} (old)", self.base), self.old.as_ref()),
        ]
    }

    /// Whether the figures call for the automatic abort, and why.
    pub fn should_abort(&self) -> Option<String> {
        let new = self.new.as_ref()?;
        if self.state != RolloutState::Running || new.runs < u64::from(self.min_runs.max(1)) {
            return None;
        }
        let old_rate = self.old.as_ref().map_or(0.0, |o| o.failure_rate);
        let over = (new.failure_rate - old_rate) * 100.0;
        (over > self.abort_margin_pct).then(|| {
            format!(
                "automatic abort: {} {} failed {:.0}% of {} runs against {:.0}% for {} (margin {} points)",
                self.plugin,
                self.version,
                new.failure_rate * 100.0,
                new.runs,
                old_rate * 100.0,
                self.base,
                self.abort_margin_pct
            )
        })
    }
}

/// `rollouts.start`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutStart {
    pub plugin: String,
    pub version: String,
    /// Percent of new instances, 0 to 100 (default 10).
    #[serde(default)]
    pub share_pct: Option<f64>,
    #[serde(default)]
    pub agents: Vec<String>,
    /// Default `scheduler.rollout.abort_margin_pct`.
    #[serde(default)]
    pub abort_margin_pct: Option<f64>,
    /// Default `scheduler.rollout.min_runs`.
    #[serde(default)]
    pub min_runs: Option<u32>,
    pub reason: String,
}

/// `rollouts.promote` and `rollouts.abort`: the plugin whose running
/// rollout it is, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutEnd {
    pub plugin: String,
    pub reason: String,
}
