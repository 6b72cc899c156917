//! Every method as a type: its wire name, its params and its result. The
//! agent parses a request into one [`Call`] and answers each variant with
//! that method's result type; clients send `Client::request::<M>(params)`
//! and get `M::Result` back. A method exists in one place, the list below.

use super::archive::{ExportPage, ExportParams};
use super::items::{ItemRun, ItemsParams};
use super::rails::*;
use super::rollouts::*;
use super::status::*;
use super::timeline::{Timeline, TimelineParams};
use super::types::{self, *};
use super::{code, RpcError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// One protocol method.
pub trait Method {
    /// Its name on the wire.
    const NAME: &'static str;
    /// Whether it changes state (and so needs the operator role).
    const MUTATING: bool;
    /// The params it takes, as an error message lists them.
    const EXPECTED: &'static str;
    type Params: Serialize + DeserializeOwned + Send + std::fmt::Debug;
    type Result: Serialize + DeserializeOwned + Send;

    /// Reads this method's params (`null` or absent reads as `{}`), or
    /// says what was expected.
    fn params(v: Value) -> Result<Self::Params, RpcError> {
        let v = if v.is_null() { Value::Object(Default::default()) } else { v };
        serde_json::from_value(v).map_err(|e| {
            RpcError::new(code::INVALID_PARAMS, format!("{}: {e} (expected {})", Self::NAME, Self::EXPECTED))
        })
    }
}

macro_rules! methods {
    ($($(#[$m:meta])* $ty:ident = $name:literal ($params:ty) -> $result:ty, $mutating:literal, $expected:literal;)*) => {
        $(
            $(#[$m])*
            #[derive(Debug, Clone, Copy)]
            pub struct $ty;
            impl Method for $ty {
                const NAME: &'static str = $name;
                const MUTATING: bool = $mutating;
                const EXPECTED: &'static str = $expected;
                type Params = $params;
                type Result = $result;
            }
        )*

        /// A request the agent understands, with its params read.
        #[derive(Debug, Clone)]
        pub enum Call {
            $($ty($params),)*
        }

        impl Call {
            /// Reads a request; an unknown method gets `METHOD_NOT_FOUND`
            /// naming the known ones, bad params `INVALID_PARAMS` naming the
            /// expected ones.
            pub fn parse(method: &str, params: Value) -> Result<Call, RpcError> {
                match method {
                    $($name => Ok(Call::$ty(<$ty as Method>::params(params)?)),)*
                    _ => Err(RpcError::new(
                        code::METHOD_NOT_FOUND,
                        format!("unknown method {method:?} (known: {})", METHODS.join(", ")),
                    )),
                }
            }

            pub fn method(&self) -> &'static str {
                match self {
                    $(Call::$ty(_) => $name,)*
                }
            }
        }

        /// Every method the agent answers.
        pub const METHODS: &[&str] = &[$($name,)*];

        /// Whether `method` changes state (and needs the operator role).
        pub fn is_mutating(method: &str) -> bool {
            match method {
                $($name => $mutating,)*
                _ => false,
            }
        }
    };
}

methods! {
    /// The first call: who is calling, which protocol.
    Hello = "hello" (types::Hello) -> HelloResult, false, "client, protocol";
    AgentStatus = "agent.status" (NoParams) -> types::AgentStatus, false, "no params";
    AgentMetrics = "agent.metrics" (NoParams) -> MetricsText, false, "no params";
    /// What ended over the last minutes, from the store.
    AgentStats = "agent.stats" (StatsParams) -> StatsResult, false, "minutes?";
    TasksList = "tasks.list" (ListParams) -> ListResult, false, "state?, task?, queue?, limit?, cursor?, archived?";
    /// One instance with its steps and history.
    TasksGet = "tasks.get" (IdParams) -> Instance, false, "id";
    /// Instances' history as one time-ordered list of events, for a postmortem.
    TasksTimeline = "tasks.timeline" (TimelineParams) -> Timeline, false, "ids, or since?, until?, queue?, task?, trace?";
    TasksTrigger = "tasks.trigger" (TriggerParams) -> TriggerResult, true, "task, params?, dedup_key?, reason?";
    /// What a run would do, without running anything.
    TasksDryRun = "tasks.dry_run" (TriggerParams) -> DryRunResult, false, "task, params?";
    TasksRetry = "tasks.retry" (IdParams) -> Instance, true, "id, reason?";
    TasksRollback = "tasks.rollback" (IdParams) -> Instance, true, "id, reason?";
    TasksCancel = "tasks.cancel" (IdParams) -> Instance, true, "id, reason?";
    StepsLogs = "steps.logs" (LogsParams) -> LogsResult, false, "id, step, offset?, item?";
    /// A fan-out step's items, each with its state, output, error and history.
    StepsItems = "steps.items" (ItemsParams) -> Vec<ItemRun>, false, "id, step (name or seq)";
    /// Marks a FAILED instance's failed step done by hand; it resumes after it.
    StepsSkip = "steps.skip" (SkipParams) -> Instance, true, "id, step (name or seq), reason";
    DefsList = "defs.list" (NoParams) -> Vec<DefInfo>, false, "no params";
    DefsGet = "defs.get" (DefParams) -> DefDetail, false, "task";
    PluginsList = "plugins.list" (NoParams) -> Vec<PluginInfo>, false, "no params";
    QueuesStats = "queues.stats" (NoParams) -> Vec<QueueStats>, false, "no params";
    EventsPublish = "events.publish" (PublishParams) -> PublishResult, true, "name, data?, dedup_key?";
    EventsList = "events.list" (LimitParams) -> Vec<EventRecord>, false, "limit?";
    AlertsList = "alerts.list" (LimitParams) -> Vec<Alert>, false, "limit?";
    AuditList = "audit.list" (LimitParams) -> Vec<AuditEntry>, false, "limit?";
    /// Archived instances that ended before a time, a page at a time (for an export).
    ArchiveExport = "archive.export" (ExportParams) -> ExportPage, false, "before, after?";
    AgentsList = "agents.list" (NoParams) -> Vec<AgentInfo>, false, "no params";
    /// The rollouts, latest first, each with its two versions' figures.
    RolloutsList = "rollouts.list" (NoParams) -> Vec<Rollout>, false, "no params";
    /// Sends a share of new instances to a plugin's new version.
    RolloutsStart = "rollouts.start" (RolloutStart) -> Rollout, true, "plugin, version, share_pct?, agents?, abort_margin_pct?, min_runs?, reason";
    /// Makes a running rollout's version the one for every step that accepts it.
    RolloutsPromote = "rollouts.promote" (RolloutEnd) -> Rollout, true, "plugin, reason";
    /// Sends everything back to the version a running rollout replaces.
    RolloutsAbort = "rollouts.abort" (RolloutEnd) -> Rollout, true, "plugin, reason";
    /// Approvals waiting for a decision, then the latest decided ones.
    ApprovalsList = "approvals.list" (NoParams) -> Vec<Approval>, false, "no params";
    /// Approves (or with `deny`, denies) the approval an instance waits for.
    ApprovalsDecide = "approvals.decide" (ApprovalDecide) -> Approval, true, "id (the instance), deny?, reason";
    /// Every lock held or waited for: its holder, how many wait.
    LocksList = "locks.list" (NoParams) -> Vec<LockInfo>, false, "no params";
    /// The pauses and freeze windows in force.
    PausesList = "pauses.list" (NoParams) -> Vec<Pause>, false, "no params";
    /// Claims nothing new in a scope (queue, task or all) until resumed or `until`.
    SchedulerPause = "scheduler.pause" (PauseStart) -> Pause, true, "scope (all, queue, task), target?, until?, reason";
    /// Ends the operators' pauses of a scope; returns those it ended.
    SchedulerResume = "scheduler.resume" (PauseEnd) -> Vec<Pause>, true, "scope (all, queue, task), target?, reason";
    /// Pushed events on these topics from now on (the connection's only subscription).
    Subscribe = "subscribe" (SubscribeParams) -> SubscribeResult, false, "{\"topics\": [...]}";
}
