//! Writes that are not state transitions: alerts, received events, the archive.

use super::rows::ts;
use super::Result;
use chrono::{DateTime, Utc};
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

pub fn insert_alert(c: &Connection, kind: &str, message: &str, instance: Option<&str>) -> Result<()> {
    c.prepare_cached("INSERT INTO alerts (at, kind, message, instance_id) VALUES (?1, ?2, ?3, ?4)")?
        .execute(params![ts(Utc::now()), kind, message, instance])?;
    Ok(())
}

/// Stores a received event; `None` when its dedup key was seen before.
pub fn insert_event(
    c: &Connection,
    id: &str,
    name: &str,
    data: Option<&Value>,
    dedup_key: Option<&str>,
    instances: &[String],
) -> Result<Option<()>> {
    if let Some(key) = dedup_key {
        let seen: Option<String> =
            c.query_row("SELECT id FROM events WHERE dedup_key = ?1", [key], |r| r.get(0)).optional()?;
        if seen.is_some() {
            return Ok(None);
        }
    }
    c.execute(
        "INSERT INTO events (id, name, data, dedup_key, received_at, instances) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            id,
            name,
            data.map(|d| d.to_string()),
            dedup_key,
            ts(Utc::now()),
            serde_json::to_string(instances).unwrap_or_default()
        ],
    )?;
    Ok(Some(()))
}

/// Moves up to `max` finished instances (SUCCESS, ROLLED_BACK, and FAILED
/// ones that nothing works on) that ended before `cutoff` to the archive.
pub fn archive(c: &Connection, cutoff: DateTime<Utc>, max: usize) -> Result<Vec<String>> {
    let ids: Vec<String> = c
        .prepare_cached(
            // finished_at is set only on an ended instance (a retry or a
            // rollback clears it); the index holds only those, oldest first.
            "SELECT id FROM task_instances INDEXED BY task_instances_finished \
             WHERE finished_at IS NOT NULL AND finished_at < ?1 \
             AND state IN ('SUCCESS', 'ROLLED_BACK', 'FAILED') AND rollback_pending = 0 \
             ORDER BY finished_at LIMIT ?2",
        )?
        .query_map(params![ts(cutoff), max as i64], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for id in &ids {
        let mut doc = super::read::instance_with_steps(c, id)?;
        doc.transitions = Some(super::read::transitions(c, id)?);
        c.prepare_cached(
            "INSERT INTO archive (id, task, state, finished_at, archived_at, doc, dedup_key, queue) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?
        .execute(params![
            id,
            doc.task,
            doc.state.as_str(),
            doc.finished_at.map(ts),
            ts(Utc::now()),
            serde_json::to_string(&doc).unwrap_or_default(),
            doc.dedup_key,
            doc.queue
        ])?;
        c.execute("DELETE FROM transitions WHERE instance_id = ?1", [id])?;
        c.execute("DELETE FROM step_runs WHERE instance_id = ?1", [id])?;
        c.execute("DELETE FROM task_instances WHERE id = ?1", [id])?;
    }
    Ok(ids)
}
