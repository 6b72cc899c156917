//! `scheduler:`: concurrency, timeouts, leases, retention, backoff, queues.

use super::duration::{duration, opt_duration, secs};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scheduler {
    /// Instances running at once, across all queues, as written; `None`:
    /// twice the cores available (see [`Scheduler::concurrency`]).
    #[serde(default)]
    pub concurrency: Option<u32>,
    /// Step timeout when neither the step nor its plugin registration sets one.
    #[serde(default = "secs::<300>", deserialize_with = "duration")]
    pub default_timeout: Duration,
    /// How long a claim holds an instance without renewal.
    #[serde(default = "secs::<30>", deserialize_with = "duration")]
    pub lease: Duration,
    /// An instance RUNNING longer than this factor times its expected time
    /// (its steps' p99 from history, else their timeouts) is reaped as a
    /// zombie: FAILED, with a `zombie_reaped` alert.
    #[serde(default = "default_zombie")]
    pub zombie_factor: f64,
    /// Nothing is reaped before it has run this long, however short its
    /// expected time.
    #[serde(default = "secs::<60>", deserialize_with = "duration")]
    pub zombie_min: Duration,
    /// Finished instances older than this move to the archive.
    #[serde(default = "secs::<2592000>", deserialize_with = "duration")]
    pub retention: Duration,
    /// Archived instances whose end is older than this are deleted (in
    /// small batches); `None` (the default): the archive keeps everything.
    #[serde(default, deserialize_with = "opt_duration")]
    pub archive_retention: Option<Duration>,
    /// First retry delay; doubles each retry, with jitter.
    #[serde(default = "secs::<1>", deserialize_with = "duration")]
    pub backoff_base: Duration,
    #[serde(default = "secs::<300>", deserialize_with = "duration")]
    pub backoff_max: Duration,
    /// On SIGTERM, how long running steps may take to finish.
    #[serde(default = "secs::<30>", deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// Between SIGTERM and SIGKILL for a timed-out subprocess.
    #[serde(default = "secs::<5>", deserialize_with = "duration")]
    pub kill_grace: Duration,
    #[serde(default = "default_output_bytes")]
    pub step_output_bytes: usize,
    #[serde(default = "default_context_bytes")]
    pub context_bytes: usize,
    /// Most missed fires a `catchup: all` schedule runs after downtime.
    #[serde(default = "default_catchup_max")]
    pub catchup_max: usize,
    /// Most items one fan-out step may have (`foreach:`).
    #[serde(default = "default_max_items")]
    pub max_items: usize,
    /// Per-queue limits on running instances.
    #[serde(default)]
    pub queues: BTreeMap<String, QueueConf>,
    /// How `timeout: auto` learns a step's timeout.
    #[serde(default)]
    pub auto_timeout: AutoTimeout,
    /// The defaults of `apollo rollout start`.
    #[serde(default)]
    pub rollout: RolloutConf,
    /// Freeze windows: nothing new is claimed in their scope while open.
    #[serde(default)]
    pub freezes: Vec<super::Freeze>,
}

/// A rollout's defaults: the share of new instances sent to the new
/// version, and its automatic abort — when the new version's failure rate
/// exceeds the old one's by more than `abort_margin_pct` points over at
/// least `min_runs` of its runs since the start.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutConf {
    #[serde(default = "rollout_share")]
    pub share_pct: f64,
    #[serde(default = "rollout_margin")]
    pub abort_margin_pct: f64,
    #[serde(default = "auto_min_runs")]
    pub min_runs: u32,
}

impl Default for RolloutConf {
    fn default() -> RolloutConf {
        RolloutConf { share_pct: rollout_share(), abort_margin_pct: rollout_margin(), min_runs: auto_min_runs() }
    }
}

fn rollout_share() -> f64 {
    10.0
}
fn rollout_margin() -> f64 {
    10.0
}

/// `timeout: auto` (the original design's §3.2): the p99 of a plugin
/// version's successful runs among its last `runs` × `factor`, between
/// `floor` and `ceiling`; below `min_runs` successful runs, the
/// registration's fixed timeout.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoTimeout {
    #[serde(default = "auto_runs")]
    pub runs: u32,
    #[serde(default = "auto_min_runs")]
    pub min_runs: u32,
    #[serde(default = "auto_factor")]
    pub factor: f64,
    #[serde(default = "secs::<1>", deserialize_with = "duration")]
    pub floor: Duration,
    #[serde(default = "secs::<3600>", deserialize_with = "duration")]
    pub ceiling: Duration,
}

impl Default for AutoTimeout {
    fn default() -> AutoTimeout {
        AutoTimeout {
            runs: auto_runs(),
            min_runs: auto_min_runs(),
            factor: auto_factor(),
            floor: Duration::from_secs(1),
            ceiling: Duration::from_secs(3600),
        }
    }
}

fn auto_runs() -> u32 {
    100
}
fn auto_min_runs() -> u32 {
    20
}
fn auto_factor() -> f64 {
    1.5
}

fn default_max_items() -> usize {
    apollo_shared::def::MAX_ITEMS
}

fn default_catchup_max() -> usize {
    100
}
fn default_zombie() -> f64 {
    2.0
}
fn default_output_bytes() -> usize {
    apollo_shared::context::MAX_STEP_OUTPUT_BYTES
}
fn default_context_bytes() -> usize {
    apollo_shared::context::MAX_CONTEXT_BYTES
}

/// The cores this process may run on: its CPU affinity and its cgroup's
/// CPU quota, as the standard library reads them (at least 1). Read once:
/// the reading opens cgroup files, and every claim asks for the concurrency.
pub fn cores() -> u32 {
    static CORES: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32))
}

impl Scheduler {
    /// The freeze windows open at `now`, as the pauses they stand for.
    pub fn frozen_at(&self, now: chrono::DateTime<chrono::Utc>) -> Vec<apollo_shared::protocol::Pause> {
        self.freezes.iter().flat_map(|f| f.pauses_at(now)).collect()
    }

    /// Instances running at once: `concurrency:`, else twice the cores
    /// available to the process (the original design's §4.4), at most
    /// 10,000.
    pub fn concurrency(&self) -> u32 {
        self.concurrency.unwrap_or_else(|| (2 * cores()).min(10_000))
    }
}

impl Default for Scheduler {
    fn default() -> Self {
        // Deserializing an empty mapping applies every field default once.
        serde_json::from_value(serde_json::json!({})).expect("scheduler defaults")
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConf {
    /// Instances of the queue running at once, across every agent.
    #[serde(default)]
    pub limit: Option<u32>,
    /// Only these agents (by `agent.name`) claim from the queue; empty: every
    /// agent does (a shared queue). Every agent's config must say the same.
    #[serde(default)]
    pub agents: Vec<String>,
    /// The instances of each task in the queue run one at a time, in the
    /// order they were created, across every agent.
    #[serde(default)]
    pub ordered: bool,
    /// `affinity: task`: each task's instances are claimed by one live
    /// agent serving the queue, chosen by rendezvous hashing (§5.3).
    #[serde(default)]
    pub affinity: Option<Affinity>,
}

/// What a queue's instances stay with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Affinity {
    /// One agent per task.
    Task,
}
