//! What the agent reports about itself and its work: the definitions and
//! plugins it loaded (with their pools and their runs), the agents on the
//! store, the queues, and what ended recently.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A definition as loaded by the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DefInfo {
    pub task: String,
    pub file: String,
    pub hash: Option<String>,
    pub queue: Option<String>,
    pub priority: Option<u8>,
    pub schedule: Option<String>,
    pub next_fire: Option<DateTime<Utc>>,
    pub on_event: Option<String>,
    pub steps: Vec<String>,
    pub params: Value,
    /// Load errors, as `file: line N: field: message`.
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginInfo {
    pub name: String,
    pub class: Option<String>,
    pub command: Option<String>,
    pub version: String,
    /// The fixed timeout (with `auto`, the one until history is enough).
    pub timeout_secs: f64,
    /// With `timeout: auto` in its registration: what applies now and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_timeout: Option<super::AppliedTimeout>,
    /// The live agents on the store with this name and version registered
    /// (on PostgreSQL; this agent among them), with a digest that differs
    /// from this agent's marked `name (other build)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<String>,
    pub retry: u32,
    pub idempotent: bool,
    pub describe: Value,
    pub error: Option<String>,
    /// How its recent runs went, when it has run.
    #[serde(default)]
    pub stats: Option<PluginStats>,
    /// Its worker pool, for a plugin in worker mode.
    #[serde(default)]
    pub pool: Option<PoolStats>,
}

/// A worker-mode plugin's process pool: its bounds, its workers now, and
/// how long calls waited for one (the last 256 calls).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolStats {
    pub min: usize,
    pub max: usize,
    /// Worker processes alive (busy, idle or starting).
    pub workers: usize,
    pub busy: usize,
    /// Calls waiting for a worker now.
    pub waiting: usize,
    /// The most workers alive at once.
    pub peak: usize,
    pub calls: u64,
    pub wait_p50_ms: f64,
    pub wait_p99_ms: f64,
    /// Workers started, and those replaced after a crash, a timeout or a
    /// broken reply, and recycled after their call or memory limit.
    pub started: u64,
    pub replaced: u64,
    pub recycled: u64,
}

impl PoolStats {
    /// WORKERS and WAIT as the CLI and the console show them: `busy/alive
    /// (min-max)` and the wait p50/p99; dashes for a one-shot plugin.
    pub fn columns(pool: Option<&PoolStats>) -> [String; 2] {
        match pool {
            None => ["-".to_string(), "-".to_string()],
            Some(p) => [
                format!("{}/{} ({}-{})", p.busy, p.workers, p.min, p.max),
                format!("{:.1}/{:.1}ms", p.wait_p50_ms, p.wait_p99_ms),
            ],
        }
    }
}

impl PluginInfo {
    /// Its TIMEOUT column: `300s`, or `auto 4.512s` (what applies now).
    pub fn timeout_column(&self) -> String {
        match &self.auto_timeout {
            Some(t) => format!("auto {}", timeout_text(t.secs)),
            None => timeout_text(self.timeout_secs),
        }
    }
}

/// Seconds as a timeout reads: `300s`, `4.512s`.
pub fn timeout_text(secs: f64) -> String {
    match secs.fract() == 0.0 {
        true => format!("{secs:.0}s"),
        false => format!("{secs:.3}s"),
    }
}

/// The last runs (at most 1,000) of one plugin version: how many, how many
/// failed, how long they took, and the timeout that history suggests (p99
/// plus 50 %, as the original design sets it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginStats {
    pub runs: u64,
    pub failure_rate: f64,
    pub p50_secs: f64,
    pub p99_secs: f64,
    pub suggested_timeout_secs: f64,
}

impl PluginStats {
    /// The figures of a plugin version's latest attempts, `(failed,
    /// seconds)` each: the failure rate over every attempt, the durations
    /// over the successful ones (a failure's time, a timeout's above all,
    /// says nothing of how long the work takes), or over all of them when
    /// none succeeded. `None` for no attempt.
    pub fn from_runs(runs: &[(bool, f64)]) -> Option<PluginStats> {
        if runs.is_empty() {
            return None;
        }
        let failed = runs.iter().filter(|(f, _)| *f).count();
        let mut secs: Vec<f64> = runs.iter().filter(|(f, _)| !*f).map(|(_, s)| *s).collect();
        if secs.is_empty() {
            secs = runs.iter().map(|(_, s)| *s).collect();
        }
        secs.sort_by(f64::total_cmp);
        let at = |p: f64| secs[(((secs.len() - 1) as f64) * p).round() as usize];
        Some(PluginStats {
            runs: runs.len() as u64,
            failure_rate: failed as f64 / runs.len() as f64,
            p50_secs: at(0.5),
            p99_secs: at(0.99),
            suggested_timeout_secs: (at(0.99) * 1.5).max(1.0),
        })
    }

