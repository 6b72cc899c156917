//! What a step's failure, a step's interruption and a missed schedule fire do.

use super::*;

/// What happens when a step has used up its retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// Roll back the failed step, then every succeeded step in reverse order.
    #[default]
    Rollback,
    /// Leave the instance FAILED for an operator to retry or roll back.
    Stop,
    /// Let the failure through: the step stays FAILED and counted, the next
    /// step runs, and the instance can end SUCCESS "with failed steps"
    /// (Dagu's continueOn, Rundeck's keepgoing).
    Continue,
}

impl OnFailure {
    /// `rollback`, `stop` or `continue`, as written; `None` for anything else.
    pub fn parse(v: &Value) -> Option<OnFailure> {
        match v.as_str()? {
            "rollback" => Some(OnFailure::Rollback),
            "stop" => Some(OnFailure::Stop),
            "continue" => Some(OnFailure::Continue),
            _ => None,
        }
    }
}

/// What a step interrupted by a crash, a takeover or a shutdown does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnInterrupt {
    /// It runs again (at-least-once; the step should be idempotent).
    #[default]
    Rerun,
    /// It is not run again blindly: the instance fails saying so, with no
    /// automatic rollback, for an operator to retry, skip or roll back.
    Hold,
}

impl OnInterrupt {
    /// `rerun` or `hold`, as written.
    pub fn parse(v: &Value) -> Option<OnInterrupt> {
        match v.as_str()? {
            "rerun" => Some(OnInterrupt::Rerun),
            "hold" => Some(OnInterrupt::Hold),
            _ => None,
        }
    }
}

/// What a schedule does about fires missed while the agent was down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Catchup {
    /// Never run missed fires.
    Skip,
    /// Run the most recent missed fire once.
    #[default]
    Latest,
    /// Run every missed fire, up to the agent's `scheduler.catchup_max`.
    All,
}
