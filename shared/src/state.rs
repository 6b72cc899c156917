//! The state machines of task instances and of their steps.
//!
//! This module is the only place that decides whether a transition is legal.
//! The store calls [`check_task`] / [`check_step`] before every state write;
//! nothing else in the code base compares states to allow or refuse a move.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The state of a task instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskState {
    /// Created by a trigger and waiting for a free slot. The scheduler's claim
    /// moves it to RUNNING; a cancel moves it through RUNNING to FAILED.
    Pending,
    /// Held by an agent under a lease while its steps run. The executor moves
    /// it to SUCCESS when the last step succeeds, or to FAILED when a step
    /// fails, times out, is cancelled, or the reaper finds it stuck.
    Running,
    /// Every step succeeded. Terminal.
    Success,
    /// A step failed. The executor moves it to RETRYING when the failed step
    /// has retries left, or to ROLLED_BACK once the rollback has run; an
    /// operator may retry or roll back. It stays FAILED when `on_failure:
    /// stop` or a rollback failed.
    Failed,
    /// Waiting for its backoff to pass; the scheduler's claim moves it to
    /// RUNNING, resuming at the failed step.
    Retrying,
    /// The failed step and every succeeded step were rolled back in reverse
    /// order. Terminal.
    RolledBack,
}

/// The state of one step of one instance (a row of the step ledger).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum StepState {
    /// Not started yet. Moves to RUNNING when the executor reaches it, or to
    /// SKIPPED when the instance ends before reaching it.
    #[default]
    Pending,
    /// Executing. Moves to SUCCESS or FAILED when the plugin returns, times
    /// out, is cancelled, or the agent restarts under it.
    Running,
    /// Its output is committed with the context; it never runs again for this
    /// instance. Moves to ROLLED_BACK only through a rollback.
    Success,
    /// The last attempt failed. Moves to RUNNING on a retry, to ROLLED_BACK
    /// through a rollback, or to SKIPPED when an operator marks it done by
    /// hand (`apollo skip`).
    Failed,
    /// Never ran because the instance ended first, or skipped by an operator
    /// after it failed (the instance then goes on past it). Terminal.
    Skipped,
    /// Its side effects were undone. Terminal.
    RolledBack,
}

/// How a state reads at a glance: the console and the CLI colour by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    /// Done well (SUCCESS).
    Good,
    /// Failed (FAILED).
    Bad,
    /// Under way (RUNNING).
    Busy,
    /// Waiting to try again (RETRYING).
    Waiting,
    /// Undone (ROLLED_BACK).
    Undone,
    /// Not started, or never to run (PENDING, SKIPPED).
    Quiet,
    /// None of these.
    Plain,
}

impl Tone {
    /// The tone of a state named as stored (a history row's `to`, a count's
    /// key): an instance's or a step's state, else plain.
    pub fn of_name(name: &str) -> Tone {
        match (name.parse::<TaskState>(), name.parse::<StepState>()) {
            (Ok(t), _) => t.tone(),
            (_, Ok(s)) => s.tone(),
            _ => Tone::Plain,
        }
    }
}

impl TaskState {
    pub fn tone(self) -> Tone {
        match self {
            TaskState::Pending => Tone::Quiet,
            TaskState::Running => Tone::Busy,
            TaskState::Success => Tone::Good,
            TaskState::Failed => Tone::Bad,
            TaskState::Retrying => Tone::Waiting,
            TaskState::RolledBack => Tone::Undone,
        }
    }
}

impl StepState {
    pub fn tone(self) -> Tone {
        match self {
            StepState::Pending | StepState::Skipped => Tone::Quiet,
            StepState::Running => Tone::Busy,
            StepState::Success => Tone::Good,
            StepState::Failed => Tone::Bad,
            StepState::RolledBack => Tone::Undone,
        }
    }
}

/// A refused transition: the caller asked for something the table forbids.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal transition {from} -> {to} for {what} (allowed from {from}: {allowed})")]
pub struct IllegalTransition {
    pub what: &'static str,
    pub from: String,
    pub to: String,
    pub allowed: String,
}

impl TaskState {
    pub const ALL: [TaskState; 6] = [
        TaskState::Pending,
        TaskState::Running,
        TaskState::Success,
        TaskState::Failed,
        TaskState::Retrying,
        TaskState::RolledBack,
    ];

