//! The store's operations that move no state: alerts, received events,
//! schedule fires, heartbeats, the state counts and the archive. Each
//! publishes on the bus after its commit, as the moves in `ops.rs` do.

use super::rows::ts;
use super::value::p;
use super::{records, Result, Store};
use apollo_shared::protocol::{AlertKind, Approval, EventData, Raised, Topic};
use apollo_shared::state::TaskState;
use chrono::{DateTime, Utc};
use serde_json::Value;

impl Store {
    pub async fn alert(&self, kind: AlertKind, message: &str, instance: Option<&str>) -> Result<()> {
        let (m, i) = (message.to_string(), instance.map(str::to_string));
        self.write(move |c| records::insert_alert(c, kind, &m, i.as_deref())).await?;
        let raised = Raised { kind, message: message.to_string(), instance: instance.map(str::to_string) };
        self.announce(Topic::Alerts, EventData::AlertRaised(raised));
        Ok(())
    }

    /// Stores a received event; `false` when its dedup key was seen before.
    pub async fn record_event(
        &self,
        id: &str,
        name: &str,
        data: Option<Value>,
        dedup_key: Option<String>,
        instances: Vec<String>,
    ) -> Result<bool> {
        let (i, n) = (id.to_string(), name.to_string());
        let stored = self
            .write(move |c| records::insert_event(c, &i, &n, data.as_ref(), dedup_key.as_deref(), &instances))
            .await?;
        Ok(stored.is_some())
    }

    /// Records the last fire of a task's schedule.
    pub async fn set_cron_fire(&self, task: &str, at: DateTime<Utc>) -> Result<()> {
        let (t, a) = (task.to_string(), super::rows::ts(at));
        self.write(move |c| {
            c.execute(
                "INSERT INTO cron_state (task, last_fire) VALUES (?1, ?2) ON CONFLICT(task) DO UPDATE SET last_fire = ?2",
                p![t.as_str(), a.as_str()],
            )?;
            Ok(())
        })
        .await
    }

    /// This agent's heartbeat; `starting` for the first of its life.
    pub async fn heartbeat(&self, h: records::Heartbeat, starting: bool) -> Result<()> {
        let id = self.agent().trim_start_matches("agent:").to_string();
        self.write(move |c| records::heartbeat(c, &id, &h, starting)).await
    }

    /// Notes that this agent stopped cleanly.
    pub async fn agent_stopped(&self) -> Result<()> {
        let id = self.agent().trim_start_matches("agent:").to_string();
        self.write(move |c| records::stopped(c, &id)).await
    }

    /// Folds the state counts' deltas (where the driver counts in deltas).
    pub async fn fold_counts(&self) -> Result<()> {
        if self.shared() {
            self.write(records::fold_counts).await?;
        }
        Ok(())
    }

    /// Archived documents that ended before `before`, by id after `after`,
    /// up to about `bytes` of them: each, and the last id when more may follow.
    pub async fn archive_page(
        &self,
        before: DateTime<Utc>,
        after: Option<String>,
        bytes: usize,
    ) -> Result<(Vec<String>, Option<String>)> {
        self.read(move |c| {
            let rows = c.query(
                "SELECT id, doc FROM archive WHERE finished_at < ?1 AND id > ?2 ORDER BY id LIMIT 200",
                p![ts(before), after.as_deref().unwrap_or("")],
            )?;
            let (mut docs, mut size, mut last) = (Vec::new(), 0, None);
            for r in &rows {
                let id: String = r.get(0)?;
                let doc = super::docs::read(&r.0[1]).map(|d| serde_json::to_string(&d).unwrap_or_default());
                let Some(doc) = doc else { continue };
                if size + doc.len() > bytes && !docs.is_empty() {
                    return Ok((docs, last));
                }
                size += doc.len();
                docs.push(doc);
                last = Some(id);
            }
            Ok((docs, if rows.len() == 200 { last } else { None }))
        })
        .await
    }

    /// Deletes archived instances past `scheduler.archive_retention`.
    pub async fn expire_archive(&self, cutoff: DateTime<Utc>, max: usize) -> Result<usize> {
        Ok(self.write(move |c| records::expire_archive(c, cutoff, max)).await?.len())
    }

    pub async fn archive(&self, cutoff: DateTime<Utc>, max: usize) -> Result<usize> {
        let ids = self.write(move |c| records::archive(c, cutoff, max)).await?;
        for id in &ids {
            self.announce(Topic::Tasks, EventData::InstanceArchived { id: id.clone() });
        }
        Ok(ids.len())
    }
}

