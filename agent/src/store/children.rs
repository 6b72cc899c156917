//! Sub-runbooks: a child instance is the one whose dedup key is
//! `child:<parent id>:<step seq>` (unique, archived or not: one child per
//! step, found by its key). While it runs, its parent is parked as an
//! approval parks it — PENDING, out of every claim's reach, holding no
//! slot — and is let go when the child ends.

use super::approvals::PARKED;
use super::db::Db;
use super::model::Also;
use super::pool::Store;
use super::value::p;
use super::write::move_task_from;
use super::Result;
use apollo_shared::protocol::child_key;
use apollo_shared::state::TaskState;

/// Parks a RUNNING instance until its child ends.
fn park(c: &dyn Db, id: &str, waiting: &str, agent: &str) -> Result<()> {
    let also = "lease_owner = NULL, lease_expires_at = NULL, next_run_at = ?4, waiting = ?5";
    let params = p![PARKED, waiting];
    let reason = format!("parked: {waiting}");
    move_task_from(c, id, Some(TaskState::Running), TaskState::Pending, &reason, agent, Also(also, &params[..]))?;
    Ok(())
}

/// Lets a parked parent be claimed again (nothing when it is not parked on
/// a child). True when it was.
fn unpark(c: &dyn Db, id: &str) -> Result<bool> {
    let n = c.execute(
        "UPDATE task_instances SET next_run_at = apollo_now(), waiting = NULL \
         WHERE id = ?1 AND state = 'PENDING' AND next_run_at = ?2 AND approval IS NULL",
        p![id, PARKED],
    )?;
    Ok(n > 0)
}

/// Lets go every parent parked on a child that has ended (a crash between
/// the child's end and its parent's release, a child cancelled while it
/// waited): how many.
fn release_parents(c: &dyn Db) -> Result<u32> {
    let n = c.execute(
        "UPDATE task_instances SET next_run_at = apollo_now(), waiting = NULL \
         WHERE state = 'PENDING' AND next_run_at = ?1 AND approval IS NULL AND EXISTS (\
           SELECT 1 FROM task_instances k WHERE k.dedup_key >= 'child:' || task_instances.id || ':' \
           AND k.dedup_key < 'child:' || task_instances.id || ';' AND k.finished_at IS NOT NULL \
           AND (k.state IN ('SUCCESS', 'ROLLED_BACK') OR (k.state = 'FAILED' AND k.rollback_pending = 0)))",
        p![PARKED],
    )?;
    Ok(n as u32)
}

impl Store {
    /// See [`release_parents`]; a read first, so an idle tick writes nothing.
    pub async fn release_parents(&self) -> Result<u32> {
        let parked: Option<i64> = self
            .read(|c| {
                c.value(
                    "SELECT 1 FROM task_instances WHERE state = 'PENDING' AND next_run_at = ?1 AND approval IS NULL LIMIT 1",
                    p![PARKED],
                )
            })
            .await?;
        if parked.is_none() {
            return Ok(0);
        }
        self.write(release_parents).await
    }

    /// Step `seq`'s child of instance `parent`, if it was made (archived too).
    pub async fn child(&self, parent: &str, seq: u32) -> Result<Option<apollo_shared::protocol::Instance>> {
        let key = child_key(parent, seq);
        let id: Option<String> = self
            .read(move |c| {
                c.value(
                    "SELECT id FROM task_instances WHERE dedup_key = ?1 UNION ALL SELECT id FROM archive WHERE dedup_key = ?1",
                    p![key.as_str()],
                )
            })
            .await?;
        match id {
            Some(id) => self.get(&id).await.map(Some),
            None => Ok(None),
        }
    }

    /// The children of instance `parent` not yet ended, for a cancel that goes down.
    pub async fn children_under_way(&self, parent: &str) -> Result<Vec<String>> {
        let (from, to) = (format!("child:{parent}:"), format!("child:{parent};"));
        self.read(move |c| {
            c.column(
                "SELECT id FROM task_instances WHERE dedup_key >= ?1 AND dedup_key < ?2 \
                 AND state IN ('PENDING', 'RUNNING', 'RETRYING')",
                p![from.as_str(), to.as_str()],
            )
        })
        .await
    }

    pub async fn park_for_child(&self, id: &str, waiting: &str) -> Result<()> {
        let (i, w, a) = (id.to_string(), waiting.to_string(), self.agent().to_string());
        self.write(move |c| park(c, &i, &w, &a)).await?;
        self.changed(id, TaskState::Pending, None);
        Ok(())
    }

    pub async fn unpark(&self, id: &str) -> Result<bool> {
        let i = id.to_string();
        let done = self.write(move |c| unpark(c, &i)).await?;
        if done {
            self.changed(id, TaskState::Pending, None);
        }
        Ok(done)
    }
}