    /// The states this one may move to: the transition table of the design.
    pub fn next(self) -> &'static [TaskState] {
        use TaskState::*;
        match self {
            Pending => &[Running],
            // RUNNING → PENDING: parked at an approval step (no slot, no
            // lease, no process) until a decision lets it be claimed again.
            Running => &[Success, Failed, Pending],
            Failed => &[Retrying, RolledBack],
            Retrying => &[Running],
            // An operator's rollback of a SUCCESS instance (every step undone
            // in reverse). An undo of it that fails leaves it FAILED, a move
            // only that rollback makes (`store::write::rollback_failed`,
            // guarded by the rollback in progress): no other write may turn
            // a recorded success into a failure.
            Success => &[RolledBack],
            RolledBack => &[],
        }
    }

    /// Ended: SUCCESS (which only an operator's rollback moves on) or
    /// ROLLED_BACK.
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskState::Success | TaskState::RolledBack)
    }

    /// Runnable, not yet claimed: PENDING or RETRYING.
    pub fn is_waiting(self) -> bool {
        matches!(self, TaskState::Pending | TaskState::Retrying)
    }

    pub fn as_str(self) -> &'static str {
        use TaskState::*;
        match self {
            Pending => "PENDING",
            Running => "RUNNING",
            Success => "SUCCESS",
            Failed => "FAILED",
            Retrying => "RETRYING",
            RolledBack => "ROLLED_BACK",
        }
    }
}

impl StepState {
    pub const ALL: [StepState; 6] = [
        StepState::Pending,
        StepState::Running,
        StepState::Success,
        StepState::Failed,
        StepState::Skipped,
        StepState::RolledBack,
    ];

    pub fn next(self) -> &'static [StepState] {
        use StepState::*;
        match self {
            Pending => &[Running, Skipped],
            Running => &[Success, Failed],
            Success => &[RolledBack],
            Failed => &[Running, RolledBack, Skipped],
            Skipped | RolledBack => &[],
        }
    }

    pub fn as_str(self) -> &'static str {
        use StepState::*;
        match self {
            Pending => "PENDING",
            Running => "RUNNING",
            Success => "SUCCESS",
            Failed => "FAILED",
            Skipped => "SKIPPED",
            RolledBack => "ROLLED_BACK",
        }
    }
}

fn check<S: Copy + PartialEq + fmt::Display>(
    what: &'static str,
    from: S,
    to: S,
    next: &[S],
) -> Result<(), IllegalTransition> {
    if next.contains(&to) {
        return Ok(());
    }
    let allowed = if next.is_empty() {
        "nothing, it is terminal".to_string()
    } else {
        next.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")
    };
    Err(IllegalTransition { what, from: from.to_string(), to: to.to_string(), allowed })
}

/// What an operator can ask of an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorAction {
    Retry,
    Rollback,
    Cancel,
}

impl OperatorAction {
    /// Its name, as the CLI's subcommand and the results call it.
    pub fn name(self) -> &'static str {
        match self {
            OperatorAction::Retry => "retry",
            OperatorAction::Rollback => "rollback",
            OperatorAction::Cancel => "cancel",
        }
    }

    pub fn verb(self) -> &'static str {
        match self {
            OperatorAction::Retry => "retry",
            OperatorAction::Rollback => "roll back",
            OperatorAction::Cancel => "cancel",
        }
    }

    /// Rollback and cancel undo or stop work; on a production context they
    /// need the task name typed and a reason. A batch of anything does too.
    pub fn destructive(self) -> bool {
        !matches!(self, OperatorAction::Retry)
    }

    /// What the action does to an instance in `state` under the transition
    /// table (`FAILED → RETRYING`), or why the table refuses it. The agent
    /// checks again when it acts; this is the preview.
    pub fn plan(self, state: TaskState) -> Result<String, String> {
        use TaskState::*;
        match self {
            OperatorAction::Retry => {
                check_task(state, Retrying).map(|()| format!("{state} → RETRYING")).map_err(|e| e.to_string())
            }
            OperatorAction::Rollback => {
                check_task(state, RolledBack).map(|()| format!("{state} → ROLLED_BACK")).map_err(|e| e.to_string())
            }
            OperatorAction::Cancel => match state {
                Pending | Retrying => Ok(format!("{state} → RUNNING → FAILED (no step runs)")),
                Running => Ok("RUNNING → FAILED (its step is stopped)".to_string()),
                _ => Err(format!("instance is {state}; only PENDING, RETRYING and RUNNING instances can be cancelled")),
            },
        }
    }
}

/// Refuses any task transition that is not in the table.
pub fn check_task(from: TaskState, to: TaskState) -> Result<(), IllegalTransition> {
    check("task instance", from, to, from.next()).map_err(|mut e| {
        if from == TaskState::Success {
            e.allowed = "only an operator's rollback (to ROLLED_BACK; FAILED if an undo fails), it has ended".into();
        }
        e
    })
}

/// Refuses any step transition that is not in the table.
pub fn check_step(from: StepState, to: StepState) -> Result<(), IllegalTransition> {
    check("step", from, to, from.next())
}