impl Store {
    /// Says why the runnable instances of a task's definition version with
    /// these rollout arms wait (`None`: they no longer do); returns how many
    /// began to wait for this reason with this write.
    pub async fn set_waiting(&self, task: &str, hash: &str, pins: Option<&str>, reason: Option<&str>) -> Result<u64> {
        let (t, h, r) = (task.to_string(), hash.to_string(), reason.map(str::to_string));
        let pins = pins.map(str::to_string);
        self.write(move |c| {
            let fresh = match &r {
                Some(_) => c
                    .value::<i64>(
                        "SELECT COUNT(*) FROM task_instances WHERE task = ?1 AND def_hash = ?2 \
                         AND state IN ('PENDING', 'RETRYING') AND waiting IS NULL AND pins IS NOT DISTINCT FROM ?3",
                        p![t.as_str(), h.as_str(), pins.as_deref()],
                    )?
                    .unwrap_or(0) as u64,
                None => 0,
            };
            c.execute(
                "UPDATE task_instances SET waiting = ?3 WHERE task = ?1 AND def_hash = ?2 \
                 AND state IN ('PENDING', 'RETRYING') AND waiting IS DISTINCT FROM ?3 AND pins IS NOT DISTINCT FROM ?4",
                p![t.as_str(), h.as_str(), r.as_deref(), pins.as_deref()],
            )?;
            Ok(fresh)
        })
        .await
    }
}

/// Rollouts (`rollouts.rs` holds their SQL; the methods live here, beside
/// the store's other records, so `rollouts` names no `Store`).
impl Store {
    pub async fn rollouts(&self) -> Result<Vec<apollo_shared::protocol::Rollout>> {
        self.read(super::rollouts::all).await
    }

    pub async fn latest_rollouts(
        &self,
    ) -> Result<std::collections::BTreeMap<String, apollo_shared::protocol::Rollout>> {
        self.read(super::rollouts::latest).await
    }

    pub async fn start_rollout(&self, r: apollo_shared::protocol::Rollout) -> Result<apollo_shared::protocol::Rollout> {
        self.write(move |c| super::rollouts::start(c, &r)).await
    }

    pub async fn end_rollout(
        &self,
        plugin: &str,
        to: apollo_shared::protocol::RolloutState,
        reason: &str,
        actor: &str,
    ) -> Result<Option<apollo_shared::protocol::Rollout>> {
        let (p, r, a) = (plugin.to_string(), reason.to_string(), actor.to_string());
        self.write(move |c| super::rollouts::end(c, &p, to, &r, &a)).await
    }
}

/// Operators' pauses (`pauses.rs` holds their SQL). Each change is told to
/// clients and, on PostgreSQL, to the other agents (`pauses.changed`): an
/// ended pause wakes their claims.
impl Store {
    /// Every lock held or waited for.
    pub async fn locks(&self) -> Result<Vec<apollo_shared::protocol::LockInfo>> {
        self.read(super::locks::all).await
    }

    pub async fn lock_holders(&self) -> Result<Vec<apollo_shared::protocol::LockHolder>> {
        self.read(super::locks::lock_holders).await
    }

    pub async fn pauses(&self) -> Result<Vec<apollo_shared::protocol::Pause>> {
        self.read(super::pauses::in_force).await
    }

    pub async fn pause(&self, p: apollo_shared::protocol::Pause) -> Result<apollo_shared::protocol::Pause> {
        let begun = self.write(move |c| super::pauses::begin(c, &p)).await?;
        self.pauses_changed(&begun.id, false);
        Ok(begun)
    }

    /// Ends the pauses in force of exactly this scope; returns them.
    pub async fn resume(
        &self,
        scope: apollo_shared::protocol::PauseScope,
        target: Option<&str>,
        reason: &str,
        actor: &str,
    ) -> Result<Vec<apollo_shared::protocol::Pause>> {
        let (t, r, a) = (target.map(str::to_string), reason.to_string(), actor.to_string());
        let ended = self.write(move |c| super::pauses::end(c, scope, t.as_deref(), &r, &a)).await?;
        ended.iter().for_each(|p| self.pauses_changed(&p.id, true));
        Ok(ended)
    }

    /// Records the end of the pauses whose `until` passed; returns them.
    pub async fn lapse_pauses(&self) -> Result<Vec<apollo_shared::protocol::Pause>> {
        let ended = self.write(super::pauses::lapse).await?;
        ended.iter().for_each(|p| self.pauses_changed(&p.id, true));
        Ok(ended)
    }

    fn pauses_changed(&self, id: &str, ended: bool) {
        let data = apollo_shared::protocol::EventData::PausesChanged { id: id.to_string(), ended };
        self.announce(apollo_shared::protocol::Topic::Queues, data);
    }
}

/// Approval steps' requests and decisions (`approvals.rs` holds their SQL).
impl Store {
    pub async fn approval_for(&self, instance: &str, seq: u32, attempt: u32) -> Result<Option<Approval>> {
        let i = instance.to_string();
        self.read(move |c| super::approvals::for_step(c, &i, seq, attempt)).await
    }

