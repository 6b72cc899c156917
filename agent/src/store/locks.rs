//! Locks across instances (`locks:` on a definition): an instance holds its
//! locks while it is under way (RUNNING, FAILED with its rollback pending,
//! or parked at an approval step) — they are its row's, so they are released by whatever ends,
//! cancels or reaps it, and move with it when another agent takes it over.
//! A claim takes all of an instance's locks or none (see `leases::claim`).

use super::db::Db;
use super::Result;
use apollo_shared::protocol::{LockHolder, LockInfo};
use std::collections::BTreeMap;

/// Every lock held now, with its holder.
pub fn lock_holders(c: &dyn Db) -> Result<Vec<LockHolder>> {
    let mut out = Vec::new();
    for r in c.query(
        "SELECT id, task, locks, started_at, lease_owner FROM task_instances INDEXED BY task_instances_locked \
         WHERE locks IS NOT NULL AND (state = 'RUNNING' OR (state = 'FAILED' AND rollback_pending = 1) \
           OR (state = 'PENDING' AND approval IS NOT NULL))",
        &[],
    )? {
        let locks: String = r.get(2)?;
        for lock in serde_json::from_str::<Vec<String>>(&locks).unwrap_or_default() {
            out.push(LockHolder { lock, id: r.get(0)?, task: r.get(1)?, since: r.get(3)?, agent: r.get(4)? });
        }
    }
    Ok(out)
}

/// Every lock held or waited for, by name.
pub fn all(c: &dyn Db) -> Result<Vec<LockInfo>> {
    let mut by: BTreeMap<String, LockInfo> = BTreeMap::new();
    for h in lock_holders(c)? {
        by.insert(h.lock.clone(), LockInfo { lock: h.lock.clone(), holder: Some(h), waiting: 0 });
    }
    for locks in c.column::<String>(
        "SELECT locks FROM task_instances INDEXED BY task_instances_locked \
         WHERE locks IS NOT NULL AND state IN ('PENDING', 'RETRYING')",
        &[],
    )? {
        for lock in serde_json::from_str::<Vec<String>>(&locks).unwrap_or_default() {
            by.entry(lock.clone()).or_insert(LockInfo { lock, holder: None, waiting: 0 }).waiting += 1;
        }
    }
    Ok(by.into_values().collect())
}
