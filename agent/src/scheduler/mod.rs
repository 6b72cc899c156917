//! The scheduler: claims runnable instances and runs each in an executor
//! task; keeps their leases alive; reaps instances stuck RUNNING; recovers
//! what a previous run of the agent held.
//!
//! It knows no SQL and no sockets: it talks to the store, and is woken by
//! [`Scheduler::wake`] (a trigger, a retry request, a finished instance) or
//! by the earliest retry falling due. There is no polling loop.

mod approvals;
mod archive;
pub mod backoff;
mod calls;
mod executor;
mod items;
mod leftovers;
pub mod reaper;
mod rollback;
mod slots;
mod state;
pub mod waiting;

use state::noted;
pub use state::{Active, Scheduler};

use crate::handles::StopReason;
use crate::steps::FirstStart;
use crate::store::{Claimed, Recover};
use apollo_shared::def::TaskDef;
use apollo_shared::state::TaskState;
use chrono::Utc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A wall clock that moved more than this against the monotonic clock jumped.
const CLOCK_JUMP: chrono::TimeDelta = chrono::TimeDelta::seconds(2);

impl Scheduler {
    /// Takes up again the instances whose executors stopped on a store
    /// error, once the store can be written (their leases are still this
    /// agent's; nothing waits for them to run out).
    async fn resume_stalled(self: &Arc<Self>) {
        let ids = std::mem::take(&mut *self.stalled.lock().expect("stalled"));
        if ids.is_empty() || self.shutdown.is_cancelled() {
            return;
        }
        if self.store.unwritable().is_some() && !self.store_answers().await {
            *self.stalled.lock().expect("stalled") = ids;
            return;
        }
        match self.store.recover(self.lease(), Recover::Stalled(ids.clone())).await {
            Ok(found) => {
                tracing::info!(count = found.len(), "the store can be written again; resuming stalled instances");
                found.into_iter().for_each(|i| self.adopt(i, None));
            }
            Err(_) => *self.stalled.lock().expect("stalled") = ids,
        }
    }
    /// Takes back what an earlier life of the agent held: stops the processes
    /// it left running for those steps, then resumes each instance. The agent
    /// accepts connections only after this, so no client ever sees an
    /// instance RUNNING with nobody working on it.
    pub async fn recover(self: &Arc<Self>) {
        // On a shared database the other agents' instances are theirs.
        let which = if self.store.shared() {
            let id = self.store.agent();
            Recover::AtStart { prefix: id[..id.rfind(':').map_or(id.len(), |i| i + 1)].to_string() }
        } else {
            Recover::All
        };
        match self.store.recover(self.lease(), which).await {
            Ok(found) => {
                if !found.is_empty() {
                    tracing::info!(count = found.len(), "resuming instances held when the agent stopped");
                }
                self.stop_leftovers(&found).await;
                crate::crash_point!("recovery.before_resume");
                found.into_iter().for_each(|i| self.adopt(i, None));
            }
            Err(e) => tracing::error!(error = %e, "recovery failed"),
        }
    }
    /// The main loop; returns when the agent shuts down and running steps
    /// have finished (or the grace period ran out).
    pub async fn run(self: Arc<Self>) {
        // Leases are renewed three times a lease; a reload may shorten it.
        let tick_for = |lease: Duration| (lease / 3).max(Duration::from_millis(100));
        let mut lease = self.config().scheduler.lease;
        let mut maintenance = tokio::time::interval(tick_for(lease));
        maintenance.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.load_retry_due(chrono::DateTime::<Utc>::MIN_UTC).await;
        // WATCHDOG=1 comes from this loop, so a loop that stops turning stops it.
        let every = crate::notify::watchdog_every();
        let mut watchdog = tokio::time::interval(every.unwrap_or(Duration::from_secs(3600)));
        watchdog.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let watching = every.is_some();
        // New limits (SIGHUP) are acted on at once: more room claims more.
        let mut settings = self.settings.subscribe();
        loop {
            fail::fail_point!("scheduler.stall");
            self.watch_clock().await;
            if self.config().scheduler.lease != lease {
                lease = self.config().scheduler.lease;
                maintenance = tokio::time::interval(tick_for(lease));
                maintenance.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            }
            self.resume_stalled().await;
            self.claim_free(|i, first| self.adopt(i, first)).await;
            // Slots left free run items other agents' fan-outs offer.
            self.help().await;
            let retry = *self.retry_due.lock().expect("retry due");
            // A pause holding work back that ends by itself: claim then
            // (once: the claim says again if another still holds it).
            let resumes = {
                let mut at = self.pause_ends.at.lock().expect("pause ends");
                if at.is_some_and(|t| t <= Utc::now()) {
                    *at = None;
                }
                *at
            };
            let due = match (retry, resumes) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let sleep_for =
                due.map(|t| (t - Utc::now()).to_std().unwrap_or(Duration::ZERO)).unwrap_or(Duration::from_secs(3600));
            // Stalled instances are looked at again every half second.
            let stalled = !self.stalled.lock().expect("stalled").is_empty();
            tokio::select! {
                _ = self.wake.notified() => {}
                // A trigger's claim saw a pause that ends by itself.
                _ = self.pause_ends.changed.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(500)), if stalled => {}
                Ok(()) = settings.changed() => {}
                _ = tokio::time::sleep(sleep_for) => {
                    // The loop's top claims what fell due; the next wait is for
                    // the first retry after now. A due retry waiting for a free
                    // slot is claimed when a slot frees, not by spinning on its time.
                    self.load_retry_due(Utc::now()).await;
                }
                _ = maintenance.tick() => {
                    self.maintain().await;
                    self.archive().await;
                    self.sweep_leftovers();
                    if self.store.shared() {
                        // Retries another agent scheduled (it may have died
                        // since) fall due here too.
                        self.load_retry_due(Utc::now()).await;
                        noted(self.store.fold_counts().await, &self.failing.fold);
                    }
                }
                _ = watchdog.tick(), if watching => {
                    crate::notify::alive(&self.status_line().await);
                }
                _ = self.shutdown.cancelled() => break,
            }
        }
        let cfg = self.config().scheduler.clone();
        crate::notify::stopping(cfg.shutdown_grace + cfg.kill_grace + Duration::from_secs(5));
        self.drain().await;
    }
    /// Stop claiming; let running steps finish up to the grace period; then
    /// stop what is left (it is resumed at the next start).
    async fn drain(&self) {
        self.tracker.close();
        let n = self.running();
        if n > 0 {
            tracing::info!(
                running = n,
                grace_secs = self.config().scheduler.shutdown_grace.as_secs_f64(),
                "waiting for running steps"
            );
        }
        if tokio::time::timeout(self.config().scheduler.shutdown_grace, self.tracker.wait()).await.is_err() {
            for a in self.active.lock().expect("active").values() {
                a.why.lock().expect("why").get_or_insert(StopReason::Shutdown);
                a.token.cancel();
            }
            self.helping.lock().expect("helping").iter().for_each(|h| h.token.cancel());
            let grace = self.config().scheduler.kill_grace + Duration::from_secs(2);
            let _ = tokio::time::timeout(grace, self.tracker.wait()).await;
        }
    }
    /// Renews the leases of what runs here, reaps zombies, and takes over
    /// RUNNING instances whose lease ran out with nobody holding them.
    async fn maintain(self: &Arc<Self>) {
        let held: Vec<(String, Arc<Active>)> =
            self.active.lock().expect("active").iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let ids: Vec<String> = held.iter().map(|(k, _)| k.clone()).collect();
        noted(self.store.renew_leases(ids.clone(), self.lease()).await, &self.failing.leases);
        noted(self.store.heartbeat(self.heartbeat(), false).await, &self.failing.heartbeat);
        reaper::reap(self).await;
        crate::rollouts::tick(&self.store, &self.registry, &self.name).await;
        waiting::check(self).await;
        // Approvals whose deadline passed are decided by their on_timeout
        // (their instances are claimed again), and pauses whose `until`
        // passed end for the record (claims already ignore them); a read
        // first, so an idle tick writes nothing.
        let (pauses_due, approvals_due) = self.store.rails_due().await.unwrap_or((false, false));
        let expired = match approvals_due {
            true => self.store.expire_approvals().await.ok(),
            false => None,
        };
        if let Some(expired) = expired {
            for a in &expired {
                tracing::info!(instance = %a.instance, "approval of step {} timed out (on_timeout: {})", a.step, a.on_timeout);
            }
            if !expired.is_empty() {
                self.wake();
            }
        }
        // Parents whose child ended without releasing them (a crash between
        // the two, a child cancelled while it waited).
        if noted(self.store.release_parents().await, &self.failing.parents).is_some_and(|n| n > 0) {
            self.wake();
        }
        let ended = match pauses_due {
            true => self.store.lapse_pauses().await.ok(),
            false => None,
        };
        if let Some(ended) = ended {
            for p in ended {
                tracing::info!(pause = %p.id, "{} resumed: until {} reached", p.what(), p.until.unwrap_or_default());
            }
        }
        if self.shutdown.is_cancelled() {
            return;
        }
        let found = noted(
            self.store.recover(self.lease(), Recover::Expired { held: ids, capable: Some(self.capable.clone()) }).await,
            &self.failing.lease_check,
        );
        if let Some(found) = found {
            self.stop_leftovers(&found).await;
            for i in found {
                let msg = format!("instance {} was RUNNING with an expired lease and no holder; resumed here", i.id);
                tracing::warn!(task_id = %i.id, "{msg}");
                let _ = self.store.alert(apollo_shared::protocol::AlertKind::LeaseExpired, &msg, Some(&i.id)).await;
                self.adopt(i, None);
            }
        }
    }
    /// What runs and waits, for the service manager's status line.
    pub async fn status_line(&self) -> String {
        let waiting = match self.store.counts().await {
            Ok(c) => [TaskState::Pending, TaskState::Retrying].iter().filter_map(|s| c.get(s.as_str())).sum(),
            Err(_) => 0,
        };
        let mut line = format!("{} running, {waiting} queued", self.running());
        if let Some(e) = self.store.unwritable() {
            line.push_str(&format!("; {e}"));
        }
        line
    }
    /// Notices the wall clock jumping (NTP stepping it, an operator setting
    /// it) and moves the stored retry times and leases by the same amount, so
    /// a retry due in 2 s runs in 2 s and a lease lasts its length whatever
    /// the wall clock did. Schedules handle jumps themselves (see `cron`).
    async fn watch_clock(&self) {
        let (wall, mono) = (Utc::now(), Instant::now());
        let delta = {
            let mut anchor = self.clock_anchor.lock().expect("clock anchor");
            let expected = anchor.0 + chrono::Duration::from_std(mono - anchor.1).unwrap_or_default();
            *anchor = (wall, mono);
            wall - expected
        };
        if delta.abs() < CLOCK_JUMP {
            return;
        }
        let msg = format!(
            "the wall clock jumped {}{:.1}s; retry times and leases were moved with it",
            if delta > chrono::TimeDelta::zero() { "forward " } else { "back " },
            delta.abs().num_milliseconds() as f64 / 1000.0
        );
        tracing::warn!("{msg}");
        match self.store.shift_times(delta).await {
            Ok(n) => tracing::info!(rows = n, "retry times and leases moved"),
            Err(e) => tracing::error!(error = %e, "cannot move retry times after a clock jump"),
        }
        if let Some(due) = self.retry_due.lock().expect("retry due").as_mut() {
            *due += delta;
        }
        let _ = self.store.alert(apollo_shared::protocol::AlertKind::ClockJump, &msg, None).await;
        self.clock_jumped.notify_one();
    }
    /// Before a taken-over instance runs again, stops whatever an earlier
    /// holder left running for its interrupted steps (or, while it rolls
    /// back, for any of its steps): two copies of a step never run at once.
    async fn stop_leftovers(&self, found: &[Claimed]) {
        use apollo_shared::state::{StepState, TaskState};
        let keys: std::collections::HashSet<String> = found
            .iter()
            .flat_map(|i| {
                let rolling_back = matches!(i.state, TaskState::Failed | TaskState::Success);
                i.steps
                    .iter()
                    .flatten()
                    .filter(move |s| rolling_back || matches!(s.state, StepState::Running | StepState::Failed))
                    .map(move |s| format!("{}:{}", i.id, s.seq))
            })
            .collect();
        if keys.is_empty() {
            return;
        }
        // Items a live agent runs for these instances (this one too, as a
        // helper) are theirs, whatever host they share.
        let mut spare = std::collections::HashSet::new();
        if self.store.shared() {
            for i in found {
                let live = self.store.items_running_live(&i.id).await.unwrap_or_default();
                spare.extend(live.into_iter().map(|(seq, idx, label)| crate::steps::item_key(&i.id, seq, idx, &label)));
            }
        }
        let reap = move || crate::plugins::process::reap(&keys, &spare);
        let stopped = tokio::task::spawn_blocking(reap).await.unwrap_or_default();
        if !stopped.is_empty() {
            // The alert names the first few; the log line has them all.
            tracing::warn!(processes = %stopped.join(", "), "stopped leftover processes");
            let more = stopped.len().saturating_sub(10);
            let msg = format!(
                "stopped {} process(es) an earlier agent left running for steps it resumes: {}{}",
                stopped.len(),
                stopped.iter().take(10).cloned().collect::<Vec<_>>().join(", "),
                if more > 0 { format!(" and {more} more") } else { String::new() }
            );
            tracing::warn!("{msg}");
            let _ = self.store.alert(apollo_shared::protocol::AlertKind::LeftoverProcesses, &msg, None).await;
        }
    }
    /// Starts an executor for an instance this agent now holds; `first`, when
    /// its first step's start was committed with its claim.
    pub fn adopt(self: &Arc<Self>, inst: Claimed, first: Option<Box<FirstStart>>) {
        let (done, _) = watch::channel(false);
        let active =
            Arc::new(Active { token: CancellationToken::new(), why: Mutex::new(None), started: Instant::now(), done });
        {
            let mut map = self.active.lock().expect("active");
            if map.contains_key(&inst.id) {
                return;
            }
            map.insert(inst.id.clone(), active.clone());
        }
        let me = self.clone();
        self.tracker.spawn(async move {
            use futures::FutureExt;
            let id = inst.id.clone();
            // Plugin calls catch their own panics; one anywhere else in the
            // executor must not leave the instance RUNNING with nobody on it.
            // Boxed: the executor's future is kilobytes, and the task that
            // holds it inline is copied on each move into the runtime.
            let run = std::panic::AssertUnwindSafe(Box::pin(executor::run(&me, inst, first, &active))).catch_unwind();
            let stalled = match run.await {
                Ok(stalled) => stalled,
                Err(payload) => {
                    let said = crate::plugins::panic_message(payload.as_ref());
                    drop(payload);
                    me.executor_panicked(&id, &said).await;
                    false
                }
            };
            me.active.lock().expect("active").remove(&id);
            if stalled {
                me.stalled.lock().expect("stalled").push(id.clone());
            }
            let _ = active.done.send(true);
            // The freed slot is for what waits here; with nothing waiting
            // (the loop's last look found all it could run) no claim is made.
            if stalled || me.slots.backlog() {
                me.wake();
            }
        });
    }
    /// Ends an instance whose executor panicked outside a plugin call: FAILED
    /// with the panic's message (not rolled back: what the executor was doing
    /// is not known), and alerted.
    async fn executor_panicked(&self, id: &str, said: &str) {
        let msg = format!(
            "stopped: the executor panicked: {said} (a bug in the agent; the instance can be retried or rolled back)"
        );
        tracing::error!(task_id = %id, "{msg}");
        if let Err(e) = self.store.fail(id, &msg, crate::store::FailurePlan::Stop, self.store.agent()).await {
            tracing::warn!(task_id = %id, error = %e, "could not mark the instance FAILED");
        }
        let _ = self.store.alert(apollo_shared::protocol::AlertKind::PluginPanicked, &msg, Some(id)).await;
    }
}