    /// RUNS, FAIL%, P50, P99 and SUGGESTED as the CLI and the console show
    /// them; dashes for a plugin that has not run.
    pub fn columns(stats: Option<&PluginStats>) -> [String; 5] {
        match stats {
            None => std::array::from_fn(|_| "-".to_string()),
            Some(s) => [
                s.runs.to_string(),
                format!("{:.0}", s.failure_rate * 100.0),
                format!("{:.3}s", s.p50_secs),
                format!("{:.3}s", s.p99_secs),
                format!("{:.0}s", s.suggested_timeout_secs),
            ],
        }
    }
}

/// An agent that uses the store (on PostgreSQL, one of several).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentInfo {
    pub name: String,
    /// `<name>:<pid>`, as it signs leases and history.
    pub id: String,
    pub host: String,
    pub version: String,
    /// The queues it claims from: `*` for every shared one, and the
    /// dedicated queues it serves.
    pub queues: Vec<String>,
    pub running: u64,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    /// Seconds since its last heartbeat, by the store's clock.
    pub heartbeat_age_secs: f64,
    /// Its lease renewals are late (no heartbeat for half a lease): it may
    /// be stuck, or gone.
    pub late: bool,
    /// It stopped cleanly.
    pub stopped: bool,
    /// The tasks of `affinity: task` queues it serves now (the definitions
    /// the answering agent holds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<String>,
    /// What it can run: its plugin registrations, as its heartbeat says.
    #[serde(default)]
    pub plugins: Vec<PluginCap>,
}

/// One plugin registration an agent has: name, version, and a digest of
/// what runs (the executable's SHA-256, or `builtin:<agent version>`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PluginCap {
    pub name: String,
    pub version: String,
    pub digest: String,
}

impl AgentInfo {
    /// Its PLUGINS column: the registrations that are not built in, as
    /// `name@version` (built-ins are the agent's version's).
    pub fn plugins_column(&self) -> String {
        let own: Vec<String> = self
            .plugins
            .iter()
            .filter(|p| !p.digest.starts_with("builtin:"))
            .map(|p| format!("{}@{}", p.name, p.version))
            .collect();
        match own.is_empty() {
            true => "built-ins".into(),
            false => format!("built-ins, {}", own.join(", ")),
        }
    }

    /// Its QUEUES column: the queues it claims from and, in `affinity: task`
    /// queues, the tasks it serves (`*,gpu  tasks: backup,rotate`).
    pub fn serves(&self) -> String {
        match self.tasks.is_empty() {
            true => self.queues.join(","),
            false => format!("{}  tasks: {}", self.queues.join(","), self.tasks.join(",")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueStats {
    pub queue: String,
    pub running: u64,
    pub limit: Option<u64>,
    pub pending: u64,
    pub retrying: u64,
    pub oldest_pending_secs: Option<f64>,
    /// Why nothing new is claimed from it now (a pause or freeze window
    /// covering the whole queue), if so.
    #[serde(default)]
    pub paused: Option<String>,
}

/// `agent.stats`: what ended over the last `minutes`, from the store, so a
/// console shows the right throughput the moment it attaches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct StatsParams {
    /// The window, 1 to 1440 (default 60).
    #[serde(default)]
    pub minutes: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsResult {
    pub minutes: u32,
    /// The start of the newest minute in `ended`.
    pub until: DateTime<Utc>,
    /// Instances that ended (SUCCESS, FAILED, ROLLED_BACK) per minute, oldest first.
    pub ended: Vec<u64>,
    /// The same per queue, with the whole window's counts by state.
    pub queues: Vec<QueueRate>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueRate {
    pub queue: String,
    /// Instances that ended: succeeded plus failed.
    pub ended: u64,
    pub succeeded: u64,
    /// Instances that ended FAILED or ROLLED_BACK: both are failures.
    pub failed: u64,
    /// Of the failed, those rolled back.
    #[serde(default)]
    pub rolled_back: u64,
    /// Ended per minute over the window.
    pub per_minute: f64,
}

#[cfg(test)]
mod tests {
    use super::PluginStats;

    #[test]
    fn plugin_figures_count_every_attempt_and_time_the_successful_ones() {
        let runs = [(true, 30.0), (true, 30.0), (false, 1.0), (false, 2.0), (false, 3.0)];
        let s = PluginStats::from_runs(&runs).unwrap();
        assert_eq!((s.runs, s.failure_rate), (5, 0.4));
        assert_eq!((s.p50_secs, s.p99_secs, s.suggested_timeout_secs), (2.0, 3.0, 4.5));
        let failed = PluginStats::from_runs(&[(true, 4.0)]).unwrap();
        assert_eq!((failed.failure_rate, failed.p99_secs), (1.0, 4.0));
        assert!(PluginStats::from_runs(&[]).is_none());
    }
}