/// Whether an instance whose steps are in these states can be retried: every
/// step that has not succeeded must be able to run again under the step
/// table. A SKIPPED or ROLLED_BACK step never runs again, so an instance that
/// holds one (cancelled while queued, partly rolled back) cannot resume; the
/// refusal names the first such step and says what to do instead.
pub fn check_resume<'a>(steps: impl IntoIterator<Item = (&'a str, u32, StepState)>) -> Result<(), String> {
    for (name, seq, state) in steps {
        if state != StepState::Success && check_step(state, StepState::Running).is_err() {
            let why = match state {
                StepState::Skipped => "the instance ended before it ran",
                StepState::RolledBack => "its effects were rolled back",
                _ => "it cannot run again",
            };
            return Err(format!(
                "step {name:?} (#{seq}) is {state} ({why}) and never runs again, so the instance cannot resume; \
                 roll it back or trigger a new instance"
            ));
        }
    }
    Ok(())
}

macro_rules! text_form {
    ($t:ty, $kind:literal) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                // The store's rows hold the names as written: no copy made.
                if let Some(st) = Self::ALL.iter().copied().find(|st| st.as_str() == s) {
                    return Ok(st);
                }
                let up = s.trim().to_ascii_uppercase().replace('-', "_");
                Self::ALL.iter().copied().find(|st| st.as_str() == up).ok_or_else(|| {
                    let names: Vec<_> = Self::ALL.iter().map(|st| st.as_str()).collect();
                    format!("unknown {} state {:?} (expected one of: {})", $kind, s, names.join(", "))
                })
            }
        }
    };
}
text_form!(TaskState, "task");
text_form!(StepState, "step");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_actions_are_planned_by_the_table() {
        use OperatorAction::*;
        assert_eq!(Retry.plan(TaskState::Failed).unwrap(), "FAILED → RETRYING");
        let e = Retry.plan(TaskState::Success).unwrap_err();
        assert!(e.contains("illegal transition SUCCESS -> RETRYING") && e.contains("it has ended"), "{e}");
        assert_eq!(Rollback.plan(TaskState::Success).unwrap(), "SUCCESS → ROLLED_BACK");
        assert!(Rollback.plan(TaskState::Running).is_err());
        assert!(Cancel.plan(TaskState::Pending).is_ok() && Cancel.plan(TaskState::Failed).is_err());
        assert!(Rollback.destructive() && Cancel.destructive() && !Retry.destructive());
    }

    #[test]
    fn every_task_pair_follows_the_table() {
        use TaskState::*;
        let legal = [
            (Pending, Running),
            (Running, Success),
            (Running, Failed),
            (Running, Pending),
            (Failed, Retrying),
            (Failed, RolledBack),
            (Retrying, Running),
            // An operator's rollback of a success.
            (Success, RolledBack),
        ];
        for from in TaskState::ALL {
            for to in TaskState::ALL {
                let ok = check_task(from, to).is_ok();
                assert_eq!(ok, legal.contains(&(from, to)), "{from} -> {to}");
            }
        }
        assert!(Success.is_terminal() && RolledBack.is_terminal());
    }

    #[test]
    fn every_step_pair_follows_the_table() {
        use StepState::*;
        let legal = [
            (Pending, Running),
            (Pending, Skipped),
            (Running, Success),
            (Running, Failed),
            (Success, RolledBack),
            (Failed, Running),
            (Failed, RolledBack),
            // An operator's skip (`apollo skip`).
            (Failed, Skipped),
        ];
        for from in StepState::ALL {
            for to in StepState::ALL {
                assert_eq!(check_step(from, to).is_ok(), legal.contains(&(from, to)), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn resume_needs_every_unfinished_step_runnable() {
        use StepState::*;
        assert!(check_resume([("a", 0, Success), ("b", 1, Failed), ("c", 2, Pending)]).is_ok());
        let e = check_resume([("a", 0, Success), ("b", 1, Skipped)]).unwrap_err();
        assert!(e.contains("step \"b\" (#1) is SKIPPED"), "{e}");
        let e = check_resume([("a", 0, RolledBack), ("b", 1, Failed)]).unwrap_err();
        assert!(e.contains("ROLLED_BACK"), "{e}");
    }

    #[test]
    fn refusal_names_the_allowed_moves() {
        let e = check_task(TaskState::Success, TaskState::Retrying).unwrap_err();
        assert_eq!(
            e.to_string(),
            "illegal transition SUCCESS -> RETRYING for task instance (allowed from SUCCESS: only an operator's \
             rollback (to ROLLED_BACK; FAILED if an undo fails), it has ended)"
        );
        let e = check_task(TaskState::Pending, TaskState::Success).unwrap_err();
        assert!(e.to_string().contains("allowed from PENDING: RUNNING"));
    }

    #[test]
    fn states_parse_case_insensitively() {
        assert_eq!("rolled_back".parse::<TaskState>().unwrap(), TaskState::RolledBack);
        assert_eq!("failed".parse::<TaskState>().unwrap(), TaskState::Failed);
        assert!("DONE".parse::<TaskState>().unwrap_err().contains("expected one of"));
    }
}
