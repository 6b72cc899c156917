//! Who holds what: claims (by priority then age, within every limit),
//! leases and their renewal, the moves a wall-clock jump calls for, and the
//! takeover of instances whose holder is gone. Each runs inside the writer's
//! batch transaction, like the rest of `write`.

use super::db::{Conn, Db};
use super::history::history;
use super::locks::lock_holders;
use super::model::{Also, ClaimMove, Claimed, ClaimsMade, StepStart};
use super::rows::{ts, INSTANCE_COLS};
use super::value::{p, V};
use super::write::{move_task_from, step_fail, task_state};
use super::Result;
use apollo_shared::protocol::LockHolder;
use apollo_shared::state::TaskState;
use chrono::Utc;
use std::collections::HashMap;

mod queues;
mod recovery;
pub use queues::CANDIDATE_COLS;
use queues::{ordered_head, running_counts, Candidate, Running};
pub use recovery::{recover, renew_leases, shift_times, Recover};

/// On PostgreSQL, claims and takeovers of every agent on the schema take
/// turns (a lock held until the transaction ends), so the counts each one
/// reads are the counts it acts on: every limit holds across the cluster.
/// The writer takes the turn first in a batch holding a claim or a takeover
/// (`Store::write_in_turn`), sent with the batch's first statement: [`claim`]
/// and [`recover`] run only in such batches.
pub(super) fn take_turn(conn: &mut dyn Conn) -> Result<()> {
    let driver = conn.db().driver();
    driver.take_turn(conn)
}

/// A claim's first steps made ready before the instances move (see
/// [`claim_noting`]): given an instance as the claim will leave it, the
/// version and params of its step 0's start, if it may start.
pub type First<'a> = &'a dyn Fn(&Claimed) -> Option<(String, String)>;

/// The queues' rules for a claim, from `scheduler.queues`.
#[derive(Debug, Clone, Default)]
pub struct QueuePolicy {
    /// Running instances per queue, at most.
    pub limits: HashMap<String, u32>,
    /// Queues dedicated to other agents: never claimed here.
    pub excluded: Vec<String>,
    /// Queues whose tasks run one instance at a time, in creation order.
    pub ordered: Vec<String>,
    /// Queues with `affinity: task`, with the agents they are dedicated to
    /// (empty: every agent): a task's instances go to its owner only.
    pub affinity: HashMap<String, Vec<String>>,
    /// This agent's name (`agent.name`), for affinity.
    pub me: String,
    /// Whether this agent can run an instance's definition version (`None`:
    /// every one is claimed).
    pub capable: Option<super::capable::Capable>,
    /// The freeze windows open now (`scheduler.freezes`); the operators'
    /// pauses are read by the claim itself.
    pub frozen: Vec<apollo_shared::protocol::Pause>,
    /// Where the claim leaves the earliest end of the pauses that held work
    /// back (`None`: none did, or they end only by hand), so the caller
    /// claims again then.
    pub pause_ends: Option<std::sync::Arc<PauseEnds>>,
}

/// The earliest end of the pauses that held a claim's work back, as the
/// last claim saw it; a change wakes whoever waits on `changed` (the
/// scheduler's loop, which claims again then).
#[derive(Debug, Default)]
pub struct PauseEnds {
    pub at: std::sync::Mutex<Option<chrono::DateTime<Utc>>>,
    pub changed: tokio::sync::Notify,
}

impl PauseEnds {
    fn set(&self, at: Option<chrono::DateTime<Utc>>) {
        let mut held = self.at.lock().expect("pause ends");
        if *held != at {
            *held = at;
            self.changed.notify_one();
        }
    }
}

/// Claims up to `n` runnable instances by priority then age, respecting the
/// per-queue limits, each instance's `max_active`, the queues dedicated to
/// other agents and the ordered queues.
///
/// Candidates are read per task (the head of each task's runnable rows, by a
/// loose scan of the per-task index), so a long backlog of a task at its
/// `max_active` or of a full queue never hides the work behind it: the cost
/// is one index seek per task with runnable work, not a walk of the backlog.
/// `made`: an instance this very write created, as it stands (see
/// [`NewInstance::as_made`](super::model::NewInstance::as_made)): claimed,
/// it is handed on as the move leaves it rather than read back.
pub fn claim(
    c: &dyn Db,
    agent: &str,
    n: usize,
    lease_secs: f64,
    policy: &QueuePolicy,
    made: Option<&Claimed>,
) -> Result<Vec<Claimed>> {
    claim_noting(c, agent, n, lease_secs, policy, None, made).map(|(claimed, ..)| claimed)
}

