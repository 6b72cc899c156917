//! The store's operations as the scheduler and the server call them: each
//! one write (group-committed), followed by a notice on the bus.

use super::leases;
use super::model::{Claimed, FailurePlan, NewInstance, StepStart};
use super::{operator, write};
use super::{Result, Store};
use apollo_shared::protocol::{AlertKind, EventData, Raised, StepMoved, Topic};
use apollo_shared::state::{StepState, TaskState};
use serde_json::Value;
use std::collections::HashMap;
use std::time::Duration;

/// What a claim needs besides how many: the lease and the queues' rules.
#[derive(Debug, Clone)]
pub struct ClaimTerms {
    pub lease: Duration,
    pub policy: leases::QueuePolicy,
}

/// What [`Store::create_claiming`] did.
#[derive(Debug)]
pub struct Created {
    /// The new instance's id, or the existing one's with the same dedup key.
    pub id: String,
    pub created: bool,
    /// What the write claimed for this agent (maybe another instance, one
    /// that came first).
    pub claimed: Vec<Claimed>,
    /// `Started(attempt)` when the new instance's first step started too.
    pub followed: Followed,
}

/// What a step's SUCCESS write does besides (see [`Store::step_success`]).
#[derive(Debug, Clone, Copy)]
pub enum Then<'a> {
    /// Nothing: the instance's next move is a write of its own.
    Nothing,
    /// Starts step `seq` with `params` rendered for it.
    Start { seq: u32, version: &'a str, params: &'a Value },
    /// Ends the instance: it was the last step to run.
    Finish,
}

/// What a step's SUCCESS write did besides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Followed {
    Nothing,
    /// The next step started: its attempt.
    Started(u32),
    Finished,
}

/// A step start `then` asks for, owned for the writer thread: seq,
/// version, params as JSON text.
fn owned_start(then: &Then<'_>) -> Option<(u32, String, String)> {
    match then {
        Then::Start { seq, version, params } => Some((*seq, version.to_string(), params.to_string())),
        _ => None,
    }
}

/// A follow-up move the table refuses is left to a write of its own (whose
/// caller learns exactly why); what came before it in the write stands.
fn unless_refused(followed: Result<Followed>) -> Result<Followed> {
    match followed {
        Err(e @ (super::StoreError::Illegal(_) | super::StoreError::Invalid(_))) => {
            tracing::debug!(error = %e, "the follow-up move is left to a write of its own");
            Ok(Followed::Nothing)
        }
        other => other,
    }
}

impl Store {
    pub(super) fn changed(&self, id: &str, state: TaskState, step: Option<(u32, StepState)>) {
        // Nobody to tell (no client, no other agent): nothing to build.
        if !self.shared() && !self.bus().wants(Topic::Tasks) {
            return;
        }
        let step = step.map(|(seq, state)| StepMoved { seq, state });
        self.announce(Topic::Tasks, EventData::InstanceUpdated { id: id.to_string(), state, step });
    }

    pub async fn put_def(&self, hash: &str, task: &str, file: &str, source: &str) -> Result<()> {
        let (h, t, f, s) = (hash.to_string(), task.to_string(), file.to_string(), source.to_string());
        self.write(move |c| write::put_def(c, &h, &t, &f, &s)).await
    }

    pub async fn create(&self, n: NewInstance, actor: &str) -> Result<(String, bool)> {
        self.create_claiming(n, actor, None, Then::Nothing).await.map(|c| (c.id, c.created))
    }