    pub async fn open_approval(&self, instance: &str) -> Result<Option<Approval>> {
        let i = instance.to_string();
        self.read(move |c| super::approvals::open_for(c, &i)).await
    }

    pub async fn approvals(&self, limit: u32) -> Result<Vec<Approval>> {
        self.read(move |c| super::approvals::list(c, limit)).await
    }

    /// Records the request and parks the RUNNING instance on it, with the
    /// `approval_requested` alert `say` words for a new request (in the same
    /// commit: a request is never made without its alert, nor twice); the
    /// request when it is new, `None` when it was made already or decided
    /// meanwhile.
    pub async fn park_for_approval(
        &self,
        a: Approval,
        attempt: u32,
        say: impl Fn(&Approval) -> String + Send + Sync + 'static,
    ) -> Result<Option<Approval>> {
        let agent = self.agent().to_string();
        let parked = self
            .write(move |c| {
                let a = Approval { requested_by: super::approvals::requested_by(c, &a.instance)?, ..a.clone() };
                let fresh = super::approvals::park(c, &a, attempt, &agent)?;
                let said = fresh.as_ref().map(&say);
                if let Some(m) = &said {
                    records::insert_alert(c, AlertKind::ApprovalRequested, m, Some(&a.instance))?;
                }
                Ok((a.instance.clone(), fresh, said))
            })
            .await?;
        self.changed(&parked.0, TaskState::Pending, None);
        if let Some(message) = parked.2 {
            let raised = Raised { kind: AlertKind::ApprovalRequested, message, instance: Some(parked.0.clone()) };
            self.announce(Topic::Alerts, EventData::AlertRaised(raised));
        }
        Ok(parked.1)
    }

    /// Decides the approval the instance waits on; it is runnable again.
    pub async fn decide_approval(&self, a: &Approval, decision: &str, reason: &str, actor: &str) -> Result<Approval> {
        let (a2, d, r, ac) = (a.clone(), decision.to_string(), reason.to_string(), actor.to_string());
        let done = self.write(move |c| super::approvals::decide(c, &a2, &d, &r, &ac)).await?;
        // New work for every agent: the instance can be claimed.
        self.changed(&a.instance, TaskState::Pending, None);
        Ok(done)
    }

    /// Whether a pause's `until` or an approval's deadline has passed
    /// unrecorded (a read: the maintenance tick writes only when one has).
    pub async fn rails_due(&self) -> Result<(bool, bool)> {
        self.read(|c| {
            let pauses: Option<i64> = c.value(
                "SELECT 1 FROM pauses WHERE ended_at IS NULL AND until_at IS NOT NULL AND until_at <= apollo_now() LIMIT 1",
                &[],
            )?;
            let approvals: Option<i64> = c.value(
                "SELECT 1 FROM approvals INDEXED BY approvals_open WHERE decision IS NULL \
                 AND deadline IS NOT NULL AND deadline <= apollo_now() LIMIT 1",
                &[],
            )?;
            Ok((pauses.is_some(), approvals.is_some()))
        })
        .await
    }

    /// Decides the requests whose deadline passed; returns them.
    pub async fn expire_approvals(&self) -> Result<Vec<Approval>> {
        let done = self.write(super::approvals::expire).await?;
        done.iter().for_each(|a| self.changed(&a.instance, TaskState::Pending, None));
        Ok(done)
    }
}

/// Where the store keeps each instance of a list of ids: the ones in the
/// hot table and the ones in the archive (an id in neither is gone).
#[derive(Debug, Default)]
pub struct Kept {
    pub hot: std::collections::HashSet<String>,
    pub archived: std::collections::HashSet<String>,
}

impl Store {
    /// Which of `ids` are hot and which archived: one read of each table by
    /// key (a sweep of the files instances leave asks this; see
    /// `scheduler::leftovers`).
    pub async fn kept(&self, ids: Vec<String>) -> Result<Kept> {
        self.read(move |c| {
            let mut kept = Kept::default();
            if ids.is_empty() {
                return Ok(kept);
            }
            let marks = (1..=ids.len()).map(|i| format!("?{i}")).collect::<Vec<_>>().join(", ");
            let values: Vec<super::value::V> = ids.iter().map(super::value::V::from).collect();
            kept.hot = c
                .column(&format!("SELECT id FROM task_instances WHERE id IN ({marks})"), &values)?
                .into_iter()
                .collect();
            kept.archived =
                c.column(&format!("SELECT id FROM archive WHERE id IN ({marks})"), &values)?.into_iter().collect();
            Ok(kept)
        })
        .await
    }
}
