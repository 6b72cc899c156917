//! One instance as `tasks.get` shows it, hot or archived: the read that
//! `get` and the timeline share.

use super::db::Db;
use super::rows::{add_earlier_attempts, instance_with_steps, transitions};
use super::value::p;
use super::{Result, StoreError};
use apollo_shared::protocol::Instance;

/// One instance with its steps, their earlier attempts, its items' counts
/// and its history, as `tasks.get` shows it; else its archived document.
pub(super) fn whole(c: &dyn Db, id: &str) -> Result<Option<Instance>> {
    match instance_with_steps(c, id) {
        Ok(mut inst) => {
            add_earlier_attempts(c, &mut inst)?;
            super::items::add_counts(c, &mut inst)?;
            inst.transitions = Some(transitions(c, id)?);
            Ok(Some(inst))
        }
        Err(StoreError::NotFound(_)) => {
            let doc = c.query_opt("SELECT doc FROM archive WHERE id = ?1", p![id])?;
            Ok(doc.and_then(|r| super::docs::read(&r.0[0])))
        }
        Err(e) => Err(e),
    }
}