    /// Creates an instance and, with `claim`, claims one instance in the same
    /// write — by priority then age within every limit, exactly as
    /// [`Store::claim`] does, so it is the new one only when nothing comes
    /// before it. When it is, `then` may start its first step in that write
    /// too. A trigger on an agent with a free slot thus records the instance,
    /// its claim and its first step's start in one commit instead of three.
    pub async fn create_claiming(
        &self,
        n: NewInstance,
        actor: &str,
        claim: Option<ClaimTerms>,
        then: Then<'_>,
    ) -> Result<Created> {
        let actor = actor.to_string();
        let task = n.task.clone();
        let agent = self.agent().to_string();
        let turn = claim.is_some();
        let first = owned_start(&then);
        let job = move |c: &dyn super::db::Db| {
            let at = chrono::Utc::now();
            let (id, created) = write::create(c, &n, &actor, at)?;
            // New work wakes the other agents with this very commit (not
            // a notification of its own after it): the fastest pickup.
            if created && c.driver().shared() {
                let created =
                    EventData::InstanceCreated { id: id.clone(), task: n.task.clone(), state: TaskState::Pending };
                super::listen::notify(c, &agent, &[super::listen::note(Topic::Tasks, &created)])?;
            }
            // SQLite's claim hands it on as made (PostgreSQL's returns the rows it moves).
            let made = (claim.is_some() && created && !c.driver().shared()).then(|| n.as_made(at));
            let claimed = match (&claim, created) {
                (Some(t), true) => leases::claim(c, &agent, 1, t.lease.as_secs_f64(), &t.policy, made.as_ref())?,
                _ => Vec::new(),
            };
            // Its step as the claim read it: not read again for the start.
            let followed = match (&first, claimed.iter().find(|i| i.id == id)) {
                (Some((seq, v, p)), Some(i)) => {
                    let start = StepStart { id: &id, seq: *seq, version: v, params: p };
                    let known = write::known_step(i, *seq);
                    unless_refused(write::step_start_known(c, start, known, &agent).map(Followed::Started))?
                }
                _ => Followed::Nothing,
            };
            Ok(Created { id, created, claimed, followed })
        };
        let done = if turn { self.write_in_turn(job).await? } else { self.write(job).await? };
        if done.created {
            self.bus().publish(
                Topic::Tasks,
                EventData::InstanceCreated { id: done.id.clone(), task, state: TaskState::Pending },
            );
        }
        for i in &done.claimed {
            self.changed(&i.id, TaskState::Running, None);
        }
        if let (Followed::Started(_), Then::Start { seq, .. }) = (done.followed, then) {
            self.changed(&done.id, TaskState::Running, Some((seq, StepState::Running)));
        }
        Ok(done)
    }

    /// Claims up to `n` runnable instances for `lease` (measured by the
    /// database's clock).
    pub async fn claim(&self, n: usize, lease: Duration, policy: leases::QueuePolicy) -> Result<Vec<Claimed>> {
        let (claimed, _) = self.claim_starting(n, lease, policy, |_| None::<((), String, String)>).await?;
        Ok(claimed.into_iter().map(|(i, _)| i).collect())
    }

