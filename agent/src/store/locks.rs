//! Locks across instances (`locks:` on a definition): an instance holds its
//! locks from its claim until it ends — while it runs, while it waits out a
//! retry's backoff (RETRYING with its retry time set), while it is parked at
//! an approval step, and while it is FAILED with its rollback pending. They
//! are its row's, so they are released by whatever ends it (SUCCESS, FAILED
//! with no rollback coming, ROLLED_BACK), cancels or reaps it, and move with
//! it when another agent takes it over. An instance an operator retried or
//! resumed after a skip had ended: it waits for its locks like a new one
//! (its retry time is unset, see `operator::manual_retry`). A claim takes
//! all of an instance's locks or none (see `leases::claim`).

use super::db::Db;
use super::Result;
use apollo_shared::protocol::{LockHolder, LockInfo};
use std::collections::{BTreeMap, HashSet};

/// The rows that hold their locks (see the module): each branch the
/// `task_instances_locked` index's, read in one pass.
const HOLDING: &str = "locks IS NOT NULL AND (state = 'RUNNING' OR rollback_pending = 1 \
     OR (state = 'PENDING' AND approval IS NOT NULL) OR (state = 'RETRYING' AND next_run_at IS NOT NULL))";

/// Every lock held now, with its holder.
pub fn lock_holders(c: &dyn Db) -> Result<Vec<LockHolder>> {
    let mut out = Vec::new();
    for r in c.query(
        &format!(
            "SELECT id, task, locks, started_at, lease_owner FROM task_instances INDEXED BY task_instances_locked \
             WHERE {HOLDING}"
        ),
        &[],
    )? {
        let locks: String = r.get(2)?;
        for lock in serde_json::from_str::<Vec<String>>(&locks).unwrap_or_default() {
            out.push(LockHolder { lock, id: r.get(0)?, task: r.get(1)?, since: r.get(3)?, agent: r.get(4)? });
        }
    }
    Ok(out)
}

/// Every lock held or waited for, by name. The waiters are the runnable
/// rows naming the lock that do not hold their locks: a holder parked at an
/// approval (PENDING) or waiting out a backoff (RETRYING) is not its own
/// waiter.
pub fn all(c: &dyn Db) -> Result<Vec<LockInfo>> {
    let mut by: BTreeMap<String, LockInfo> = BTreeMap::new();
    let mut holders: HashSet<String> = HashSet::new();
    for h in lock_holders(c)? {
        holders.insert(h.id.clone());
        by.insert(h.lock.clone(), LockInfo { lock: h.lock.clone(), holder: Some(h), waiting: 0 });
    }
    for r in c.query(
        "SELECT id, locks FROM task_instances INDEXED BY task_instances_locked \
         WHERE locks IS NOT NULL AND state IN ('PENDING', 'RETRYING')",
        &[],
    )? {
        let (id, locks): (String, String) = (r.get(0)?, r.get(1)?);
        if holders.contains(&id) {
            continue;
        }
        for lock in serde_json::from_str::<Vec<String>>(&locks).unwrap_or_default() {
            by.entry(lock.clone()).or_insert(LockInfo { lock, holder: None, waiting: 0 }).waiting += 1;
        }
    }
    Ok(by.into_values().collect())
}
