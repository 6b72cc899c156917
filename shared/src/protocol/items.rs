//! A fan-out step's items as the protocol shows them: counts on the step
//! (`tasks.get`), and each item (`steps.items`).

use crate::state::StepState;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A fan-out step's items counted by where they stand.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemCounts {
    pub total: u32,
    pub ok: u32,
    pub failed: u32,
    pub running: u32,
    /// Not started yet in this attempt of the step.
    pub waiting: u32,
    /// Never started because the failure budget was spent (or the step
    /// ended first); a retry runs them.
    pub not_started: u32,
    pub rolled_back: u32,
    /// Skipped by hand (`apollo skip ID STEP --item`): done, never run again.
    #[serde(default)]
    pub skipped: u32,
    /// The batch under way (1-based; the last one begun) and how many there are.
    pub batch: u32,
    pub batches: u32,
    /// Failures allowed over the whole step.
    pub budget: u32,
}

impl ItemCounts {
    /// One line: `batch 2/3  31 ok, 1 failed, 6 running, 2 waiting`.
    pub fn line(&self) -> String {
        let mut parts = vec![format!("{} ok", self.ok)];
        for (n, what) in [
            (self.failed, "failed"),
            (self.running, "running"),
            (self.waiting, "waiting"),
            (self.not_started, "not started"),
            (self.rolled_back, "rolled back"),
            (self.skipped, "skipped"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        let batch = match self.batches {
            0 | 1 => String::new(),
            b => format!("batch {}/{b}  ", self.batch.max(1)),
        };
        format!("{batch}{} of {} items: {}", self.ok, self.total, parts.join(", "))
    }
}

/// One item of a fan-out step: its own ledger row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemRun {
    /// 0-based, in the order of the list.
    pub index: u32,
    /// The item as shown: its text, or its JSON on one line.
    pub label: String,
    pub value: Value,
    /// 1-based.
    pub batch: u32,
    pub state: StepState,
    pub attempts: u32,
    pub params: Option<Value>,
    pub output: Option<Value>,
    /// The last attempt's error; for an item never started, why.
    pub error: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Its place in the order items ended in (a rollback undoes in reverse).
    pub done: Option<u32>,
    /// Its moves, one line each: time, from → to, why.
    #[serde(default)]
    pub history: Vec<String>,
    /// The agent that ran its last attempt (`name:pid`); its log is there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
}

impl ItemRun {
    /// Not started in the step's last attempt (the budget was spent first).
    pub fn not_started(&self) -> bool {
        self.state == StepState::Pending && self.error.is_some()
    }
}

/// `steps.items`: the items of an instance's fan-out step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemsParams {
    pub id: String,
    /// A step name or its 0-based seq.
    pub step: Value,
    /// The first item's index (a page starts where the last one ended).
    #[serde(default)]
    pub from: u32,
    /// At most this many (and never more than [`MAX_ITEMS_PAGE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// The most items one `steps.items` answer holds.
pub const MAX_ITEMS_PAGE: u32 = 500;

/// What a dry-run says of a fan-out step: its items as they render now and
/// the batches they would run in (the params shown are the first item's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DryRunFanout {
    /// The items' labels; empty when `foreach` reads an earlier step's output.
    pub items: Vec<String>,
    pub count: u32,
    /// Each batch's size.
    pub batches: Vec<u32>,
    pub budget: u32,
    /// The most items at once within a batch (before the agent's
    /// `scheduler.concurrency`, which caps it).
    pub parallel: u32,
    /// Why the items are not known, or cannot run (not a list, too many,
    /// batches short of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// The batch after which an approval is asked (`approve_after_batch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approve_after: Option<u32>,
}

impl DryRunFanout {
    /// One line: `items: 40 in 3 batch(es) (1, 10, 29), failure budget 2, up to 4 at once: web-00, …`.
    pub fn line(&self) -> String {
        if let Some(p) = &self.problem {
            return format!("items: {p}");
        }
        let sizes: Vec<String> = self.batches.iter().map(u32::to_string).collect();
        let shown: Vec<&str> = self.items.iter().take(8).map(String::as_str).collect();
        let more = if self.items.len() > 8 { ", …" } else { "" };
        let gate = self.approve_after.map(|b| format!(", an approval after batch {b}")).unwrap_or_default();
        format!(
            "items: {} in {} batch(es) ({}){gate}, failure budget {}, up to {} at once: {}{more}",
            self.count,
            self.batches.len(),
            sizes.join(", "),
            self.budget,
            self.parallel,
            shown.join(", ")
        )
    }
}