/// [`claim`], and whether a limit or an ordered queue held runnable work
/// back (a claim that took all `n` may have left more: its caller counts
/// that too). On PostgreSQL, `first` makes claimed instances' step 0 ready
/// from the rows as read (and locked) before the move, and those steps start
/// in the same round trip as the moves; for each claimed instance, the
/// started step's attempt. A step not started so is left to the caller.
pub fn claim_noting(
    c: &dyn Db,
    agent: &str,
    n: usize,
    lease_secs: f64,
    policy: &QueuePolicy,
    first: Option<First>,
    made: Option<&Claimed>,
) -> Result<(Vec<Claimed>, bool, Vec<Option<u32>>)> {
    let mut held_back = false;
    let queue_limits = &policy.limits;
    let now = Utc::now();
    // What runs per queue and task, read only when a limit or an ordered
    // queue needs it (most claims have neither: one query fewer).
    let mut running: Option<Running> = None;
    let mut candidates: Vec<Candidate> = Vec::new();
    // The heads of each task's runnable rows: on PostgreSQL in the same
    // query (one round trip), where a row another transaction is moving is
    // not a candidate now; on SQLite one query per task.
    let heads = c.driver().heads(c, n, first.is_some())?;
    for (task, rows) in heads {
        let mut ordered_done = false;
        for r in rows {
            let queue: String = r.get(3)?;
            if policy.excluded.contains(&queue) {
                continue;
            }
            if policy.ordered.contains(&queue) {
                // Only the task's oldest waiting instance in the queue may
                // start, and only when none of the task's is under way.
                if !ordered_done {
                    ordered_done = true;
                    let (_, per_task) = running_counts(c, &mut running)?;
                    if per_task.get(&task).copied().unwrap_or(0) == 0 {
                        if let Some(head) = ordered_head(c, &task, &queue)? {
                            candidates.push(head);
                        }
                    }
                }
                // The rest of the task's waiting instances wait their turn.
                held_back = true;
                continue;
            }
            // The row as read, when the query brought it (PostgreSQL, with
            // `first`), with its step 0.
            let at = CANDIDATE_COLS.split(',').count();
            let whole = match r.0.len() > at {
                true => {
                    let n = INSTANCE_COLS.split(',').count();
                    let mut inst = super::rows::instance(&super::value::Row(r.0[at..at + n].to_vec()))?;
                    let step0 = super::value::Row(r.0[at + n..].to_vec());
                    inst.steps = Some(match step0.get::<Option<u32>>(0)? {
                        Some(_) => vec![super::rows::step(&step0)?],
                        None => Vec::new(),
                    });
                    Some(Box::new(inst))
                }
                false => None,
            };
            candidates.push(Candidate::read(&r, whole)?);
        }
    }
    // Nothing in the scope of a pause or an open freeze window (read in this
    // transaction: on PostgreSQL the same for every agent's claim).
    if !candidates.is_empty() {
        let (dropped, ends) = super::pauses::hold_back(c, &policy.frozen, &mut candidates, |w| (&w.queue, &w.task))?;
        held_back |= dropped;
        if let Some(cell) = &policy.pause_ends {
            cell.set(ends);
        }
    }
    candidates.sort_by(|a, b| b.priority.cmp(&a.priority).then_with(|| a.id.cmp(&b.id)));
    // Tasks of affinity queues owned by another live agent are theirs.
    if candidates.iter().any(|w| policy.affinity.contains_key(&w.queue)) {
        let live = super::affinity::live_agents(c)?;
        candidates.retain(|w| match policy.affinity.get(&w.queue) {
            None => true,
            Some(only) => {
                let serving = super::affinity::serving(&live, only, &policy.me);
                super::affinity::owner(&w.task, &serving) == Some(policy.me.as_str())
            }
        });
    }
    // Only what this agent has the plugins for: once per version (and
    // rollout arms) a claim.
    if let Some(capable) = &policy.capable {
        let mut verdicts: HashMap<(String, Option<String>), bool> = HashMap::new();
        let mut kept = Vec::with_capacity(candidates.len());
        for cand in candidates {
            let key = (cand.def_hash.clone(), cand.pins.clone());
            let runs = match verdicts.get(&key) {
                Some(v) => *v,
                None => {
                    let v = capable.runs(c, &cand.def_hash, cand.pins.as_deref())?;
                    verdicts.insert(key, v);
                    v
                }
            };
            if runs {
                kept.push(cand);
            } else {
                capable.passed.lock().expect("passed").insert((
                    cand.task.clone(),
                    cand.def_hash.clone(),
                    cand.pins.clone(),
                ));
            }
        }
        candidates = kept;
    }
    // What the claim takes, within every limit.
    let mut chosen: Vec<(String, TaskState, Option<Box<Claimed>>)> = Vec::new();
    // The locks under way (read once, when a candidate takes any), and those
    // this claim takes: all of an instance's locks with its claim, or none.
    let mut locked: Option<HashMap<String, LockHolder>> = None;
    for Candidate { id, task, queue, max_active, state, locks, waiting, whole, .. } in candidates {
        if chosen.len() >= n {
            held_back = true;
            break;
        }
        let wants: Vec<String> = locks.as_deref().and_then(|l| serde_json::from_str(l).ok()).unwrap_or_default();
        if !wants.is_empty() {
            if locked.is_none() {
                locked = Some(lock_holders(c)?.into_iter().map(|h| (h.lock.clone(), h)).collect());
            }
            let held = locked.as_ref().expect("read above");
            // (A parked or retrying instance holds its own locks: not in its way.)
            if let Some(holder) = wants.iter().find_map(|l| held.get(l).filter(|h| h.id != id)) {
                if waiting.is_none() {
                    note_lock_wait(c, &id, &state, holder, agent)?;
                }
                held_back = true;
                continue;
            }
        }
        let ordered = policy.ordered.contains(&queue);
        let limit = queue_limits.get(&queue).copied();
        if ordered || limit.is_some() || max_active.is_some() {
            let (per_queue, per_task) = running_counts(c, &mut running)?;
            let q_running = per_queue.get(&queue).copied().unwrap_or(0);
            let t_running = per_task.get(&task).copied().unwrap_or(0);
            if limit.is_some_and(|l| q_running >= l)
                || max_active.is_some_and(|m| t_running >= m)
                || (ordered && t_running > 0)
            {
                held_back = true;
                continue;
            }
        }
        if let Some(held) = locked.as_mut() {
            for l in wants {
                let holder =
                    LockHolder { lock: l.clone(), id: id.clone(), task: task.clone(), since: None, agent: None };
                held.insert(l, holder);
            }
        }
        if let Some((per_queue, per_task)) = running.as_mut() {
            *per_queue.entry(queue).or_default() += 1;
            *per_task.entry(task).or_default() += 1;
        }
        chosen.push((id, state.parse::<TaskState>().map_err(super::StoreError::Invalid)?, whole));
    }
    // The lease ends by the database's clock, on SQLite this process's: bound
    // there (a function in a move that fires a trigger costs a statement journal).
    macro_rules! claim_move {
        () => {
            "attempt = attempt + ?4, started_at = COALESCE(started_at, ?5), next_run_at = NULL, \
        lease_owner = ?6, finished_at = NULL, waiting = NULL, approval = NULL, lease_expires_at = "
        };
    }
    let (also, lease) = match c.driver().shared() {
        true => (concat!(claim_move!(), "apollo_now_plus(?7)"), V::from(lease_secs)),
        false => {
            (concat!(claim_move!(), "?7"), V::from(ts(now + chrono::Duration::microseconds((lease_secs * 1e6) as i64))))
        }
    };
    let terms = |from: TaskState| {
        let reason = if from == TaskState::Retrying { "claimed for retry" } else { "claimed" };
        (reason, vec![V::from(from == TaskState::Retrying), V::from(ts(now)), V::from(agent), lease.clone()])
    };
    let mut claimed = Vec::with_capacity(chosen.len());
    // The driver moves what it can in one round trip (PostgreSQL: all of
    // them, reading their steps and starting the first steps made ready,
    // each move returning the row as it left it); the rest move one by one
    // below.
    let ClaimsMade { moved: done, started } = {
        let moves: Vec<ClaimMove> = chosen
            .iter()
            .map(|(id, from, _)| ClaimMove { id: id.as_str(), retry: *from == TaskState::Retrying })
            .collect();
        // Each first step made ready from the row as the move will leave it
        // (locked since it was read: nothing else can change it meanwhile).
        let ready: Vec<(String, String, String)> = match first {
            Some(first) => chosen
                .iter()
                .filter_map(|(id, from, whole)| {
                    let mut inst = (**whole.as_ref()?).clone();
                    inst.state = TaskState::Running;
                    if *from == TaskState::Retrying {
                        inst.attempt += 1;
                    }
                    inst.lease_owner = Some(agent.to_string());
                    first(&inst).map(|(version, params)| (id.clone(), version, params))
                })
                .collect(),
            None => Vec::new(),
        };
        let starts: Vec<StepStart> = ready
            .iter()
            .map(|(id, v, p)| StepStart { id: id.as_str(), seq: 0, version: v.as_str(), params: p.as_str() })
            .collect();
        c.driver().claims(c, &moves, agent, lease_secs, &starts)?
    };
    let mut done = done.into_iter();
    for (id, from, _) in chosen {
        match done.next() {
            Some((Some(row), steps)) => {
                let mut inst = super::rows::instance(&super::value::Row(row.0[1..].to_vec()))?;
                inst.steps = Some(steps.iter().map(super::rows::step).collect::<Result<_>>()?);
                claimed.push(inst);
            }
            // SQLite, or a move PostgreSQL's statement did not make: the
            // portable move, which says why.
            _ => {
                let (reason, params) = terms(from);
                move_task_from(c, &id, Some(from), TaskState::Running, reason, agent, Also(also, &params))?;
                claimed.push(match made.filter(|m| m.id == id) {
                    Some(m) => moved(m, from, agent, now, lease_secs),
                    None => super::rows::instance_with_steps(c, &id)?,
                });
            }
        }
    }
    let attempts: Vec<Option<u32>> =
        claimed.iter().map(|i| started.iter().find(|(id, _)| *id == i.id).map(|(_, a)| *a)).collect();
    Ok((claimed, held_back, attempts))
}

