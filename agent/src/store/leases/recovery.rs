//! Leases kept and lost: renewed while an instance runs, moved with the clock, and the instances recovered at start or taken over from an agent that died.

use super::*;

/// Extends the leases this agent holds on instances it still runs (RUNNING,
/// or FAILED with its rollback under way); a lease on anything else is left.
pub fn renew_leases(c: &dyn Db, agent: &str, ids: &[String], lease_secs: f64) -> Result<()> {
    for id in ids {
        c.execute(
            "UPDATE task_instances SET lease_expires_at = apollo_now_plus(?2) WHERE id = ?1 AND lease_owner = ?3 \
             AND (state = 'RUNNING' OR rollback_pending = 1)",
            p![id, lease_secs, agent],
        )?;
    }
    Ok(())
}

/// Moves every pending retry time and every lease by `delta` (the agent's
/// wall clock jumped). On PostgreSQL leases follow the database's clock,
/// which did not move, and retry times of other agents are theirs: nothing
/// is moved there.
pub fn shift_times(c: &dyn Db, delta: chrono::TimeDelta) -> Result<usize> {
    c.driver().shift_times(c, delta)
}

/// Takes over instances whose holder is gone: every RUNNING instance and every
/// FAILED one with a rollback pending, except those in `held`. With
/// `only_expired`, only those whose lease has run out. Steps that were
/// RUNNING are marked FAILED as interrupted (not counted against retries),
/// so they run again: at-least-once.
/// Which held instances a recovery takes.
#[derive(Debug, Clone)]
pub enum Recover {
    /// Every one (at start on SQLite, where one agent is the only one:
    /// what an earlier life of it held).
    All,
    /// At start on a shared database: what earlier lives of this agent held
    /// (lease owners `<prefix><pid>`), and what anyone held whose lease ran out.
    AtStart { prefix: String },
    /// Those whose lease ran out, but for these (its own, still running),
    /// and, with `capable`, but for those this agent lacks the plugins for
    /// (an agent that has them takes them over).
    Expired { held: Vec<String>, capable: Option<crate::store::capable::Capable> },
    /// These, held by this agent, whose executors stopped on a store error.
    Stalled(Vec<String>),
}

pub fn recover(c: &dyn Db, agent: &str, lease_secs: f64, which: &Recover) -> Result<Vec<Claimed>> {
    let only_expired = matches!(which, Recover::Expired { .. });
    let rows = c.query(
        // Each branch uses the state index; an OR across them would scan the table.
        "SELECT id, lease_owner, CASE WHEN lease_expires_at IS NULL OR lease_expires_at < apollo_now() THEN 1 ELSE 0 END, \
         def_hash, pins FROM (\
           SELECT id, priority, lease_owner, lease_expires_at, def_hash, pins FROM task_instances WHERE state = 'RUNNING' \
           UNION ALL \
           SELECT id, priority, lease_owner, lease_expires_at, def_hash, pins FROM task_instances INDEXED BY task_instances_rolling_back \
           WHERE rollback_pending = 1) AS held \
         WHERE ?1 = 0 OR lease_expires_at IS NULL OR lease_expires_at < apollo_now() ORDER BY priority DESC, id",
        p![only_expired],
    )?;
    let mut ids = Vec::new();
    for r in rows {
        let (id, owner, expired): (String, Option<String>, bool) = (r.get(0)?, r.get(1)?, r.get(2)?);
        let take = match which {
            Recover::All => true,
            Recover::AtStart { prefix } => expired || owner.as_deref().is_none_or(|o| o.starts_with(prefix.as_str())),
            Recover::Expired { held, capable } => {
                !held.contains(&id)
                    && match capable {
                        Some(cap) => cap.runs(c, &r.get::<String>(3)?, r.get::<Option<String>>(4)?.as_deref())?,
                        None => true,
                    }
            }
            Recover::Stalled(these) => these.contains(&id) && owner.as_deref() == Some(agent),
        };
        if take {
            ids.push(id);
        }
    }
    let mut out = Vec::new();
    for id in ids {
        let running: Vec<u32> =
            c.column("SELECT seq FROM step_runs WHERE instance_id = ?1 AND state = 'RUNNING'", p![id.as_str()])?;
        for seq in running {
            step_fail(c, &id, seq, "interrupted: the agent stopped while this step ran; it runs again", false, agent)?;
        }
        c.execute(
            "UPDATE task_instances SET lease_owner = ?2, lease_expires_at = apollo_now_plus(?3) WHERE id = ?1",
            p![id.as_str(), agent, lease_secs],
        )?;
        // A note, not a move: the instance keeps its state and changes hands.
        let state = task_state(c, &id)?;
        history(c, &id, None, Some(state.as_str()), state.as_str(), "recovered: resumed by this agent", agent)?;
        out.push(crate::store::rows::instance_with_steps(c, &id)?);
    }
    Ok(out)
}
