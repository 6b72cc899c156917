//! A fan-out step's items: one row each in `step_items`, with its own
//! state (moved by the steps' transition table), attempts, params, output,
//! error and history (a line per move, kept on the row). Every write is
//! refused unless the step is RUNNING in an instance the writing agent
//! holds, as a step's are. The step's `fanout` column holds its plan
//! (items, batches, budget, the batch under way) as JSON.

use super::db::Db;
use super::history::history;
use super::rows::{parse_ts, ts};
use super::value::{p, Row, V};
use super::{Result, StoreError};
use apollo_shared::protocol::{Instance, ItemCounts, ItemRun};
use apollo_shared::state::{check_step, StepState};
use chrono::Utc;
use serde_json::Value;

/// One item as planned: its label, value (JSON) and 1-based batch.
#[derive(Debug, Clone)]
pub struct ItemPlan {
    pub label: String,
    pub value: Value,
    pub batch: u32,
}

/// The plan of a fan-out step as its `fanout` column keeps it.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct FanoutPlan {
    pub items: u32,
    pub batches: u32,
    pub budget: u32,
    /// The batch under way (1-based), 0 before the first.
    pub batch: u32,
    /// The step's life (each start of it, a retry's or a takeover's, is
    /// one): an item is tried once a life.
    #[serde(default)]
    pub round: u32,
}

