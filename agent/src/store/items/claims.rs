//! Items claimed one at a time, by any agent that can run them. The agent
//! that holds the instance runs the step: it opens a round (each life of
//! the step is one), offers one batch after another in `item_offers`, and
//! claims items like everybody else. A claim reads the offer locked (on
//! PostgreSQL the row lock makes claims of one step take turns), refuses
//! when the step's `max_parallel` items run or its failure budget is
//! spent, and moves the next item not tried in this round to RUNNING under
//! the claimer's name; the offer counts what runs and what failed, so no
//! claim counts rows. An item's end is written only by its holder. Items
//! whose holder stopped answering (its heartbeat older than its lease) are
//! interrupted and offered again.

use super::ItemEnd;
use super::{held, line};
use crate::store::db::Db;
use crate::store::history::history;
use crate::store::rows::ts;
use crate::store::value::p;
use crate::store::{FanoutPlan, Result, StoreError};
use apollo_shared::state::{check_step, StepState};
use chrono::Utc;
use serde_json::Value;

/// A batch offered: its items' range (by index) and how many of the step's
/// items may run at once, whoever runs them.
#[derive(Debug, Clone, Copy)]
pub struct Offer {
    pub batch: u32,
    pub first: u32,
    pub last: u32,
    pub parallel: u32,
}

/// An item this agent claimed, to run now; `call` is what the claimer's
/// renderer made of it (its params are recorded with the claim).
pub struct ClaimedItem<R> {
    pub index: u32,
    /// The step's life it was claimed in: its end is written for this
    /// claim only.
    pub round: u32,
    pub label: String,
    pub value: Value,
    pub attempts: u32,
    pub call: R,
}

/// An offer with room, of an instance another agent holds.
#[derive(Debug, Clone)]
pub struct Open {
    pub id: String,
    pub seq: u32,
    pub def_hash: String,
    pub queue: String,
    /// How many more of its items may run at once.
    pub room: u32,
}

/// How the step's offer stands, for the agent that runs the step.
#[derive(Debug, Clone, Copy, Default)]
pub struct OfferNow {
    /// Items RUNNING, wherever.
    pub running: u32,
    /// Items that failed in this round.
    pub failed: u32,
}

/// The agents whose heartbeat is within their lease (`but` left out), as
/// they sign what they hold (`agent:<name>:<pid>`; `agents.id` is without
/// the prefix).
fn live_agents(c: &dyn Db, but: &str) -> Result<Vec<String>> {
    c.column(
        "SELECT 'agent:' || id FROM agents WHERE 'agent:' || id <> ?1 AND stopped_at IS NULL \
         AND heartbeat_at > apollo_now_plus(-lease_secs)",
        p![but],
    )
}

/// Interrupts RUNNING items (index, holder): FAILED, and not tried in this
/// round, so they are offered again; the offer's count and cursor follow.
fn interrupt(c: &dyn Db, id: &str, seq: u32, items: &[(u32, Option<String>)], round: u32) -> Result<u32> {
    let now = ts(Utc::now());
    let mut n = 0;
    for (idx, holder) in items {
        let idx = *idx;
        let why = match holder {
            Some(h) => format!("interrupted: {h} stopped while this item ran; it runs again"),
            None => "interrupted: the step was cut off while this item ran; it runs again".to_string(),
        };
        n += c.execute(
            "UPDATE step_items SET state = 'FAILED', round = ?4, error = ?5, finished_at = ?6, history = history || ?7 \
             WHERE instance_id = ?1 AND seq = ?2 AND idx = ?3 AND state = 'RUNNING'",
            p![id, seq, idx, round.saturating_sub(1), why.as_str(), now.as_str(), line(StepState::Running, StepState::Failed, &why)],
        )? as u32;
    }
    if let Some(low) = items.iter().map(|(i, _)| *i).min() {
        c.execute(
            "UPDATE item_offers SET running = CASE WHEN running > ?3 THEN running - ?3 ELSE 0 END, \
             next = CASE WHEN next > ?4 THEN ?4 ELSE next END WHERE instance_id = ?1 AND seq = ?2",
            p![id, seq, n, low],
        )?;
    }
    Ok(n)
}

/// Locks the step's offer (PostgreSQL; SQLite's writer is alone anyway)
/// and returns its round, `None` when none is open. Whatever writes the
/// offer's counts takes this lock first — a claim, an item's end, an
/// interruption, a new life of the step — so they take turns, and one
/// never counts from what another is changing.
fn lock_offer(c: &dyn Db, id: &str, seq: u32) -> Result<Option<u32>> {
    let sql = format!(
        "SELECT round FROM item_offers WHERE instance_id = ?1 AND seq = ?2{}",
        c.driver().locking("item_offers")
    );
    c.value(&sql, p![id, seq])
}

