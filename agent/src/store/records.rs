//! Writes that are not state transitions: alerts, received events, the archive.

use super::db::{p, Db};
use super::rows::ts;
use super::Result;
use chrono::{DateTime, Utc};
use serde_json::Value;

pub fn insert_alert(c: &dyn Db, kind: &str, message: &str, instance: Option<&str>) -> Result<()> {
    c.execute(
        "INSERT INTO alerts (at, kind, message, instance_id) VALUES (?1, ?2, ?3, ?4)",
        p![ts(Utc::now()), kind, message, instance],
    )?;
    Ok(())
}

/// Stores a received event; `None` when its dedup key was seen before.
pub fn insert_event(
    c: &dyn Db,
    id: &str,
    name: &str,
    data: Option<&Value>,
    dedup_key: Option<&str>,
    instances: &[String],
) -> Result<Option<()>> {
    if let Some(key) = dedup_key {
        let seen: Option<String> = c.value("SELECT id FROM events WHERE dedup_key = ?1", p![key])?;
        if seen.is_some() {
            return Ok(None);
        }
    }
    // Another agent may be storing the same key at this moment.
    let inserted = c.execute(
        "INSERT INTO events (id, name, data, dedup_key, received_at, instances) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
         ON CONFLICT DO NOTHING",
        p![
            id,
            name,
            data.map(|d| d.to_string()),
            dedup_key,
            ts(Utc::now()),
            serde_json::to_string(instances).unwrap_or_default()
        ],
    )?;
    Ok((inserted > 0).then_some(()))
}

/// Moves up to `max` finished instances (SUCCESS, ROLLED_BACK, and FAILED
/// ones that nothing works on) that ended before `cutoff` to the archive.
pub fn archive(c: &dyn Db, cutoff: DateTime<Utc>, max: usize) -> Result<Vec<String>> {
    // finished_at is set only on an ended instance (a retry or a rollback
    // clears it); the index holds only those, oldest first.
    const OLDEST: &str = "SELECT id FROM task_instances INDEXED BY task_instances_finished \
         WHERE finished_at IS NOT NULL AND finished_at < ?1 \
         AND state IN ('SUCCESS', 'ROLLED_BACK', 'FAILED') AND rollback_pending = 0 \
         ORDER BY finished_at LIMIT ?2";
    // On PostgreSQL, what another agent is archiving now is left to it.
    let sql = if c.postgres() { format!("{OLDEST} FOR UPDATE SKIP LOCKED") } else { OLDEST.to_string() };
    let ids: Vec<String> = c.column(&sql, p![ts(cutoff), max])?;
    for id in &ids {
        let mut doc = super::read::instance_with_steps(c, id)?;
        doc.transitions = Some(super::read::transitions(c, id)?);
        c.execute(
            "INSERT INTO archive (id, task, state, finished_at, archived_at, doc, dedup_key, queue) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT DO NOTHING",
            p![
                id,
                doc.task.as_str(),
                doc.state.as_str(),
                doc.finished_at.map(ts),
                ts(Utc::now()),
                serde_json::to_string(&doc).unwrap_or_default(),
                doc.dedup_key.as_deref(),
                doc.queue.as_str()
            ],
        )?;
        c.execute("DELETE FROM transitions WHERE instance_id = ?1", p![id])?;
        c.execute("DELETE FROM step_runs WHERE instance_id = ?1", p![id])?;
        c.execute("DELETE FROM task_instances WHERE id = ?1", p![id])?;
    }
    Ok(ids)
}
