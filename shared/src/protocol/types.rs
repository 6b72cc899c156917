//! The params and results of the methods.

use super::status::DefInfo;
use super::{AlertKind, Topic};
use crate::state::{StepState, TaskState};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// Who is calling, for the agent's log.
    #[serde(default)]
    pub client: Option<ClientInfo>,
    #[serde(default)]
    pub protocol: Option<u32>,
}

/// A client's name, alone or with its version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged, expecting = "a client name (a string) or {\"name\": \"…\", \"version\": \"…\"}")]
pub enum ClientInfo {
    Name(String),
    Named {
        name: String,
        #[serde(default)]
        version: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HelloResult {
    pub agent: String,
    pub version: String,
    pub protocol: u32,
    pub role: Role,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Operator,
    Observer,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerParams {
    pub task: String,
    #[serde(default)]
    pub params: Map<String, Value>,
    #[serde(default)]
    pub dedup_key: Option<String>,
    /// Why, for the history and the audit.
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TriggerResult {
    pub id: String,
    pub created: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdParams {
    pub id: String,
    #[serde(default)]
    pub reason: Option<String>,
}

/// `steps.skip`: the instance, its step by name or seq, and why (required:
/// the history and the audit keep it). With `item` (a fan-out step's item,
/// by label or 0-based index) only that item is skipped, and the instance
/// stays FAILED until a retry runs the rest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkipParams {
    pub id: String,
    pub step: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    #[serde(default)]
    pub state: Option<TaskState>,
    #[serde(default)]
    pub task: Option<String>,
    #[serde(default)]
    pub queue: Option<String>,
    #[serde(default)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
    /// List the archive (instances past the retention window) instead.
    #[serde(default)]
    pub archived: bool,
    /// Only instances created at or after this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<chrono::DateTime<chrono::Utc>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListResult {
    pub items: Vec<Instance>,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsParams {
    pub id: String,
    /// A step name or its 0-based seq.
    pub step: Value,
    #[serde(default)]
    pub offset: Option<u64>,
    /// Follow: when nothing is left to read at `offset` and the step runs,
    /// answer only once the log grows, the instance changes, or this many
    /// milliseconds have passed (at most [`MAX_LOGS_WAIT_MS`]). A silent
    /// step costs the agent nothing meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// A fan-out step's item: its label or 0-based index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<Value>,
}

/// The longest a `steps.logs` call waits for a log to grow.
pub const MAX_LOGS_WAIT_MS: u64 = 30_000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogsResult {
    pub text: String,
    pub next_offset: u64,
    pub eof: bool,
    /// The step's state and attempts as the answer left it: a follower goes
    /// on waiting on this step while it is RUNNING, and looks at the
    /// instance again only when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_state: Option<crate::state::StepState>,
    #[serde(default)]
    pub attempts: u32,
}

/// One task instance as the protocol shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    pub id: String,
    pub task: String,
    pub def_hash: String,
    pub state: TaskState,
    pub attempt: u32,
    pub trace_id: String,
    pub priority: u8,
    pub queue: String,
    pub trigger: String,
    pub dedup_key: Option<String>,
    pub params: Value,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub next_run_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
    /// The agent holding it (RUNNING, or FAILED while its rollback runs).
    #[serde(default)]
    pub lease_owner: Option<String>,
    /// When that hold runs out unless renewed.
    #[serde(default)]
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Why it waits though runnable (no live agent has the plugins it needs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// Steps that failed and were let through (`on_failure: continue`): a
    /// SUCCESS with failed steps is not a clean run.
    #[serde(default)]
    pub failed_steps: u32,
    /// Its rollout arms, decided when it was created (see `rollouts.start`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pins: Option<super::Pins>,
    /// The locks it takes with its claim and holds while under way.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locks: Vec<String>,
    /// The context; `null` in lists (which carry summaries), whole in `tasks.get`.
    pub context: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<StepRun>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transitions: Option<Vec<Transition>>,
}

impl Instance {
    /// What a listing shows beside its state: why it waits, that it
    /// succeeded with failed steps let through, or its error.
    pub fn note(&self) -> Option<String> {
        if let Some(w) = self.waiting.as_ref().filter(|_| self.state.is_waiting()) {
            return Some(w.clone());
        }
        if self.state == TaskState::Success && self.failed_steps > 0 {
            let n = self.failed_steps;
            return Some(format!(
                "{n} failed step{} let through (on_failure: continue)",
                if n == 1 { "" } else { "s" }
            ));
        }
        self.error.clone()
    }

    /// Whether it has ended: nothing will move it without an operator
    /// (SUCCESS, ROLLED_BACK, or FAILED with no retry or rollback coming).
    pub fn ended(&self) -> bool {
        // FAILED or SUCCESS without an end time: its rollback is under way.
        self.state == TaskState::RolledBack
            || (matches!(self.state, TaskState::Success | TaskState::Failed) && self.finished_at.is_some())
    }
}

/// One row of the step ledger (by default: PENDING, never run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct StepRun {
    pub seq: u32,
    pub name: String,
    pub plugin: String,
    pub plugin_version: Option<String>,
    pub state: StepState,
    pub attempts: u32,
    pub failures: u32,
    pub params: Option<Value>,
    pub output: Option<Value>,
    pub error: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The attempts before this one that ended in failure (or were
    /// interrupted), oldest first, as each ended (`tasks.get` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier: Vec<AttemptRun>,
    /// It failed and was let through (`on_failure: continue`): it never
    /// runs again for this instance, a resume or retry goes past it.
    #[serde(default)]
    pub passed: bool,
    /// The timeout learned for its last attempt (`timeout: auto`;
    /// `tasks.get` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<AppliedTimeout>,
    /// A fan-out step's items, counted (`tasks.get` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<super::ItemCounts>,
}

/// A learned timeout as an attempt ran under it: seconds, and how it was
/// reached (the p99, the factor, the runs; or why the fixed one applied).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppliedTimeout {
    pub secs: f64,
    pub basis: String,
}

/// An earlier attempt of a step, as it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRun {
    pub attempt: u32,
    pub plugin_version: Option<String>,
    pub params: Option<Value>,
    pub error: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<AppliedTimeout>,
}

/// One row of the append-only history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    pub at: DateTime<Utc>,
    /// `None` for the instance itself, else the step's seq.
    pub step: Option<u32>,
    pub from: Option<String>,
    pub to: String,
    pub reason: String,
    pub actor: String,
}

impl Transition {
    /// A person (or a trigger on their behalf) caused it, not an agent or
    /// the scheduler: the rows `audit.list` returns.
    pub fn by_operator(&self) -> bool {
        !self.actor.starts_with("agent:") && self.actor != "scheduler"
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DryRunStep {
    pub seq: u32,
    pub name: String,
    pub plugin: String,
    pub version: Option<String>,
    pub params: Value,
    /// Params whose templates depend on earlier steps' outputs.
    pub unresolved: Vec<String>,
    pub valid: bool,
    pub error: Option<String>,
    pub describe: Option<Value>,
    /// The timeout an attempt would run under now, and its basis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<AppliedTimeout>,
    /// A fan-out step's items and batches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fanout: Option<super::DryRunFanout>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DryRunResult {
    pub task: String,
    pub valid: bool,
    pub steps: Vec<DryRunStep>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub kind: AlertKind,
    pub message: String,
    pub instance: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentStatus {
    pub agent: String,
    pub version: String,
    pub pid: u32,
    pub uptime_secs: f64,
    pub store: String,
    pub socket: String,
    pub tasks_dir: String,
    pub data_dir: String,
    pub counts: Map<String, Value>,
    pub definitions: u64,
    pub definition_errors: u64,
    pub concurrency: u32,
    /// The cores available to the agent, when `concurrency` is twice them
    /// (`scheduler.concurrency` not set).
    #[serde(default)]
    pub cores: Option<u32>,
    pub shutting_down: bool,
    /// Why the store cannot be written now (disk full, read-only), if so.
    #[serde(default)]
    pub store_error: Option<String>,
    /// The pauses and freeze windows in force: what is not claimed now.
    #[serde(default)]
    pub paused: Vec<super::Pause>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishParams {
    pub name: String,
    #[serde(default)]
    pub data: Option<Value>,
    #[serde(default)]
    pub dedup_key: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscribeParams {
    pub topics: Vec<Topic>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubscribeResult {
    /// The sequence number of the last event before the subscription.
    pub seq: u64,
}

/// The params of a method that takes none: `{}` (or none at all).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// The params of the methods that list recent records, newest first.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LimitParams {
    /// At most this many (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefParams {
    pub task: String,
}

/// `defs.get`: the definition as loaded, with the text of its file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DefDetail {
    #[serde(flatten)]
    pub info: DefInfo,
    pub source: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublishResult {
    pub event_id: String,
    /// Its dedup key was seen before: nothing was created.
    pub duplicate: bool,
    /// The instances this call created.
    pub instances: Vec<String>,
}

/// A received event as `events.list` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    pub id: String,
    pub name: String,
    pub data: Option<Value>,
    pub dedup_key: Option<String>,
    pub received_at: String,
    /// The instances it created.
    pub instances: Value,
}

/// One operator action, as `audit.list` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub at: String,
    pub actor: String,
    pub instance: String,
    pub task: Option<String>,
    pub step: Option<u32>,
    pub from: Option<String>,
    pub to: String,
    pub reason: String,
}

/// `agent.metrics`: the Prometheus text exposition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsText {
    pub text: String,
}