/// How an item's attempt ended.
pub enum ItemEnd<'a> {
    Success { output: &'a str },
    Failed { error: &'a str },
}

const ITEM_COLS: &str =
    "idx, label, value, batch, state, attempts, params, output, error, started_at, finished_at, done, history, holder";

fn item(r: &Row) -> Result<ItemRun> {
    let state: String = r.get(4)?;
    let json = |s: Option<String>| s.and_then(|s| serde_json::from_str(&s).ok());
    let history: String = r.get(12)?;
    Ok(ItemRun {
        index: r.get(0)?,
        label: r.get(1)?,
        value: json(r.get(2)?).unwrap_or(Value::Null),
        batch: r.get(3)?,
        state: state.parse().map_err(StoreError::Invalid)?,
        attempts: r.get(5)?,
        params: json(r.get(6)?),
        output: json(r.get(7)?),
        error: r.get(8)?,
        started_at: parse_ts(r.get(9)?),
        finished_at: parse_ts(r.get(10)?),
        done: r.get(11)?,
        history: history.lines().map(str::to_string).collect(),
        holder: r.get(13)?,
    })
}

/// The step must be RUNNING in an instance `actor` holds.
fn held(c: &dyn Db, id: &str, seq: u32, actor: &str) -> Result<()> {
    let step = c.driver().held_step(c, id, seq, actor)?;
    if step.state != StepState::Running {
        return Err(StoreError::Invalid(format!(
            "step {seq} of instance {id} is {}, not RUNNING",
            step.state.as_str()
        )));
    }
    Ok(())
}

pub(super) fn line(from: StepState, to: StepState, why: &str) -> String {
    format!("{} {} → {}: {why}\n", ts(Utc::now()), from.as_str(), to.as_str())
}

pub(super) fn item_state(c: &dyn Db, id: &str, seq: u32, idx: u32) -> Result<StepState> {
    let s: Option<String> =
        c.value("SELECT state FROM step_items WHERE instance_id = ?1 AND seq = ?2 AND idx = ?3", p![id, seq, idx])?;
    s.ok_or_else(|| StoreError::NotFound(format!("no item {idx} in step {seq} of instance {id}")))?
        .parse()
        .map_err(StoreError::Invalid)
}

/// Records a fan-out step's items (PENDING) and its plan, once: the list
/// is fixed at the step's first start, and every later attempt runs over
/// the same items.
pub fn plan(c: &dyn Db, id: &str, seq: u32, items: &[ItemPlan], plan: FanoutPlan, actor: &str) -> Result<()> {
    held(c, id, seq, actor)?;
    let there: Option<i64> =
        c.value("SELECT 1 FROM step_items WHERE instance_id = ?1 AND seq = ?2 LIMIT 1", p![id, seq])?;
    if there.is_some() {
        return Err(StoreError::Invalid(format!("step {seq} of instance {id} has its items already")));
    }
    for (n, chunk) in items.chunks(500).enumerate() {
        let mut sql =
            String::from("INSERT INTO step_items (instance_id, seq, idx, label, value, batch, state) VALUES ");
        let mut params: Vec<V> = vec![V::from(id), V::from(seq)];
        for (k, it) in chunk.iter().enumerate() {
            let at = params.len();
            let sep = if k > 0 { ", " } else { "" };
            sql.push_str(&format!("{sep}(?1, ?2, ?{}, ?{}, ?{}, ?{}, 'PENDING')", at + 1, at + 2, at + 3, at + 4));
            params.extend([
                V::from((n * 500 + k) as u32),
                V::from(it.label.as_str()),
                V::from(it.value.to_string()),
                V::from(it.batch),
            ]);
        }
        c.execute(&sql, &params)?;
    }
    let json = serde_json::to_string(&plan).expect("a plan");
    c.execute("UPDATE step_runs SET fanout = ?3 WHERE instance_id = ?1 AND seq = ?2", p![id, seq, json])?;
    let what =
        format!("fan-out over {} item(s) in {} batch(es), failure budget {}", plan.items, plan.batches, plan.budget);
    history(c, id, Some(seq), Some("RUNNING"), "RUNNING", &what, actor)
}

/// Notes why the items still PENDING never started (they stay PENDING: a
/// retry runs them).
pub fn not_started(c: &dyn Db, id: &str, seq: u32, reason: &str, actor: &str) -> Result<u32> {
    held(c, id, seq, actor)?;
    let n = c.execute(
        "UPDATE step_items SET error = ?3, history = history || ?4 WHERE instance_id = ?1 AND seq = ?2 AND state = 'PENDING'",
        p![id, seq, reason, line(StepState::Pending, StepState::Pending, reason)],
    )?;
    Ok(n as u32)
}

/// An item undone by its plugin's rollback (the instance's rollback is
/// under way), or with `error` the rollback's failure noted on it.
pub fn rolled_back(c: &dyn Db, id: &str, seq: u32, idx: u32, error: Option<&str>, actor: &str) -> Result<()> {
    let pending: Option<i64> = c.value("SELECT rollback_pending FROM task_instances WHERE id = ?1", p![id])?;
    match pending {
        None => return Err(StoreError::NotFound(format!("no instance {id}"))),
        Some(1) => {}
        Some(_) => {
            return Err(StoreError::Invalid(format!(
                "instance {id} is not rolling back; {actor} may not undo its items"
            )))
        }
    }
    let from = item_state(c, id, seq, idx)?;
    match error {
        None => {
            check_step(from, StepState::RolledBack)?;
            c.execute(
                "UPDATE step_items SET state = 'ROLLED_BACK', history = history || ?4 \
                 WHERE instance_id = ?1 AND seq = ?2 AND idx = ?3",
                p![id, seq, idx, line(from, StepState::RolledBack, "rolled back")],
            )?;
        }
        Some(e) => {
            c.execute(
                "UPDATE step_items SET error = ?4, history = history || ?5 WHERE instance_id = ?1 AND seq = ?2 AND idx = ?3",
                p![id, seq, idx, e, line(from, from, e)],
            )?;
        }
    }
    Ok(())
}

pub(super) fn items(c: &dyn Db, id: &str, seq: u32, from: u32, limit: u32) -> Result<Vec<ItemRun>> {
    let sql = format!(
        "SELECT {ITEM_COLS} FROM step_items WHERE instance_id = ?1 AND seq = ?2 AND idx >= ?3 ORDER BY idx LIMIT ?4"
    );
    c.query(&sql, p![id, seq, from, i64::from(limit)])?.iter().map(item).collect()
}

/// Puts each fan-out step's item counts on it (`tasks.get`).
pub(super) fn add_counts(c: &dyn Db, inst: &mut Instance) -> Result<()> {
    // Only a started fan-out step has items; its recorded params say what
    // it fans out over (see `steps::ready`): no query for any other.
    let fans = |s: &apollo_shared::protocol::StepRun| {
        s.params.as_ref().is_some_and(|p| p.get("foreach").is_some() && p.get("as").is_some())
    };
    if !inst.steps.iter().flatten().any(fans) {
        return Ok(());
    }
    let id = inst.id.clone();
    let plans =
        c.query("SELECT seq, fanout FROM step_runs WHERE instance_id = ?1 AND fanout IS NOT NULL", p![id.as_str()])?;
    if plans.is_empty() {
        return Ok(());
    }
    let rows = c.query(
        "SELECT seq, state, CASE WHEN error IS NULL THEN 0 ELSE 1 END, COUNT(*) FROM step_items WHERE instance_id = ?1 \
         GROUP BY seq, state, CASE WHEN error IS NULL THEN 0 ELSE 1 END",
        p![id.as_str()],
    )?;
    for r in &plans {
        let seq: u32 = r.get(0)?;
        let Ok(plan) = serde_json::from_str::<FanoutPlan>(&r.get::<String>(1)?) else { continue };
        let mut n = ItemCounts {
            total: plan.items,
            batch: plan.batch,
            batches: plan.batches,
            budget: plan.budget,
            ..Default::default()
        };
        for row in rows.iter().filter(|row| row.get::<u32>(0).is_ok_and(|s| s == seq)) {
            let (state, noted, count): (String, i64, i64) = (row.get(1)?, row.get(2)?, row.get(3)?);
            let count = count as u32;
            match state.as_str() {
                "SUCCESS" => n.ok += count,
                "FAILED" => n.failed += count,
                "RUNNING" => n.running += count,
                "PENDING" if noted == 1 => n.not_started += count,
                "PENDING" => n.waiting += count,
                "ROLLED_BACK" => n.rolled_back += count,
                "SKIPPED" => n.skipped += count,
                _ => {}
            }
        }
        if let Some(step) = inst.steps.iter_mut().flatten().find(|s| s.seq == seq) {
            step.items = Some(n);
        }
    }
    Ok(())
}

mod claims;
mod ops;
pub use claims::{ClaimedItem, Offer, OfferNow, Open};
