//! A fan-out step's items as they run, here or on any agent of a shared
//! store. The agent that holds the instance runs the step (`executor/
//! fanout.rs`): it offers batch after batch and claims items like every
//! other agent. Any agent with a free slot that can run the step — its
//! definition version known, its plugin resolved under the instance's
//! rollout arms, its queue served — claims items of an offer too, one claim
//! per item, and runs them as the step's own agent would: the same
//! rendering, secrets (read here), masking, timeout and idempotency key.
//! Its log is kept where it ran (the item's `holder` says where).

use super::calls::watchdog;
use super::state::{noted, Held, Helping, InHand};
use super::Scheduler;
use crate::logs::StepLog;
use crate::plugins::{Call, CallContext, PluginError, Registration};
use crate::secrets::Secrets;
use crate::steps::ItemCall;
use crate::store::{ClaimedItem, Open, StoreError};
use apollo_shared::context::Context;
use apollo_shared::def::{Masker, StepDef};
use apollo_shared::protocol::{EventData, Instance};
use apollo_shared::state::TaskState;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Numbers the helpers.
static HELPERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// An item's call as its claim rendered it, and its context; the item is
/// in hand as long as this lives.
pub(super) struct Rendered {
    call: Result<ItemCall, PluginError>,
    over: Value,
    held: Held,
}

/// An item claimed, its call rendered in the claim.
pub(super) type Claimed = ClaimedItem<Rendered>;

/// What runs the items of one step on this agent.
pub(super) struct Runner {
    pub id: String,
    pub seq: u32,
    pub d: Arc<StepDef>,
    /// The item's name in templates (`as:`).
    pub name: String,
    pub reg: Registration,
    /// The instance's context as a value (each item's is this and the item).
    pub base: Arc<Value>,
    pub secrets: Arc<Secrets>,
    pub masker: Masker,
    pub work_dir: PathBuf,
    pub timeout: crate::timeouts::Applied,
    /// Fires to stop the items running (a cancel, shutdown's last word).
    pub token: CancellationToken,
}

impl Runner {
    /// The item's context: the instance's, and the item under its name.
    fn over(base: &Value, name: &str, item: &Value) -> Value {
        let mut over = base.clone();
        if let Value::Object(o) = &mut over {
            o.insert(name.to_string(), item.clone());
        }
        over
    }

    /// What the claim's write calls to make the claimed item's call and the
    /// params recorded with it (its secrets masked); it puts the item in
    /// `hand`, before the claim commits.
    fn render(&self, hand: InHand) -> impl Fn(u32, &Value) -> (Option<String>, Rendered) + Send + Sync + 'static {
        let (d, base, secrets, masker, name) =
            (self.d.clone(), self.base.clone(), self.secrets.clone(), self.masker.clone(), self.name.clone());
        let (id, seq) = (self.id.clone(), self.seq);
        move |index, item| {
            let over = Self::over(&base, &name, item);
            let call = crate::steps::item_call(&d, &over, &secrets);
            let recorded = match &call {
                Ok((p, _)) => masker.value(&Value::Object(p.clone())).to_string(),
                Err(_) => "null".to_string(),
            };
            (Some(recorded), Rendered { call, over, held: hand.take(&id, seq, index) })
        }
    }

    /// Claims up to `most` items for this agent in one write (none: none
    /// to take now).
    pub async fn claim(&self, s: &Scheduler, most: usize) -> Result<Vec<Claimed>, StoreError> {
        s.store.item_claim(&self.id, self.seq, most, self.render(s.in_hand.clone())).await
    }

    /// Runs a claimed item: its call, its end, recorded. `Some` (index,
    /// label) when it failed.
    pub async fn run(&self, s: &Scheduler, it: Claimed) -> Result<Option<(u32, String)>, StoreError> {
        let d = &self.d;
        let path = StepLog::item_path(&s.data_dir, &self.id, self.seq, it.index);
        let log = StepLog::new(path, s.config().logging.step_log_bytes);
        let heading = format!("[apollo: step {}, item {} ({}), attempt {}]", d.name, it.index, it.label, it.attempts);
        match it.attempts {
            1 => log.opening(&heading),
            _ => log.line(&heading),
        }
        log.mask(self.masker.clone());
        // In hand until its end is written.
        let Rendered { call, over, held: _held } = it.call;
        let result = async {
            let (params, env) = call?;
            crate::steps::validate_item(&self.reg, &params).await?;
            let key = crate::steps::item_key(&self.id, self.seq, it.index, &it.label);
            let token = self.token.child_token();
            let c = Call {
                params: &params,
                context: &CallContext::made(&over),
                idempotency_key: &key,
                work_dir: &self.work_dir,
                tasks_dir: &s.tasks_dir,
                previous: None,
                step: &d.name,
                attempt: it.attempts,
                env: &env,
                log: &log,
                cancel: token.clone(),
                kill_grace: s.config().scheduler.kill_grace,
            };
            let call = (self.reg.name.as_str(), self.reg.plugin.execute(c));
            watchdog(s, (self.timeout.timeout, &self.timeout.basis), &token, Some(&self.token), call, "").await
        }
        .await;
        Ok(match result {
            Ok(out) => {
                s.store.item_end(&self.id, self.seq, (it.index, it.round), Ok(&self.masker.value(&out))).await?;
                None
            }
            Err(e) => {
                let msg = self.masker.text(&e.message);
                s.store.item_end(&self.id, self.seq, (it.index, it.round), Err(&msg)).await?;
                tracing::warn!(step = %d.name, item = %it.label, "item failed: {msg}");
                Some((it.index, it.label))
            }
        })
    }
}