impl crate::handles::Control for Arc<Scheduler> {
    fn wake(&self) {
        Scheduler::wake(self)
    }
    fn adopt(&self, inst: Claimed, first: Option<Box<FirstStart>>) {
        Scheduler::adopt(self, inst, first)
    }
    fn cancel(&self, id: &str, why: StopReason) -> Option<watch::Receiver<bool>> {
        Scheduler::cancel(self, id, why)
    }
    fn running(&self) -> usize {
        Scheduler::running(self)
    }
    fn is_shutting_down(&self) -> bool {
        Scheduler::is_shutting_down(self)
    }
    fn expected_secs(&self, def: &TaskDef) -> f64 {
        self.expected_for(def)
    }
    fn reserve(&self) -> Option<crate::store::ClaimTerms> {
        self.reserve_for_trigger()
    }
    fn release(&self) {
        self.release_for_trigger()
    }
    fn claim_release(&self) -> Option<Arc<tokio::sync::Notify>> {
        self.loop_claim_release()
    }
    fn serves(&self, queue: &str) -> bool {
        Scheduler::serves(self, queue)
    }
}

impl Scheduler {
    /// The handles the API, triggers and schedules hold.
    pub fn handles(self: &Arc<Self>) -> crate::handles::Handles {
        crate::handles::Handles {
            store: self.store.clone(),
            catalog: self.catalog.clone(),
            plugins: self.registry.clone(),
            settings: self.settings.clone(),
            data_dir: self.data_dir.clone(),
            control: Arc::new(self.clone()),
            clock_jumped: self.clock_jumped.clone(),
        }
    }
}