/// An instance as the claim's move (`also` above) leaves it, from the
/// instance as it stood: what reading it back would give (on PostgreSQL
/// but the lease's end, which the server's clock sets a little apart), its
/// context as the store keeps it (see [`Claimed`]).
fn moved(m: &Claimed, from: TaskState, agent: &str, now: chrono::DateTime<Utc>, lease_secs: f64) -> Claimed {
    let mut i = m.clone();
    i.state = TaskState::Running;
    i.attempt += u32::from(from == TaskState::Retrying);
    let at = super::model::as_kept(now);
    i.started_at = i.started_at.or(Some(at));
    i.next_run_at = None;
    i.lease_owner = Some(agent.to_string());
    i.lease_expires_at = Some(at + chrono::Duration::microseconds((lease_secs * 1e6) as i64));
    i.finished_at = None;
    i.waiting = None;
    i
}

/// Records that instance `id` (in `state`) waits for a lock `holder`
/// holds: its `waiting` and a history row, once per wait (a claim that
/// finds it waiting already writes nothing; its claim clears it).
fn note_lock_wait(c: &dyn Db, id: &str, state: &str, holder: &LockHolder, agent: &str) -> Result<()> {
    let line = holder.waiting_line();
    c.execute("UPDATE task_instances SET waiting = ?2 WHERE id = ?1", p![id, line.as_str()])?;
    history(c, id, None, Some(state), state, &line, agent)
}