impl Scheduler {
    /// Fills free slots with items other agents' fan-out steps offer
    /// (shared stores only): a helper per slot, each claiming and running
    /// items of one offer until it has none left to give.
    pub(super) async fn help(self: &Arc<Self>) {
        if !self.store.shared() {
            return;
        }
        let free = self.reserve_slots(usize::MAX);
        if free == 0 {
            return;
        }
        let offers = noted(self.store.items_open().await, &self.failing.claim).unwrap_or_default();
        let mut left = free;
        for o in offers.iter().filter(|o| self.serves(&o.queue)) {
            for _ in 0..(o.room as usize).min(left) {
                let token = CancellationToken::new();
                let key = HELPERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.helping.lock().expect("helping").push(Helping { key, token: token.clone() });
                let (me, o) = (self.clone(), o.clone());
                self.tracker.spawn(async move {
                    let ran = me.help_with(&o, token).await;
                    me.helping.lock().expect("helping").retain(|h| h.key != key);
                    match ran {
                        // A slot freed after work: the loop looks for more.
                        Ok(n) if n > 0 => me.wake(),
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(task_id = %o.id, error = %e, "stopped running items of step {}", o.seq)
                        }
                    }
                });
                left -= 1;
            }
        }
        self.release_slots(free);
    }

    /// What runs the offered step's items here, or `None` when this agent
    /// cannot run them (the version unknown, the plugin not resolved).
    async fn runner_for(&self, o: &Open, token: CancellationToken) -> Result<Option<Runner>, StoreError> {
        let Ok(def) = self.def_for(&o.def_hash).await else { return Ok(None) };
        let Some(d) = def.steps.get(o.seq as usize) else { return Ok(None) };
        let Some(f) = d.foreach.as_ref() else { return Ok(None) };
        let inst: Instance = self.store.instance_for_items(&o.id).await?;
        if inst.state != TaskState::Running {
            return Ok(None);
        }
        let Ok(reg) = crate::steps::registration(&self.registry.view(inst.pins.as_ref()), &def, o.seq) else {
            return Ok(None);
        };
        let Ok(secrets) = crate::secrets::resolve(&def) else { return Ok(None) };
        let mut ctx = Context::of(&inst);
        ctx.attempt = inst.attempt;
        let work_dir = PathBuf::from(&ctx.work_dir);
        if reg.plugin.uses_work_dir() {
            let _ = std::fs::create_dir_all(&work_dir);
        }
        Ok(Some(Runner {
            id: o.id.clone(),
            seq: o.seq,
            name: f.name.clone(),
            timeout: crate::timeouts::fixed(d, &reg),
            d: Arc::new(d.clone()),
            reg,
            base: Arc::new(ctx.to_value()),
            masker: secrets.masker.clone(),
            secrets: Arc::new(secrets),
            work_dir,
            token,
        }))
    }

    /// A helper: claims and runs the offer's items one after another until
    /// none is left to it; stops them when the instance stops running.
    /// How many items it ran.
    async fn help_with(self: &Arc<Self>, o: &Open, token: CancellationToken) -> Result<u32, StoreError> {
        let Some(runner) = self.runner_for(o, token.clone()).await? else { return Ok(0) };
        let mut events = self.store.bus().subscribe();
        let id = o.id.clone();
        let ended = CancellationToken::new();
        let watch = {
            let (token, ended) = (token.clone(), ended.clone());
            tokio::spawn(async move {
                loop {
                    let ev = tokio::select! {
                        e = events.recv() => e,
                        _ = ended.cancelled() => return,
                    };
                    match ev {
                        Ok(ev) => match &ev.data {
                            EventData::InstanceUpdated { id: i, state, .. }
                                if *i == id && *state != TaskState::Running =>
                            {
                                token.cancel();
                                return;
                            }
                            _ => {}
                        },
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(_) => return,
                    }
                }
            })
        };
        let result = async {
            let mut ran = 0;
            while !self.is_shutting_down() && !token.is_cancelled() {
                let Some(it) = runner.claim(self, 1).await?.pop() else { break };
                let done = runner.run(self, it).await;
                ran += 1;
                match done {
                    Ok(_) => {}
                    // Interrupted meanwhile (this agent looked gone): another runs it.
                    Err(StoreError::Invalid(e)) => tracing::warn!(task_id = %o.id, "{e}"),
                    Err(e) => return Err(e),
                }
            }
            Ok(ran)
        }
        .await;
        ended.cancel();
        let _ = watch.await;
        result
    }
}