/// The RUNNING items of a step, with their holders, locked: an end
/// already under way is waited for (and its item is then not RUNNING),
/// one not yet begun waits for this write.
fn running(c: &dyn Db, id: &str, seq: u32) -> Result<Vec<(u32, Option<String>)>> {
    let sql = format!(
        "SELECT idx, holder FROM step_items WHERE instance_id = ?1 AND seq = ?2 AND state = 'RUNNING'{}",
        c.driver().locking("step_items")
    );
    c.query(&sql, p![id, seq])?.iter().map(|r| Ok((r.get(0)?, r.get(1)?))).collect()
}

/// Opens a life of the step for the agent that holds its instance, the
/// one after the last any item was tried in; returns its number and how
/// many items it interrupted. Items
/// left RUNNING by an earlier life — its own (but those `keep` says still
/// run here, as its helpers' do) or those of an agent no longer
/// answering — are interrupted; those a live agent runs go on and count
/// against the step's parallel. Nothing is offered yet. `keep` is asked
/// once the offer is locked: a claim of this agent's that committed before
/// has put its item in hand, one that has not waits for this write.
///
/// An earlier life's offer is changed in place, not deleted and made anew:
/// a helper's end waiting on its lock then counts itself out of the new
/// life's offer (on PostgreSQL an update that waited on a deleted row
/// changes nothing, and the item would count as running for ever).
pub fn open_round(
    c: &dyn Db,
    id: &str,
    seq: u32,
    mut plan: FanoutPlan,
    keep: &dyn Fn(u32) -> bool,
    actor: &str,
) -> Result<(u32, u32)> {
    held(c, id, seq, actor)?;
    // Tests hold a new life back here (`sleep(ms)`) while items are
    // claimed, and once it has locked the offer while items end.
    fail::fail_point!("items.open_round.before_lock");
    let open = lock_offer(c, id, seq)?.is_some();
    let running = running(c, id, seq)?;
    fail::fail_point!("items.open_round.locked");
    let last: Option<u32> =
        c.value("SELECT MAX(round) FROM step_items WHERE instance_id = ?1 AND seq = ?2", p![id, seq])?;
    plan.round = last.unwrap_or(0) + 1;
    let live = live_agents(c, actor)?;
    let (gone, going): (Vec<_>, Vec<_>) = running.into_iter().partition(|(idx, holder)| match holder {
        Some(h) if h == actor => !keep(*idx),
        Some(h) => !live.contains(h),
        None => true,
    });
    // The order items ended in goes on from the last that ended.
    let done: u32 = c
        .value("SELECT COALESCE(MAX(done) + 1, 0) FROM step_items WHERE instance_id = ?1 AND seq = ?2", p![id, seq])?
        .unwrap_or(0);
    let gone: Vec<(u32, Option<String>)> = gone.into_iter().map(|(i, h)| (i, h.filter(|h| h != actor))).collect();
    let n = interrupt(c, id, seq, &gone, plan.round)?;
    let sql = match open {
        true => {
            "UPDATE item_offers SET batch = 0, round = ?3, first = 1, last = 0, next = 1, parallel = 0, budget = ?4, \
             running = ?5, failed = 0, done = ?6 WHERE instance_id = ?1 AND seq = ?2"
        }
        false => {
            "INSERT INTO item_offers (instance_id, seq, batch, round, first, last, next, parallel, budget, running, \
             failed, done) VALUES (?1, ?2, 0, ?3, 1, 0, 1, 0, ?4, ?5, 0, ?6)"
        }
    };
    c.execute(sql, p![id, seq, plan.round, plan.budget, going.len() as u32, done])?;
    if n > 0 {
        let what = format!("{n} item(s) an earlier life of the step left RUNNING were interrupted; they run again");
        history(c, id, Some(seq), Some("RUNNING"), "RUNNING", &what, actor)?;
    }
    let json = serde_json::to_string(&plan).expect("a plan");
    c.execute("UPDATE step_runs SET fanout = ?3 WHERE instance_id = ?1 AND seq = ?2", p![id, seq, json])?;
    Ok((plan.round, n))
}

/// Offers a batch (and notes it on the step and in its history).
pub fn offer(c: &dyn Db, id: &str, seq: u32, plan: FanoutPlan, o: Offer, items: usize, actor: &str) -> Result<()> {
    held(c, id, seq, actor)?;
    c.execute(
        "UPDATE item_offers SET batch = ?3, first = ?4, last = ?5, next = ?4, parallel = ?6 \
         WHERE instance_id = ?1 AND seq = ?2",
        p![id, seq, o.batch, o.first, o.last, o.parallel],
    )?;
    let json = serde_json::to_string(&plan).expect("a plan");
    c.execute("UPDATE step_runs SET fanout = ?3 WHERE instance_id = ?1 AND seq = ?2", p![id, seq, json])?;
    let what = format!("batch {}/{} begins: {items} item(s)", plan.batch, plan.batches);
    history(c, id, Some(seq), Some("RUNNING"), "RUNNING", &what, actor)
}