    /// [`Store::claim`], and in the same write the start of each claimed
    /// instance's step 0 that `ready` makes ready (its version and params as
    /// JSON, with what the caller keeps of it): one commit less before a
    /// claimed instance's first step runs. A start the table refuses is left
    /// to the executor. Also says whether a limit or an ordered queue held
    /// runnable work back.
    #[allow(clippy::type_complexity)]
    pub async fn claim_starting<R: Send + 'static>(
        &self,
        n: usize,
        lease: Duration,
        policy: leases::QueuePolicy,
        ready: impl Fn(&Claimed) -> Option<(R, String, String)> + Send + 'static,
    ) -> Result<(Vec<(Claimed, Option<(R, u32)>)>, bool)> {
        let agent = self.agent().to_string();
        let secs = lease.as_secs_f64();
        let (claimed, waiting) = self
            .write_in_turn(move |c| {
                // On PostgreSQL the first steps are made ready from the rows
                // as read and start with the moves (one round trip less);
                // what the caller keeps of each is set aside here.
                let early: std::cell::RefCell<HashMap<String, R>> = Default::default();
                let first = |i: &Claimed| {
                    let (r, version, params) = ready(i)?;
                    early.borrow_mut().insert(i.id.clone(), r);
                    Some((version, params))
                };
                let (claimed, waiting, started) =
                    leases::claim_noting(c, &agent, n, secs, &policy, Some(&first), None)?;
                let mut early = early.into_inner();
                // The others (SQLite's; a row PostgreSQL could not make ready
                // before) are made ready now and start in one go.
                let readied: Vec<Option<(R, String, String)>> = claimed
                    .iter()
                    .zip(&started)
                    .map(|(i, s)| match s {
                        Some(_) => None,
                        None => ready(i),
                    })
                    .collect();
                let (starts, known): (Vec<StepStart>, Vec<write::Known>) = claimed
                    .iter()
                    .zip(&readied)
                    .filter_map(|(i, r)| {
                        let (_, v, p) = r.as_ref()?;
                        Some((StepStart { id: i.id.as_str(), seq: 0, version: v, params: p }, write::known_step(i, 0)))
                    })
                    .unzip();
                let mut outcomes = write::step_starts(c, &starts, &known, &agent)?.into_iter();
                let mut out = Vec::with_capacity(claimed.len());
                for ((i, r), s) in claimed.into_iter().zip(readied).zip(started) {
                    let started = match (s, r) {
                        (Some(attempt), _) => early.remove(&i.id).map(|r| (r, attempt)),
                        (None, Some((r, ..))) => {
                            let outcome = outcomes.next().expect("one outcome per start");
                            match unless_refused(outcome.map(Followed::Started))? {
                                Followed::Started(attempt) => Some((r, attempt)),
                                _ => None,
                            }
                        }
                        (None, None) => None,
                    };
                    out.push((i, started));
                }
                Ok((out, waiting))
            })
            .await?;
        for (i, started) in &claimed {
            self.changed(&i.id, TaskState::Running, None);
            if started.is_some() {
                self.changed(&i.id, TaskState::Running, Some((0, StepState::Running)));
            }
        }
        Ok((claimed, waiting))
    }

    pub async fn step_start(&self, id: &str, seq: u32, version: &str, params: &Value) -> Result<u32> {
        let (i, v, p, a) = (id.to_string(), version.to_string(), params.to_string(), self.agent().to_string());
        let attempt =
            self.write(move |c| write::step_start(c, StepStart { id: &i, seq, version: &v, params: &p }, &a)).await?;
        self.changed(id, TaskState::Running, Some((seq, StepState::Running)));
        Ok(attempt)
    }

    /// Records a step's SUCCESS and, in the same transaction, what `then`
    /// asks: the next step's start or the instance's end. One commit instead
    /// of two; the SUCCESS is on disk before the next step runs all the same.
    /// A follow-up the store refuses leaves the SUCCESS recorded and returns
    /// [`Followed::Nothing`]: the caller then makes that move on its own, and
    /// learns exactly why it is refused.
    pub async fn step_success(&self, id: &str, seq: u32, output: &str, then: Then<'_>) -> Result<Followed> {
        let write = super::model::Success {
            id: id.to_string(),
            seq,
            output: output.to_string(),
            next: owned_start(&then),
            finish: matches!(then, Then::Finish),
            actor: self.agent().to_string(),
        };
        let followed = match (self.write_success(write).await?, then) {
            ((true, attempt), Then::Start { .. }) => Followed::Started(attempt),
            ((true, _), Then::Finish) => Followed::Finished,
            _ => Followed::Nothing,
        };
        self.changed(id, TaskState::Running, Some((seq, StepState::Success)));
        match (followed, then) {
            (Followed::Started(_), Then::Start { seq: n, .. }) => {
                self.changed(id, TaskState::Running, Some((n, StepState::Running)))
            }
            (Followed::Finished, _) => self.changed(id, TaskState::Success, None),
            _ => {}
        }
        Ok(followed)
    }

    /// Returns the step's failure count after this one.
    pub async fn step_fail(&self, id: &str, seq: u32, error: &str, counts: bool) -> Result<u32> {
        let (i, e, a) = (id.to_string(), error.to_string(), self.agent().to_string());
        let failures = self.write(move |c| write::step_fail(c, &i, seq, &e, counts, &a)).await?;
        self.changed(id, TaskState::Running, Some((seq, StepState::Failed)));
        Ok(failures)
    }

    pub async fn finish_success(&self, id: &str) -> Result<()> {
        let (i, a) = (id.to_string(), self.agent().to_string());
        self.write(move |c| write::finish_success(c, &i, &a)).await?;
        self.changed(id, TaskState::Success, None);
        Ok(())
    }

    pub async fn fail(&self, id: &str, error: &str, plan: FailurePlan, actor: &str) -> Result<()> {
        let (i, e, a) = (id.to_string(), error.to_string(), actor.to_string());
        self.write(move |c| write::fail(c, &i, &e, plan, &a)).await?;
        let state = if matches!(plan, FailurePlan::Retry(_)) { TaskState::Retrying } else { TaskState::Failed };
        self.changed(id, state, None);
        Ok(())
    }

    pub async fn step_rolled_back(&self, id: &str, seq: u32) -> Result<()> {
        let (i, a) = (id.to_string(), self.agent().to_string());
        self.write(move |c| write::step_rolled_back(c, &i, seq, &a)).await?;
        self.changed(id, TaskState::Failed, Some((seq, StepState::RolledBack)));
        Ok(())
    }

    /// Holds an instance whose `on_interrupt: hold` step was interrupted:
    /// the step's error says so and the instance ends FAILED (no retry, no
    /// automatic rollback), in one transaction.
    /// Step `seq`, whose `when:` was false, recorded SKIPPED with `reason`:
    /// past, like a step skipped by hand (it never runs, not on a retry).
    pub async fn skip_by_condition(&self, id: &str, seq: u32, reason: &str) -> Result<()> {
        let (i, r, a) = (id.to_string(), reason.to_string(), self.agent().to_string());
        self.write(move |c| write::skip_by_condition(c, &i, seq, &r, &a)).await?;
        self.changed(id, TaskState::Running, None);
        Ok(())
    }

    pub async fn hold(&self, id: &str, seq: u32, why: &str) -> Result<()> {
        let (i, w, a) = (id.to_string(), why.to_string(), self.agent().to_string());
        self.write(move |c| {
            write::step_note_error(c, &i, seq, &format!("held: {w}"))?;
            write::fail(c, &i, &w, FailurePlan::Stop, &a)
        })
        .await?;
        self.changed(id, TaskState::Failed, None);
        Ok(())
    }

    /// Records the learned timeout of a step's attempt (`timeout: auto`).
    pub async fn step_note_timeout(&self, id: &str, seq: u32, secs: f64, basis: &str) -> Result<()> {
        let (i, b) = (id.to_string(), basis.to_string());
        self.write(move |c| write::step_note_timeout(c, &i, seq, secs, &b)).await
    }

    pub async fn step_note_error(&self, id: &str, seq: u32, error: &str) -> Result<()> {
        let (i, e) = (id.to_string(), error.to_string());
        self.write(move |c| write::step_note_error(c, &i, seq, &e)).await
    }

    pub async fn finish_rolled_back(&self, id: &str) -> Result<()> {
        let (i, a) = (id.to_string(), self.agent().to_string());
        self.write(move |c| write::finish_rolled_back(c, &i, &a)).await?;
        self.changed(id, TaskState::RolledBack, None);
        Ok(())
    }

    pub async fn rollback_failed(&self, id: &str, error: &str) -> Result<()> {
        let (i, e, a) = (id.to_string(), error.to_string(), self.agent().to_string());
        self.write(move |c| write::rollback_failed(c, &i, &e, &a)).await?;
        self.changed(id, TaskState::Failed, None);
        let raised =
            Raised { kind: AlertKind::RollbackFailed, message: error.to_string(), instance: Some(id.to_string()) };
        self.announce(Topic::Alerts, EventData::AlertRaised(raised));
        Ok(())
    }

    pub async fn manual_retry(&self, id: &str, reason: &str, actor: &str) -> Result<()> {
        let (i, r, a) = (id.to_string(), reason.to_string(), actor.to_string());
        self.write(move |c| operator::manual_retry(c, &i, &r, &a)).await?;
        self.changed(id, TaskState::Retrying, None);
        Ok(())
    }

    /// An operator's skip of a failed step; the instance resumes after it.
    pub async fn skip_step(&self, id: &str, seq: u32, reason: &str, actor: &str) -> Result<()> {
        let (i, r, a) = (id.to_string(), reason.to_string(), actor.to_string());
        self.write(move |c| operator::skip_step(c, &i, seq, &r, &a)).await?;
        self.changed(id, TaskState::Failed, Some((seq, StepState::Skipped)));
        self.changed(id, TaskState::Retrying, None);
        Ok(())
    }

    pub async fn manual_rollback(&self, id: &str, lease: Duration, reason: &str, actor: &str) -> Result<()> {
        let (i, r, a, o) = (id.to_string(), reason.to_string(), actor.to_string(), self.agent().to_string());
        let secs = lease.as_secs_f64();
        self.write(move |c| operator::manual_rollback(c, &i, secs, &r, &o, &a)).await?;
        self.changed(id, TaskState::Failed, None);
        Ok(())
    }

    pub async fn cancel_waiting(&self, id: &str, reason: &str, actor: &str) -> Result<()> {
        let (i, r, a) = (id.to_string(), reason.to_string(), actor.to_string());
        self.write(move |c| operator::cancel_waiting(c, &i, &r, &a)).await?;
        self.changed(id, TaskState::Failed, None);
        Ok(())
    }

    pub async fn renew_leases(&self, ids: Vec<String>, lease: Duration) -> Result<()> {
        let agent = self.agent().to_string();
        let secs = lease.as_secs_f64();
        self.write(move |c| leases::renew_leases(c, &agent, &ids, secs)).await
    }

    pub async fn cancel_orphan(&self, id: &str, reason: &str, actor: &str) -> Result<()> {
        let (i, r, a) = (id.to_string(), reason.to_string(), actor.to_string());
        self.write(move |c| operator::cancel_orphan(c, &i, &r, &a)).await?;
        self.changed(id, TaskState::Failed, None);
        Ok(())
    }

    /// A failed attempt and what follows it, in one transaction; returns the
    /// step's failure count and the plan `decide` chose.
    pub async fn fail_step(
        &self,
        id: &str,
        seq: u32,
        error: &str,
        counts: bool,
        decide: write::Decide,
    ) -> Result<(u32, FailurePlan)> {
        let agent = self.agent().to_string();
        self.fail_step_by(id, seq, error, counts, decide, &agent).await
    }

    /// [`Store::fail_step`] caused by `actor` (an operator's cancel): the
    /// history rows are theirs.
    pub async fn fail_step_by(
        &self,
        id: &str,
        seq: u32,
        error: &str,
        counts: bool,
        decide: write::Decide,
        actor: &str,
    ) -> Result<(u32, FailurePlan)> {
        let (i, e, a) = (id.to_string(), error.to_string(), actor.to_string());
        let (failures, plan) = self.write(move |c| write::fail_step(c, &i, seq, &e, counts, &decide, &a)).await?;
        self.changed(id, TaskState::Running, Some((seq, StepState::Failed)));
        let state = match plan {
            FailurePlan::Retry(_) => TaskState::Retrying,
            FailurePlan::Continue => TaskState::Running,
            _ => TaskState::Failed,
        };
        self.changed(id, state, None);
        Ok((failures, plan))
    }

    pub async fn recover(&self, lease: Duration, which: leases::Recover) -> Result<Vec<Claimed>> {
        let agent = self.agent().to_string();
        let secs = lease.as_secs_f64();
        self.write_in_turn(move |c| leases::recover(c, &agent, secs, &which)).await
    }

    /// Moves retry times and leases by `delta` (after the wall clock jumped).
    pub async fn shift_times(&self, delta: chrono::TimeDelta) -> Result<usize> {
        self.write(move |c| leases::shift_times(c, delta)).await
    }
}
