//! Writes that are not state transitions: alerts, received events, the archive.

use super::db::Db;
use super::rows::ts;
use super::value::p;
use super::Result;
use apollo_shared::protocol::AlertKind;
use chrono::{DateTime, Utc};
use serde_json::Value;

pub fn insert_alert(c: &dyn Db, kind: AlertKind, message: &str, instance: Option<&str>) -> Result<()> {
    c.execute(
        "INSERT INTO alerts (at, kind, message, instance_id) VALUES (?1, ?2, ?3, ?4)",
        p![ts(Utc::now()), kind.as_str(), message, instance],
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
    let ids = c.driver().oldest_ended(c, &ts(cutoff), max)?;
    for id in &ids {
        let Some(mut doc) = super::whole::whole(c, id)? else { continue };
        // Its context as kept: made whole again when it is read.
        doc.context = super::rows::compacted(&doc);
        c.execute(
            "INSERT INTO archive (id, task, state, finished_at, archived_at, doc, dedup_key, queue) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT DO NOTHING",
            p![
                id,
                doc.task.as_str(),
                doc.state.as_str(),
                doc.finished_at.map(ts),
                ts(Utc::now()),
                super::docs::keep(&doc, c.driver().compresses_documents()),
                doc.dedup_key.as_deref(),
                doc.queue.as_str()
            ],
        )?;
        c.execute("DELETE FROM transitions WHERE instance_id = ?1", p![id])?;
        c.execute("DELETE FROM step_runs WHERE instance_id = ?1", p![id])?;
        c.execute("DELETE FROM step_attempts WHERE instance_id = ?1", p![id])?;
        c.execute("DELETE FROM step_items WHERE instance_id = ?1", p![id])?;
        c.execute("DELETE FROM item_offers WHERE instance_id = ?1", p![id])?;
        c.execute("DELETE FROM task_instances WHERE id = ?1", p![id])?;
    }
    Ok(ids)
}

/// What an agent says of itself in its heartbeat.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    pub name: String,
    pub host: String,
    pub version: String,
    pub queues: Vec<String>,
    pub running: usize,
    pub lease_secs: f64,
    /// Its plugin registrations (what it can run).
    pub plugins: Vec<apollo_shared::protocol::PluginCap>,
}

/// Records an agent's heartbeat (by the store's clock). On a shared
/// database the first one of a life (`starting`) refuses to take the name of
/// another agent that is alive — its heartbeat younger than its lease —
/// elsewhere. (A SQLite file has one agent; a copy restored from a backup is
/// a store of its own.)
pub fn heartbeat(c: &dyn Db, id: &str, h: &Heartbeat, starting: bool) -> Result<()> {
    if starting {
        c.driver().refuse_namesake(c, id, &h.name, &h.host)?;
    }
    let queues = serde_json::to_string(&h.queues).unwrap_or_default();
    let started = if starting { Some(ts(Utc::now())) } else { None };
    let plugins = serde_json::to_string(&h.plugins).unwrap_or_default();
    c.execute(
        "INSERT INTO agents (name, id, host, version, queues, running, lease_secs, started_at, heartbeat_at, stopped_at, plugins) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, COALESCE(?8, ?9), apollo_now(), NULL, ?10) \
         ON CONFLICT (name) DO UPDATE SET id = ?2, host = ?3, version = ?4, queues = ?5, running = ?6, lease_secs = ?7, \
         started_at = COALESCE(?8, agents.started_at), heartbeat_at = apollo_now(), stopped_at = NULL, plugins = ?10",
        p![
            h.name.as_str(),
            id,
            h.host.as_str(),
            h.version.as_str(),
            queues,
            h.running,
            h.lease_secs,
            started,
            ts(Utc::now()),
            plugins
        ],
    )?;
    Ok(())
}

/// Notes that an agent stopped cleanly.
pub fn stopped(c: &dyn Db, id: &str) -> Result<()> {
    c.execute("UPDATE agents SET stopped_at = apollo_now(), running = 0 WHERE id = ?1", p![id])?;
    Ok(())
}

/// PostgreSQL: folds the per-state deltas into the counts (a no-op on
/// SQLite, whose triggers update the counts in place).
pub fn fold_counts(c: &dyn Db) -> Result<()> {
    c.driver().fold_counts(c)
}

/// Deletes up to `max` archived instances that ended before `cutoff`,
/// oldest first (`scheduler.archive_retention`); their ids.
pub fn expire_archive(c: &dyn Db, cutoff: DateTime<Utc>, max: usize) -> Result<Vec<String>> {
    let ids: Vec<String> = c.column(
        "SELECT id FROM archive WHERE finished_at < ?1 ORDER BY finished_at LIMIT ?2",
        p![ts(cutoff), max as i64],
    )?;
    for id in &ids {
        c.execute("DELETE FROM archive WHERE id = ?1", p![id.as_str()])?;
    }
    if !ids.is_empty() {
        c.driver().reclaim(c)?;
    }
    Ok(ids)
}