/// Claims the next item of the offered batch not tried in this round, for
/// `actor`: `None` when there is none, when the step's parallel is full or
/// its budget spent, or when the instance or the step no longer runs.
/// `render` makes the item's call and the params recorded with it.
pub fn claim<R>(
    c: &dyn Db,
    id: &str,
    seq: u32,
    actor: &str,
    render: impl Fn(u32, &Value) -> (Option<String>, R),
) -> Result<Option<ClaimedItem<R>>> {
    let sql = format!(
        "SELECT o.round, o.next, o.last, o.parallel, o.budget, o.running, o.failed, i.state, s.state \
         FROM item_offers o JOIN task_instances i ON i.id = o.instance_id \
         JOIN step_runs s ON s.instance_id = o.instance_id AND s.seq = o.seq \
         WHERE o.instance_id = ?1 AND o.seq = ?2{}",
        c.driver().locking("o")
    );
    let Some(o) = c.query_opt(&sql, p![id, seq])? else { return Ok(None) };
    let (round, next, last, parallel, budget, runs, failed): (u32, i64, i64, u32, u32, u32, u32) =
        (o.get(0)?, o.get(1)?, o.get(2)?, o.get(3)?, o.get(4)?, o.get(5)?, o.get(6)?);
    let (inst, step): (String, String) = (o.get(7)?, o.get(8)?);
    if inst != "RUNNING" || step != "RUNNING" || runs >= parallel || failed > budget || next > last {
        return Ok(None);
    }
    let Some(r) = c.query_opt(
        "SELECT idx, label, value, attempts, state FROM step_items WHERE instance_id = ?1 AND seq = ?2 \
         AND idx >= ?3 AND idx <= ?4 AND state IN ('PENDING', 'FAILED') AND round < ?5 ORDER BY idx LIMIT 1",
        p![id, seq, next, last, round],
    )?
    else {
        c.execute("UPDATE item_offers SET next = ?3 WHERE instance_id = ?1 AND seq = ?2", p![id, seq, last + 1])?;
        return Ok(None);
    };
    let (index, label, value, attempts): (u32, String, String, u32) = (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?);
    let from: StepState = r.get::<String>(4)?.parse().map_err(StoreError::Invalid)?;
    check_step(from, StepState::Running)?;
    let value: Value = serde_json::from_str(&value).unwrap_or(Value::Null);
    let (params, call) = render(index, &value);
    let why = format!("started by {actor}");
    c.execute(
        "UPDATE step_items SET state = 'RUNNING', holder = ?4, round = ?5, attempts = attempts + 1, params = ?6, \
         output = NULL, error = NULL, started_at = ?7, finished_at = NULL, history = history || ?8 \
         WHERE instance_id = ?1 AND seq = ?2 AND idx = ?3",
        p![id, seq, index, actor, round, params, ts(Utc::now()), line(from, StepState::Running, &why)],
    )?;
    c.execute(
        "UPDATE item_offers SET running = running + 1, next = ?3 WHERE instance_id = ?1 AND seq = ?2",
        p![id, seq, index + 1],
    )?;
    Ok(Some(ClaimedItem { index, round, label, value, attempts: attempts + 1, call }))
}

/// Ends an item's attempt, written by the claim that started it only (its
/// holder, in its round: an item interrupted meanwhile is another claim's
/// now); its place in the order items ended in comes from the offer (or,
/// the step's life over, the items).
pub fn end(c: &dyn Db, id: &str, seq: u32, (idx, round): (u32, u32), how: &ItemEnd, actor: &str) -> Result<()> {
    let (to, output, error, why) = match how {
        ItemEnd::Success { output } => (StepState::Success, Some(*output), None, "succeeded".to_string()),
        ItemEnd::Failed { error } => (StepState::Failed, None, Some(*error), apollo_shared::text::one_line(error, 200)),
    };
    let failed = u32::from(to == StepState::Failed);
    let count_out = || {
        c.execute(
            "UPDATE item_offers SET running = CASE WHEN running > 0 THEN running - 1 ELSE 0 END, failed = failed + ?3, \
             done = done + 1 WHERE instance_id = ?1 AND seq = ?2",
            p![id, seq, failed],
        )
    };
    let counted = count_out()?;
    // Its place: the offer's count before this end (or, no offer open,
    // after every item that ended).
    let n = c.execute(
        "UPDATE step_items SET state = ?4, output = ?5, error = ?6, finished_at = ?7, history = history || ?8, \
         done = COALESCE((SELECT done - 1 FROM item_offers WHERE instance_id = ?1 AND seq = ?2), \
                         (SELECT COALESCE(MAX(done) + 1, 0) FROM step_items WHERE instance_id = ?1 AND seq = ?2)) \
         WHERE instance_id = ?1 AND seq = ?2 AND idx = ?3 AND state = 'RUNNING' AND holder = ?9 AND round = ?10",
        p![id, seq, idx, to.as_str(), output, error, ts(Utc::now()), line(StepState::Running, to, &why), actor, round],
    )?;
    if n == 0 {
        return Err(StoreError::Invalid(format!(
            "item {idx} of step {seq} of instance {id} is no longer RUNNING under {actor} (it was interrupted and \
             offered again)"
        )));
    }
    // No offer was open when this end began, and a new life of the step
    // that opened one meanwhile (its write held the item) counts the item
    // as running: it is counted out now.
    if counted == 0 {
        count_out()?;
    }
    Ok(())
}

