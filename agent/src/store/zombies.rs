//! What the zombie reaper reads and writes: every RUNNING instance with
//! when it last started running (its claim, a retry's claim, a takeover),
//! each step's recent durations, and the reaping itself: the instance
//! FAILED, fenced on the holder the reaper saw, with its alert, in one
//! transaction.

use super::db::Db;
use super::rows::parse_ts;
use super::value::p;
use super::write::{fail, step_fail};
use super::{records, Result, Store};
use apollo_shared::protocol::{AlertKind, EventData, Raised, Topic};
use apollo_shared::state::{StepState, TaskState};
use chrono::{DateTime, Utc};
use std::collections::HashMap;

/// A RUNNING instance as the reaper sees it.
#[derive(Debug, Clone)]
pub struct Running {
    pub id: String,
    pub task: String,
    pub def_hash: String,
    /// Who holds it (`<name>:<pid>`), if anyone.
    pub owner: Option<String>,
    /// When it last moved to RUNNING: claimed, claimed for a retry, taken
    /// over. `None` for a row without such history (never: every move writes it).
    pub since: Option<DateTime<Utc>>,
}

/// The durations in seconds of each step's latest successful runs, by
/// (seq, name): the runs of a task's last `instances` instances.
pub type StepDurations = HashMap<(u32, String), Vec<f64>>;

impl Store {
    /// Every RUNNING instance, with when it started running (cluster-wide on
    /// PostgreSQL: the reaper considers what any agent holds).
    pub async fn running(&self) -> Result<Vec<Running>> {
        self.read(|c| {
            c.query(
                "SELECT t.id, t.task, t.def_hash, t.lease_owner, \
                 (SELECT MAX(r.at) FROM transitions r WHERE r.instance_id = t.id AND r.step_seq IS NULL \
                  AND r.to_state = 'RUNNING') \
                 FROM task_instances t WHERE t.state = 'RUNNING' ORDER BY t.id",
                &[],
            )?
            .iter()
            .map(|r| {
                Ok(Running {
                    id: r.get(0)?,
                    task: r.get(1)?,
                    def_hash: r.get(2)?,
                    owner: r.get(3)?,
                    since: r.get::<super::value::When>(4)?.0,
                })
            })
            .collect()
        })
        .await
    }

    /// How long each step of `task` took in its successful runs among the
    /// task's last `instances` instances.
    pub async fn step_durations(&self, task: &str, instances: u32) -> Result<StepDurations> {
        let task = task.to_string();
        self.read(move |c| {
            let mut out = StepDurations::new();
            for r in c.query(
                "SELECT s.seq, s.name, s.started_at, s.finished_at FROM \
                 (SELECT id FROM task_instances WHERE task = ?1 ORDER BY id DESC LIMIT ?2) t \
                 JOIN step_runs s ON s.instance_id = t.id WHERE s.state = 'SUCCESS'",
                p![task.as_str(), instances],
            )? {
                let (start, end) = (parse_ts(r.get(2)?), parse_ts(r.get(3)?));
                if let (Some(a), Some(b)) = (start, end) {
                    let secs = (b - a).num_microseconds().unwrap_or(0).max(0) as f64 / 1e6;
                    out.entry((r.get(0)?, r.get(1)?)).or_default().push(secs);
                }
            }
            Ok(out)
        })
        .await
    }

    /// Reaps a zombie: its running steps fail with `reason`, the instance
    /// ends FAILED (no retry, no automatic rollback) and a `zombie_reaped`
    /// alert is raised, in one transaction, only if the instance is still
    /// RUNNING and held by `owner` (who held it when the reaper looked): a
    /// holder that finished or moved it meanwhile wins. `false` when it was
    /// not reaped for that reason.
    pub async fn reap(&self, id: &str, owner: Option<&str>, reason: &str) -> Result<bool> {
        let (i, o, r, a) = (id.to_string(), owner.map(str::to_string), reason.to_string(), self.agent().to_string());
        let reaped = self.write(move |c| reap(c, &i, o.as_deref(), &r, &a)).await?;
        if reaped {
            self.changed(id, TaskState::Failed, None);
            let raised =
                Raised { kind: AlertKind::ZombieReaped, message: reason.to_string(), instance: Some(id.into()) };
            self.announce(Topic::Alerts, EventData::AlertRaised(raised));
        }
        Ok(reaped)
    }
}

fn reap(c: &dyn Db, id: &str, owner: Option<&str>, reason: &str, actor: &str) -> Result<bool> {
    let row = c.query_opt("SELECT state, lease_owner FROM task_instances WHERE id = ?1", p![id])?;
    let Some(row) = row else { return Ok(false) };
    let (state, held_by): (String, Option<String>) = (row.get(0)?, row.get(1)?);
    if state != TaskState::Running.as_str() || held_by.as_deref() != owner {
        return Ok(false);
    }
    let running: Vec<u32> = c.column(
        "SELECT seq FROM step_runs WHERE instance_id = ?1 AND state = ?2",
        p![id, StepState::Running.as_str()],
    )?;
    for seq in running {
        step_fail(c, id, seq, reason, true, actor)?;
    }
    fail(c, id, reason, super::FailurePlan::Stop, actor)?;
    records::insert_alert(c, AlertKind::ZombieReaped, reason, Some(id))?;
    Ok(true)
}
