//! The safety rails' types. Pauses and freeze windows: nothing new is
//! claimed in their scope (a queue, a task, or everything) while one is in
//! force; running instances go on, and what triggers, events and schedules
//! create waits. An operator's pause is in the store (cluster-wide,
//! surviving restarts, audited); a freeze window is `scheduler.freezes`.
//! Locks: who holds which, and how many wait. Approvals: an approval step's
//! request, who may decide it, and the decision.

use serde::{Deserialize, Serialize};

names! {
    /// What a pause covers.
    pub enum PauseScope {
        /// Every queue and task.
        All = "all",
        /// One queue's instances.
        Queue = "queue",
        /// One task's instances.
        Task = "task",
    }
    "pause scope"
}

impl<'de> Deserialize<'de> for PauseScope {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A pause in force: an operator's, or a freeze window's (`freeze` names it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// `pause-…` for an operator's; `freeze:NAME` for a window.
    pub id: String,
    pub scope: PauseScope,
    /// The queue or task (none for `all`).
    #[serde(default)]
    pub target: Option<String>,
    pub reason: String,
    /// Who paused (for a freeze window: `config`).
    pub by: String,
    pub since: String,
    /// When it ends by itself, if it does.
    #[serde(default)]
    pub until: Option<String>,
    /// The freeze window's name, when it is one.
    #[serde(default)]
    pub freeze: Option<String>,
}

impl Pause {
    /// Whether it covers an instance of `task` in `queue`.
    pub fn covers(&self, queue: &str, task: &str) -> bool {
        match self.scope {
            PauseScope::All => true,
            PauseScope::Queue => self.target.as_deref() == Some(queue),
            PauseScope::Task => self.target.as_deref() == Some(task),
        }
    }

    /// What it covers, as a person says it: `all`, `queue q`, `task t`.
    pub fn what(&self) -> String {
        match &self.target {
            Some(t) => format!("{} {t}", self.scope),
            None => self.scope.to_string(),
        }
    }

    /// One line: what, by whom since when, until when, why.
    pub fn line(&self) -> String {
        let kind = match &self.freeze {
            Some(name) => format!("freeze window {name}"),
            None => format!("paused by {}", self.by),
        };
        let until = self.until.as_deref().map(|u| format!(" until {u}")).unwrap_or_default();
        format!("{}: {kind} since {}{until}: {}", self.what(), self.since, self.reason)
    }
}

/// `scheduler.pause`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseStart {
    pub scope: PauseScope,
    /// The queue or task (none for `all`).
    #[serde(default)]
    pub target: Option<String>,
    /// RFC 3339: the pause ends by itself then.
    #[serde(default)]
    pub until: Option<String>,
    pub reason: String,
}

/// `scheduler.resume`: ends the operators' pauses of this scope (a freeze
/// window ends only with its window or its configuration).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseEnd {
    pub scope: PauseScope,
    #[serde(default)]
    pub target: Option<String>,
    pub reason: String,
}

/// An instance under way holding a lock (`locks.list`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHolder {
    pub lock: String,
    /// The instance holding it, its task, since when (its start), and the
    /// agent running it.
    pub id: String,
    pub task: String,
    #[serde(default)]
    pub since: Option<String>,
    #[serde(default)]
    pub agent: Option<String>,
}

/// A lock held or waited for: who holds it, how many instances wait for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    pub lock: String,
    #[serde(default)]
    pub holder: Option<LockHolder>,
    pub waiting: u64,
}

impl LockHolder {
    /// How every [`waiting_line`](Self::waiting_line) begins.
    pub const WAITING: &'static str = "waiting for lock ";

    /// Why an instance that wants this lock waits.
    pub fn waiting_line(&self) -> String {
        let since = self.since.as_deref().map(|s| format!(" since {s}")).unwrap_or_default();
        format!("{}{} held by {} (task {}){since}", Self::WAITING, self.lock, self.id, self.task)
    }
}

/// Who may decide an approval: users and groups (by name); both empty:
/// any operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Approvers {
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub groups: Vec<String>,
}

impl Approvers {
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self.users.clone();
        parts.extend(self.groups.iter().map(|g| format!("group {g}")));
        match parts.is_empty() {
            true => "any operator".into(),
            false => parts.join(", "),
        }
    }
}

/// An approval step's request and, once given, its decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    pub id: String,
    /// The instance waiting, its task, and the step (name and seq).
    pub instance: String,
    pub task: String,
    pub step: String,
    pub seq: u32,
    pub message: String,
    pub approvers: Approvers,
    /// Whoever triggered the instance (`distinct_approver` refuses them).
    pub requested_by: String,
    pub distinct_approver: bool,
    pub requested_at: String,
    /// When a timeout decides it (`on_timeout`), if ever.
    #[serde(default)]
    pub deadline: Option<String>,
    pub on_timeout: String,
    /// `approved`, `denied`, `timed_out` or `cancelled`; none while it waits.
    #[serde(default)]
    pub decision: Option<String>,
    #[serde(default)]
    pub decided_by: Option<String>,
    #[serde(default)]
    pub decided_at: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
}

impl Approval {
    /// The commands that decide it.
    pub fn commands(&self) -> String {
        format!("apollo approve {} --reason '…' (or --deny)", self.instance)
    }

    /// Why its instance waits.
    pub fn waiting_line(&self) -> String {
        let until =
            self.deadline.as_deref().map(|d| format!(", until {d} (then {})", self.on_timeout)).unwrap_or_default();
        format!(
            "waiting for approval of step {} by {} since {}{until}: {}",
            self.step,
            self.approvers.describe(),
            self.requested_at,
            self.message
        )
    }
}

/// `approvals.decide`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalDecide {
    /// The instance that waits.
    pub id: String,
    #[serde(default)]
    pub deny: bool,
    pub reason: String,
}
