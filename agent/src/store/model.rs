//! What the store's operations take and give: a new instance, a step's
//! start and SUCCESS, a claim's moves, what a move changes besides its state.
//! Named fields, not positional tuples; shared by the drivers and the
//! portable code.

use super::value::{Row, V};
use apollo_shared::protocol::Instance;
use apollo_shared::state::{check_task, StepState, TaskState};
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

/// What a trigger asks the store to create.
#[derive(Debug, Clone)]
pub struct NewInstance {
    pub id: String,
    pub task: String,
    pub def_hash: String,
    pub queue: String,
    pub priority: u8,
    pub max_active: Option<u32>,
    pub params: Map<String, Value>,
    /// What the store keeps of the initial context (`Context::stored`: the
    /// work dir and the event; the rest is the row's and its steps').
    pub context: Value,
    pub trace_id: String,
    pub trigger: String,
    pub dedup_key: Option<String>,
    /// (name, plugin) of each step, in order.
    pub steps: Vec<(String, String)>,
    /// Sum of the steps' timeouts when it was created (a record; the
    /// reaper works its expected time out afresh, see `scheduler::reaper`).
    pub expected_secs: f64,
    /// Its rollout arms (see `rollouts.start`); empty outside a rollout.
    pub pins: apollo_shared::protocol::Pins,
    /// The locks it takes with its claim (rendered from `locks:`).
    pub locks: Vec<String>,
}

impl NewInstance {
    /// The locks as stored: `NULL` for none.
    pub fn locks_json(&self) -> Option<String> {
        (!self.locks.is_empty()).then(|| serde_json::to_string(&self.locks).unwrap_or_default())
    }

    /// The arms as stored: `NULL` for none.
    pub fn pins_json(&self) -> Option<String> {
        (!self.pins.is_empty()).then(|| serde_json::to_string(&self.pins).unwrap_or_default())
    }

    /// The instance as `write::create` stores it at `at`, with its
    /// steps, as reading it back would give it (the context as kept, not
    /// yet made whole: see `rows::compose`).
    pub fn as_made(&self, at: DateTime<Utc>) -> Instance {
        use apollo_shared::protocol::StepRun;
        let steps = self.steps.iter().enumerate().map(|(seq, (name, plugin))| StepRun {
            seq: seq as u32,
            name: name.clone(),
            plugin: plugin.clone(),
            ..StepRun::default()
        });
        Instance {
            id: self.id.clone(),
            task: self.task.clone(),
            def_hash: self.def_hash.clone(),
            state: TaskState::Pending,
            attempt: 1,
            trace_id: self.trace_id.clone(),
            priority: self.priority,
            queue: self.queue.clone(),
            trigger: self.trigger.clone(),
            dedup_key: self.dedup_key.clone(),
            params: Value::Object(self.params.clone()),
            created_at: as_kept(at),
            started_at: None,
            finished_at: None,
            next_run_at: None,
            error: None,
            context: self.context.clone(),
            lease_owner: None,
            lease_expires_at: None,
            waiting: None,
            failed_steps: 0,
            pins: (!self.pins.is_empty()).then(|| self.pins.clone()),
            locks: self.locks.clone(),
            steps: Some(steps.collect()),
            transitions: None,
        }
    }
}

/// A time as the store keeps it, to the microsecond (what reading
/// `rows::ts`'s text back gives).
pub fn as_kept(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}

/// What follows a failure that ended an attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FailurePlan {
    /// Wait in RETRYING until this time.
    Retry(DateTime<Utc>),
    /// Stay FAILED and held while the rollback runs.
    Rollback,
    /// Stay FAILED for an operator (on_failure: stop, cancel).
    Stop,
    /// Let the step's failure through (on_failure: continue): the step is
    /// marked, the instance counts it and stays RUNNING for its next step.
    Continue,
}

/// An instance a claim or a recovery handed to this agent, with its steps.
/// A claim leaves its context as the store keeps it (`Context::stored`,
/// or the whole context an earlier release kept): the executor makes the
/// whole one with `Context::of`, which reads either, and a claim does not
/// build it as JSON only for that to be read back.
pub type Claimed = Instance;

/// What else a move changes in the same row, in the same statement: `SET`
/// assignments whose placeholders come after the move's own three.
pub struct Also<'a>(pub &'a str, pub &'a [V]);

/// Nothing else.
pub const ONLY: Also<'static> = Also("", &[]);

/// An instance's move to `to` with `also`'s changes, for the history row
/// `reason` and `actor`.
pub struct TaskMove<'a> {
    pub id: &'a str,
    pub to: TaskState,
    pub reason: &'a str,
    pub actor: &'a str,
    pub also: Also<'a>,
}

/// A step's start: the instance, the step, its plugin version and its
/// params as JSON.
#[derive(Debug, Clone, Copy)]
pub struct StepStart<'a> {
    pub id: &'a str,
    pub seq: u32,
    pub version: &'a str,
    pub params: &'a str,
}

/// A step's row as a move reads it.
#[derive(Debug, Clone, Copy)]
pub struct StepRow {
    pub state: StepState,
    pub attempts: u32,
    pub failures: u32,
}

/// A claim's move of one instance to RUNNING; `retry` when it moves from
/// RETRYING (the attempt counts up).
#[derive(Debug, Clone, Copy)]
pub struct ClaimMove<'a> {
    pub id: &'a str,
    pub retry: bool,
}

/// A history row to write: the move of the instance (`step` `None`) or of
/// one step, with why and by whom; the driver stamps its time.
#[derive(Debug, Clone, Copy)]
pub struct Hist<'a> {
    pub id: &'a str,
    pub step: Option<u32>,
    pub from: Option<&'a str>,
    pub to: &'a str,
    pub reason: &'a str,
    pub actor: &'a str,
}

/// What a driver's claim made: for each move, the row as moved (`None`: not
/// made) and the instance's steps; and each first step started, with its
/// attempt.
#[derive(Default)]
pub struct ClaimsMade {
    pub moved: Vec<(Option<Row>, Vec<Row>)>,
    pub started: Vec<(String, u32)>,
}

/// A step's SUCCESS write with what follows it (`write::step_success_and`),
/// owned for the writer thread, which makes those of one batch together
/// where the driver can ([`super::db::Driver::step_successes`]).
pub struct Success {
    pub id: String,
    pub seq: u32,
    /// The step's output, as JSON (the context is made again from the
    /// steps' outputs: `Context::of`).
    pub output: String,
    /// The next step to start: its seq, plugin version and params as JSON.
    pub next: Option<(u32, String, String)>,
    /// Ends the instance SUCCESS (when `next` is `None`).
    pub finish: bool,
    pub actor: String,
}

impl Success {
    pub fn after(&self) -> After<'_> {
        match (&self.next, self.finish) {
            (Some((n, v, p)), _) => After::Start(*n, v, p),
            (None, true) => After::Finish,
            (None, false) => After::Nothing,
        }
    }

    /// Whether it can be made with others: an instance's SUCCESS only when
    /// the table allows RUNNING → SUCCESS.
    pub fn mergeable(&self) -> bool {
        !matches!(self.after(), After::Finish) || check_task(TaskState::Running, TaskState::Success).is_ok()
    }
}

/// What follows a step's SUCCESS in the same write.
pub enum After<'a> {
    Nothing,
    /// Starts step `seq`: its plugin version and params (JSON).
    Start(u32, &'a str, &'a str),
    /// Ends the instance SUCCESS.
    Finish,
}
