//! Operators' pauses (`apollo pause`): begun, ended by hand or by their
//! `until`, each audited as a history row whose instance is the pause's id
//! (so `apollo audit` lists them with the instances' moves). A claim reads
//! the pauses in force inside its own transaction, so on PostgreSQL a pause
//! holds across every agent from the commit that records it.

use super::db::Db;
use super::history::history;
use super::value::{p, Row};
use super::{Result, StoreError};
use apollo_shared::protocol::{Pause, PauseScope};
use chrono::{DateTime, Utc};

const COLS: &str = "id, scope, target, reason, paused_by, since, until_at";

/// In force: not ended, and its `until` (if any) still ahead.
const IN_FORCE: &str = "ended_at IS NULL AND (until_at IS NULL OR until_at > apollo_now())";

fn pause(r: &Row) -> Result<Pause> {
    let scope: String = r.get(1)?;
    Ok(Pause {
        id: r.get(0)?,
        scope: scope.parse().map_err(StoreError::Invalid)?,
        target: r.get(2)?,
        reason: r.get(3)?,
        by: r.get(4)?,
        since: r.get(5)?,
        until: r.get(6)?,
        freeze: None,
    })
}

/// The pauses in force, oldest first.
pub fn in_force(c: &dyn Db) -> Result<Vec<Pause>> {
    c.query(&format!("SELECT {COLS} FROM pauses WHERE {IN_FORCE} ORDER BY since, id"), &[])?.iter().map(pause).collect()
}

/// Drops from `items` what a pause in force or an open freeze window
/// (`frozen`) covers, by the (queue, task) `at` says; whether any was
/// dropped, and the earliest end of the pauses that dropped them.
pub fn hold_back<T>(
    c: &dyn Db,
    frozen: &[Pause],
    items: &mut Vec<T>,
    at: impl Fn(&T) -> (&str, &str),
) -> Result<(bool, Option<DateTime<Utc>>)> {
    let mut paused = in_force(c)?;
    paused.extend(frozen.iter().cloned());
    let mut ends: Option<DateTime<Utc>> = None;
    if paused.is_empty() {
        return Ok((false, None));
    }
    let before = items.len();
    items.retain(|item| {
        let (queue, task) = at(item);
        let mut covered = false;
        for p in paused.iter().filter(|p| p.covers(queue, task)) {
            covered = true;
            if let Some(u) = p.until.as_deref().and_then(|u| u.parse::<DateTime<Utc>>().ok()) {
                ends = Some(ends.map_or(u, |e| e.min(u)));
            }
        }
        !covered
    });
    Ok((items.len() < before, ends))
}

/// Begins `p` (its start the store's clock); returns it as stored.
pub fn begin(c: &dyn Db, p: &Pause) -> Result<Pause> {
    c.execute(
        &format!("INSERT INTO pauses ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5, apollo_now(), ?6)"),
        p![p.id.as_str(), p.scope.as_str(), p.target.as_deref(), p.reason.as_str(), p.by.as_str(), p.until.as_deref()],
    )?;
    let until = p.until.as_deref().map(|u| format!(" until {u}")).unwrap_or_default();
    history(c, &p.id, None, None, "paused", &format!("{} paused{until}: {}", p.what(), p.reason), &p.by)?;
    let row = c.query_opt(&format!("SELECT {COLS} FROM pauses WHERE id = ?1"), p![p.id.as_str()])?;
    row.as_ref().map(pause).transpose()?.ok_or_else(|| StoreError::NotFound(format!("pause {}", p.id)))
}

/// Ends the pauses in force of exactly this scope; returns them.
pub fn end(c: &dyn Db, scope: PauseScope, target: Option<&str>, reason: &str, actor: &str) -> Result<Vec<Pause>> {
    let rows = c.query(
        &format!("SELECT {COLS} FROM pauses WHERE {IN_FORCE} AND scope = ?1 AND target IS NOT DISTINCT FROM ?2"),
        p![scope.as_str(), target],
    )?;
    let mut ended = Vec::new();
    for r in &rows {
        let p = pause(r)?;
        let moved = c.execute(
            "UPDATE pauses SET ended_at = apollo_now(), ended_by = ?2, end_reason = ?3 WHERE id = ?1 AND ended_at IS NULL",
            p![p.id.as_str(), actor, reason],
        )?;
        if moved > 0 {
            history(c, &p.id, None, Some("paused"), "resumed", &format!("{} resumed: {reason}", p.what()), actor)?;
            ended.push(p);
        }
    }
    Ok(ended)
}

/// Ends (for the record) the pauses whose `until` has passed; returns them.
/// A claim already ignores them: this is the audit's row and the end's time.
pub fn lapse(c: &dyn Db) -> Result<Vec<Pause>> {
    let rows = c.query(
        &format!(
            "SELECT {COLS} FROM pauses WHERE ended_at IS NULL AND until_at IS NOT NULL AND until_at <= apollo_now()"
        ),
        &[],
    )?;
    let mut ended = Vec::new();
    for r in &rows {
        let p = pause(r)?;
        let moved = c.execute(
            "UPDATE pauses SET ended_at = until_at, ended_by = 'schedule', end_reason = 'until reached' \
             WHERE id = ?1 AND ended_at IS NULL",
            p![p.id.as_str()],
        )?;
        if moved > 0 {
            let what = format!("{} resumed: until {} reached", p.what(), p.until.as_deref().unwrap_or(""));
            history(c, &p.id, None, Some("paused"), "resumed", &what, "schedule")?;
            ended.push(p);
        }
    }
    Ok(ended)
}