/// Interrupts the items of the step whose holders stopped answering
/// (shared stores; the agent that runs the step asks while it waits).
pub fn interrupt_dead(c: &dyn Db, id: &str, seq: u32, actor: &str) -> Result<u32> {
    let Some(round) = lock_offer(c, id, seq)? else { return Ok(0) };
    let mut live = live_agents(c, actor)?;
    live.push(actor.to_string());
    let dead: Vec<(u32, Option<String>)> =
        running(c, id, seq)?.into_iter().filter(|(_, h)| h.as_ref().is_none_or(|h| !live.contains(h))).collect();
    if dead.is_empty() {
        return Ok(0);
    }
    interrupt(c, id, seq, &dead, round)
}

/// The items that failed in life `round` of the step: (index, label).
pub fn failed_in(c: &dyn Db, id: &str, seq: u32, round: u32) -> Result<Vec<(u32, String)>> {
    c.query(
        "SELECT idx, label FROM step_items WHERE instance_id = ?1 AND seq = ?2 AND state = 'FAILED' AND round = ?3 \
         ORDER BY idx",
        p![id, seq, round],
    )?
    .iter()
    .map(|r| Ok((r.get(0)?, r.get(1)?)))
    .collect()
}

/// The items of an instance RUNNING under a live agent (this one
/// included): (seq, index, label).
pub fn running_live(c: &dyn Db, id: &str, actor: &str) -> Result<Vec<(u32, u32, String)>> {
    let mut live = live_agents(c, actor)?;
    live.push(actor.to_string());
    let rows =
        c.query("SELECT seq, idx, label, holder FROM step_items WHERE instance_id = ?1 AND state = 'RUNNING'", p![id])?;
    let mut out = Vec::new();
    for r in &rows {
        if r.get::<Option<String>>(3)?.is_some_and(|h| live.contains(&h)) {
            out.push((r.get(0)?, r.get(1)?, r.get(2)?));
        }
    }
    Ok(out)
}

/// The step's offer as it stands (`None`: none is open).
pub fn now(c: &dyn Db, id: &str, seq: u32) -> Result<Option<OfferNow>> {
    let row =
        c.query_opt("SELECT running, failed FROM item_offers WHERE instance_id = ?1 AND seq = ?2", p![id, seq])?;
    row.map(|r| Ok(OfferNow { running: r.get(0)?, failed: r.get(1)? })).transpose()
}

/// Withdraws the step's offer: no item of it is claimed any more.
pub fn close(c: &dyn Db, id: &str, seq: u32) -> Result<()> {
    c.execute("DELETE FROM item_offers WHERE instance_id = ?1 AND seq = ?2", p![id, seq])?;
    Ok(())
}

/// Offers with room and an item left to claim, of RUNNING instances that
/// `actor` does not hold.
pub fn open(c: &dyn Db, actor: &str) -> Result<Vec<Open>> {
    c.query(
        "SELECT o.instance_id, o.seq, i.def_hash, i.queue, o.parallel - o.running FROM item_offers o JOIN task_instances i ON i.id = o.instance_id \
         WHERE i.state = 'RUNNING' AND o.running < o.parallel AND o.failed <= o.budget AND o.next <= o.last \
         AND (i.lease_owner IS NULL OR i.lease_owner <> ?1) ORDER BY o.instance_id, o.seq LIMIT 64",
        p![actor],
    )?
    .iter()
    .map(|r| Ok(Open { id: r.get(0)?, seq: r.get(1)?, def_hash: r.get(2)?, queue: r.get(3)?, room: r.get(4)? }))
    .collect()
}
