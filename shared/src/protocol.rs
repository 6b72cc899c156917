//! The wire protocol: JSON-RPC 2.0, one JSON object per line, on a Unix
//! stream socket (or an SSH channel bridged by `apollo-agent dial-stdio`).
//!
//! Framing is each side's business: a line may be at most
//! [`MAX_FRAME_BYTES`] long, newline excluded. A longer line is answered with
//! an `invalid request` error and skipped; the connection stays up.
//!
//! The first call is `hello`. After `subscribe` the agent pushes
//! notifications `{"jsonrpc":"2.0","method":"event","params":{"seq":N,"topic":T,"kind":K,"data":{…}}}`;
//! a client that falls behind receives `kind: "resync"` and should re-read
//! the state it shows. The types below are the params and results of each
//! method; all times are UTC RFC 3339, all ids strings.

use crate::state::{StepState, TaskState};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub const PROTOCOL_VERSION: u32 = 1;
/// The largest frame either side accepts, newline excluded.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;
/// The longest error message an answer carries.
pub const MAX_ERROR_MESSAGE: usize = 1024;
/// The largest number of items one `tasks.list` page may ask for.
pub const MAX_LIST_LIMIT: u32 = 1000;

/// Every method the agent answers, for `unknown method` messages.
pub const METHODS: &[&str] = &[
    "agent.metrics",
    "hello",
    "agent.status",
    "tasks.list",
    "tasks.get",
    "tasks.trigger",
    "tasks.dry_run",
    "tasks.retry",
    "tasks.rollback",
    "tasks.cancel",
    "steps.logs",
    "defs.list",
    "defs.get",
    "plugins.list",
    "queues.stats",
    "events.publish",
    "events.list",
    "alerts.list",
    "audit.list",
    "agents.list",
    "agent.stats",
    "subscribe",
];

/// Methods that change state and need the operator role.
pub const MUTATING: &[&str] = &["tasks.trigger", "tasks.retry", "tasks.rollback", "tasks.cancel", "events.publish"];

/// JSON-RPC and application error codes.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    /// The instance, definition, step or plugin named does not exist.
    pub const NOT_FOUND: i64 = -32004;
    /// The state machine refused the change.
    pub const ILLEGAL_TRANSITION: i64 = -32010;
    /// The caller's role may not do this.
    pub const FORBIDDEN: i64 = -32003;
    /// The definition or parameters did not validate.
    pub const VALIDATION_FAILED: i64 = -32020;
    /// The agent is shutting down or overloaded; try again.
    pub const BUSY: i64 = -32030;
    /// The answer would not fit in one frame; ask for less.
    pub const TOO_LARGE: i64 = -32040;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub jsonrpc: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Value>,
    pub method: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

impl Request {
    pub fn new(id: u64, method: &str, params: Value) -> Self {
        Request { jsonrpc: "2.0".into(), id: Some(Value::from(id)), method: method.into(), params: Some(params) }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError { code, message: message.into(), data: None }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.data = Some(serde_json::json!({ "hint": hint.into() }));
        self
    }

    /// The error with its message cut to [`MAX_ERROR_MESSAGE`] characters, so
    /// an answer never echoes an unbounded piece of the request.
    pub fn bounded(mut self) -> Self {
        if self.message.len() > MAX_ERROR_MESSAGE {
            let cut: String = self.message.chars().take(MAX_ERROR_MESSAGE).collect();
            self.message = format!("{cut}… ({} bytes cut)", self.message.len() - cut.len());
        }
        self
    }

    pub fn hint(&self) -> Option<&str> {
        self.data.as_ref()?.get("hint")?.as_str()
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        if let Some(h) = self.hint() {
            write!(f, " (hint: {h})")?;
        }
        Ok(())
    }
}

impl std::error::Error for RpcError {}

/// A response; exactly one of `result` and `error` is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub jsonrpc: String,
    pub id: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RpcError>,
}

impl Response {
    pub fn ok(id: Value, result: Value) -> Self {
        Response { jsonrpc: "2.0".into(), id, result: Some(result), error: None }
    }
    pub fn err(id: Value, error: RpcError) -> Self {
        Response { jsonrpc: "2.0".into(), id, result: None, error: Some(error) }
    }
}

/// A pushed notification's params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    pub topic: String,
    pub kind: String,
    pub data: Value,
}

/// Topics a client may subscribe to.
pub const TOPICS: &[&str] = &["tasks", "defs", "alerts", "queues", "agent"];

// ----- params and results -----

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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogsResult {
    pub text: String,
    pub next_offset: u64,
    pub eof: bool,
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
    /// The context; `null` in lists (which carry summaries), whole in `tasks.get`.
    pub context: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<StepRun>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transitions: Option<Vec<Transition>>,
}

/// One row of the step ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DryRunResult {
    pub task: String,
    pub valid: bool,
    pub steps: Vec<DryRunStep>,
}

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
    pub timeout_secs: f64,
    pub retry: u32,
    pub idempotent: bool,
    pub describe: Value,
    pub error: Option<String>,
    /// How its recent runs went, when it has run.
    #[serde(default)]
    pub stats: Option<PluginStats>,
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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueStats {
    pub queue: String,
    pub running: u64,
    pub limit: Option<u64>,
    pub pending: u64,
    pub retrying: u64,
    pub oldest_pending_secs: Option<f64>,
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
    pub ended: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// Ended per minute over the window.
    pub per_minute: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub kind: String,
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
    pub shutting_down: bool,
    /// Why the store cannot be written now (disk full, read-only), if so.
    #[serde(default)]
    pub store_error: Option<String>,
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
    pub topics: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn request_and_response_round_trip() {
        let r = Request::new(7, "tasks.get", json!({"id": "01J"}));
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, r#"{"jsonrpc":"2.0","id":7,"method":"tasks.get","params":{"id":"01J"}}"#);
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), r);
        let e = Response::err(json!(7), RpcError::new(code::NOT_FOUND, "no instance 01J").with_hint("apollo ls"));
        let text = serde_json::to_string(&e).unwrap();
        let back: Response = serde_json::from_str(&text).unwrap();
        assert_eq!(back.error.unwrap().to_string(), "no instance 01J (hint: apollo ls)");
    }

    #[test]
    fn states_travel_as_screaming_snake_case() {
        let p: ListParams = serde_json::from_value(json!({"state": "ROLLED_BACK"})).unwrap();
        assert_eq!(p.state, Some(TaskState::RolledBack));
        assert!(serde_json::from_value::<ListParams>(json!({"bogus": 1})).is_err());
    }

    #[test]
    fn every_mutating_method_is_a_method() {
        assert!(MUTATING.iter().all(|m| METHODS.contains(m)));
    }
}
