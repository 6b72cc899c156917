//! What an incident's timeline reads, in one read: the instances asked for
//! (hot, else archived) with the children their sub-runbook steps made, the
//! operators' pauses that held them, the rollouts whose arms they ran and
//! the alerts raised about them.

use super::db::Db;
use super::rows::{self, parse_ts};
use super::value::p;
use super::whole::whole;
use super::{Result, Store};
use apollo_shared::protocol::{Alert, Beside, BesideKind, Instance, Pause, PauseScope};
use std::collections::HashSet;

/// The instances of a timeline and what it shows beside them.
#[derive(Debug, Default)]
pub struct TimelineRead {
    /// The instances asked for, in the order asked, then their children
    /// (and theirs), at most the number asked for in all.
    pub instances: Vec<Instance>,
    /// The ids asked for that are no instance, hot or archived.
    pub missing: Vec<String>,
    pub beside: Vec<Beside>,
    /// The instances' alerts, oldest first.
    pub alerts: Vec<Alert>,
}

impl Store {
    /// The instances `ids` and their children (up to `max` in all), and
    /// what held or touched them; one read, so one moment of the store.
    pub async fn timeline(&self, ids: Vec<String>, max: usize) -> Result<TimelineRead> {
        self.read(move |c| read(c, &ids, max)).await
    }
}

fn read(c: &dyn Db, ids: &[String], max: usize) -> Result<TimelineRead> {
    let mut out = TimelineRead::default();
    let mut seen: HashSet<String> = HashSet::new();
    for id in ids {
        if !seen.insert(id.clone()) {
            continue;
        }
        match whole(c, id)? {
            Some(i) => out.instances.push(i),
            None => out.missing.push(id.clone()),
        }
    }
    // The children, breadth first: a child's dedup key names its parent.
    let mut next = 0;
    while next < out.instances.len() && out.instances.len() < max {
        let parent = out.instances[next].id.clone();
        next += 1;
        let (from, to) = (format!("child:{parent}:"), format!("child:{parent};"));
        let kids: Vec<String> = c.column(
            "SELECT id FROM task_instances WHERE dedup_key >= ?1 AND dedup_key < ?2 \
             UNION ALL SELECT id FROM archive WHERE dedup_key >= ?1 AND dedup_key < ?2",
            p![from.as_str(), to.as_str()],
        )?;
        for kid in kids {
            if out.instances.len() < max && seen.insert(kid.clone()) {
                out.instances.extend(whole(c, &kid)?);
            }
        }
    }
    out.beside = pauses(c, &out.instances)?;
    out.beside.extend(rollouts(c, &out.instances)?);
    for i in &out.instances {
        let found = c.query(
            "SELECT id, at, kind, message, instance_id FROM alerts WHERE instance_id = ?1 ORDER BY id",
            p![i.id.as_str()],
        )?;
        for r in &found {
            out.alerts.push(rows::alert(r)?);
        }
    }
    out.alerts.sort_by_key(|a| a.at);
    Ok(out)
}

/// The operators' pauses whose scope covered one of `instances` while it
/// lived (freeze windows live in the config, not here). Pauses are few: a
/// row each, read whole.
fn pauses(c: &dyn Db, instances: &[Instance]) -> Result<Vec<Beside>> {
    let mut out = Vec::new();
    for r in c.query("SELECT id, scope, target, since, ended_at FROM pauses ORDER BY since, id", &[])?.iter() {
        let scope: String = r.get(1)?;
        let Ok(scope) = scope.parse::<PauseScope>() else { continue };
        let since: String = r.get(3)?;
        let pause = Pause {
            id: r.get(0)?,
            scope,
            target: r.get(2)?,
            since,
            reason: String::new(),
            by: String::new(),
            until: None,
            freeze: None,
        };
        let (Some(since), ended) = (parse_ts(Some(pause.since.clone())), parse_ts(r.get(4)?)) else { continue };
        let held = |i: &Instance| {
            pause.covers(&i.queue, &i.task)
                && i.finished_at.is_none_or(|to| since <= to)
                && ended.is_none_or(|e| e >= i.created_at)
        };
        if instances.iter().any(held) {
            out.push(Beside { kind: BesideKind::Pause, rows: rows::transitions(c, &pause.id)?, id: pause.id });
        }
    }
    Ok(out)
}

/// The rollouts whose arms the instances were given (their starts,
/// promotions and aborts).
fn rollouts(c: &dyn Db, instances: &[Instance]) -> Result<Vec<Beside>> {
    let mut ids: Vec<&str> =
        instances.iter().flat_map(|i| i.pins.iter().flatten()).map(|(_, p)| p.rollout.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.into_iter()
        .map(|id| Ok(Beside { kind: BesideKind::Rollout, id: id.to_string(), rows: rows::transitions(c, id)? }))
        .collect()
}
