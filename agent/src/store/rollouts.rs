//! Rollouts of plugin versions: started, promoted, aborted, each move
//! audited as a history row whose instance is the rollout's id (so `apollo
//! audit` lists them with the instances' moves). At most one rollout of a
//! plugin runs at a time, on every backend (a unique index).

use super::db::Db;
use super::history::history;
use super::value::{p, Row};
use super::{Result, StoreError};
use apollo_shared::protocol::{Rollout, RolloutState};
use std::collections::BTreeMap;

const COLS: &str = "id, plugin, version, base, share_pct, agents, state, started_at, started_by, reason, \
    ended_at, ended_by, end_reason, abort_margin_pct, min_runs";

fn rollout(r: &Row) -> Result<Rollout> {
    let agents: String = r.get(5)?;
    let state: String = r.get(6)?;
    Ok(Rollout {
        id: r.get(0)?,
        plugin: r.get(1)?,
        version: r.get(2)?,
        base: r.get(3)?,
        share_pct: r.get(4)?,
        agents: serde_json::from_str(&agents).unwrap_or_default(),
        state: state.parse().map_err(StoreError::Invalid)?,
        started_at: r.get(7)?,
        started_by: r.get(8)?,
        reason: r.get(9)?,
        ended_at: r.get(10)?,
        ended_by: r.get(11)?,
        end_reason: r.get(12)?,
        abort_margin_pct: r.get(13)?,
        min_runs: r.get(14)?,
        new: None,
        old: None,
    })
}

/// Every rollout, newest first.
pub fn all(c: &dyn Db) -> Result<Vec<Rollout>> {
    c.query(&format!("SELECT {COLS} FROM rollouts ORDER BY started_at DESC, id DESC"), &[])?
        .iter()
        .map(rollout)
        .collect()
}

/// Each plugin's latest rollout (the one whose rules are in force).
pub fn latest(c: &dyn Db) -> Result<BTreeMap<String, Rollout>> {
    let mut out = BTreeMap::new();
    for r in all(c)? {
        out.entry(r.plugin.clone()).or_insert(r);
    }
    Ok(out)
}

/// Starts `r` (its state running, its start the store's clock, as the
/// steps' times it is compared with), refused while another rollout of the
/// plugin runs; returns it as stored.
pub fn start(c: &dyn Db, r: &Rollout) -> Result<Rollout> {
    let running: Option<String> =
        c.value("SELECT id FROM rollouts WHERE plugin = ?1 AND state = 'running'", p![r.plugin.as_str()])?;
    if let Some(other) = running {
        return Err(StoreError::Invalid(format!(
            "a rollout of {} is running already ({other}); promote or abort it first",
            r.plugin
        )));
    }
    c.execute(
        &format!("INSERT INTO rollouts ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running', apollo_now(), ?7, ?8, NULL, NULL, NULL, ?9, ?10)"),
        p![
            r.id.as_str(),
            r.plugin.as_str(),
            r.version.as_str(),
            r.base.as_str(),
            r.share_pct,
            serde_json::to_string(&r.agents).unwrap_or_default(),
            r.started_by.as_str(),
            r.reason.as_str(),
            r.abort_margin_pct,
            r.min_runs
        ],
    )?;
    let what = format!(
        "rollout of {} {} over {} started: {}% of new instances; {}",
        r.plugin, r.version, r.base, r.share_pct, r.reason
    );
    history(c, &r.id, None, None, RolloutState::Running.as_str(), &what, &r.started_by)?;
    let row = c.query_opt(&format!("SELECT {COLS} FROM rollouts WHERE id = ?1"), p![r.id.as_str()])?;
    row.as_ref().map(rollout).transpose()?.ok_or_else(|| StoreError::NotFound(format!("rollout {}", r.id)))
}

/// Ends the plugin's running rollout as `to` (promoted or aborted); `None`
/// when none runs (another agent may have ended it a moment before).
pub fn end(c: &dyn Db, plugin: &str, to: RolloutState, reason: &str, actor: &str) -> Result<Option<Rollout>> {
    let row =
        c.query_opt(&format!("SELECT {COLS} FROM rollouts WHERE plugin = ?1 AND state = 'running'"), p![plugin])?;
    let Some(row) = row else { return Ok(None) };
    let r = rollout(&row)?;
    let moved = c.execute(
        "UPDATE rollouts SET state = ?2, ended_at = apollo_now(), ended_by = ?3, end_reason = ?4 \
         WHERE id = ?1 AND state = 'running'",
        p![r.id.as_str(), to.as_str(), actor, reason],
    )?;
    if moved == 0 {
        return Ok(None);
    }
    let what = format!("rollout of {} {} {to}: {reason}", r.plugin, r.version);
    history(c, &r.id, None, Some(RolloutState::Running.as_str()), to.as_str(), &what, actor)?;
    let row = c.query_opt(&format!("SELECT {COLS} FROM rollouts WHERE id = ?1"), p![r.id.as_str()])?;
    row.as_ref().map(rollout).transpose()
}
