//! A fan-out step (`foreach:`): its plugin once per item, batch after
//! batch, up to `max_parallel` items at once (never more than the agent's
//! concurrency), each item a ledger row of its own. An item whose SUCCESS
//! is recorded never runs again: a retry, a resume after a crash or a
//! takeover runs only the items that did not succeed. The failure budget
//! counts over the whole step: once failures pass it no further item
//! starts, the running ones finish, the rest are noted as not started, and
//! the step fails naming the failed items.

use crate::handles::StopReason;
use crate::plugins::{PluginError, Registration};
use crate::scheduler::approvals;
use crate::scheduler::items::Runner;
use crate::scheduler::{Active, Scheduler};
use crate::secrets::Secrets;
use crate::store::{FanoutPlan, ItemPlan, Offer, StoreError};
use apollo_shared::context::Context;
use apollo_shared::def::{Masker, TaskDef};
use apollo_shared::protocol::{Event, ItemRun};
use apollo_shared::state::StepState;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use serde_json::{json, Value};
use std::sync::Arc;

/// What one fan-out step needs of its instance.
pub(super) struct Step<'a> {
    pub id: &'a str,
    /// The instance's attempt (its gate's request is this attempt's).
    pub attempt: u32,
    pub seq: u32,
    pub def: &'a TaskDef,
    pub reg: &'a Registration,
    pub ctx: &'a Context,
    pub work_dir: &'a std::path::Path,
    pub active: &'a Active,
    pub masker: &'a Masker,
}

/// An item as it is shown and keyed: its text, or its JSON on one line.
pub fn label(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => apollo_shared::text::one_line(&other.to_string(), 80),
    }
}

/// How a fan-out step's run ended.
pub(super) enum Fanned {
    /// Its output, or why it failed.
    Ended(Result<Value, PluginError>),
    /// Parked at its gate (`approve_after_batch`) until it is decided.
    Parked,
}

/// Runs the step's items; the step's output, or why it failed, or its park
/// at its gate. A store error stops it (the items' rows say where it was).
pub(super) async fn run(s: &Arc<Scheduler>, st: Step<'_>) -> Result<Fanned, StoreError> {
    Ok(match batches(s, st).await? {
        Ok(Some(out)) => Fanned::Ended(Ok(out)),
        Ok(None) => Fanned::Parked,
        Err(e) => Fanned::Ended(Err(e)),
    })
}

/// [`run`]'s body: `Ok(None)` when it parked.
async fn batches(s: &Arc<Scheduler>, st: Step<'_>) -> Result<Result<Option<Value>, PluginError>, StoreError> {
    let d = &st.def.steps[st.seq as usize];
    let f = d.foreach.as_ref().expect("a fan-out step");
    let secrets = match crate::secrets::resolve(st.def) {
        Ok(x) => x,
        Err(e) => return Ok(Err(PluginError::permanent(e))),
    };
    let empty = || Ok(Ok(Some(output(&[], s.config().scheduler.step_output_bytes))));
    let mut items = s.store.items(st.id, st.seq).await?;
    let first = items.is_empty();
    let mut plan = match first {
        true => match first_plan(s, &st, &secrets).await? {
            Ok(Some((p, planned))) => {
                items = planned;
                p
            }
            Ok(None) => return empty(),
            Err(e) => return Ok(Err(e)),
        },
        false => {
            let batches = items.iter().map(|i| i.batch).max().unwrap_or(0);
            let budget = budget(f, items.len());
            FanoutPlan { items: items.len() as u32, batches, budget, batch: 0, round: 0 }
        }
    };
    // A life of the step: what an earlier one left RUNNING runs again
    // (but items a live agent still runs), each item is tried once.
    // Items of the step still running here (as a helper) are not interrupted.
    let keep = {
        let (hand, id, seq) = (s.in_hand.clone(), st.id.to_string(), st.seq);
        move |index| hand.has(&id, seq, index)
    };
    let interrupted;
    (plan.round, interrupted) = s.store.items_round(st.id, st.seq, plan, keep).await?;
    if !first && interrupted > 0 {
        items = s.store.items(st.id, st.seq).await?;
    }
    let runner = Runner {
        id: st.id.to_string(),
        seq: st.seq,
        d: Arc::new(d.clone()),
        name: f.name.clone(),
        reg: st.reg.clone(),
        base: Arc::new(st.ctx.to_value()),
        masker: st.masker.clone(),
        secrets: Arc::new(secrets),
        work_dir: st.work_dir.to_path_buf(),
        timeout: crate::timeouts::fixed(d, st.reg),
        token: st.active.token.clone(),
    };
    let ran = offered(s, &st, &runner, plan, &items).await;
    // Whatever happened, nothing more of the step is claimed.
    let closed = s.store.items_close(st.id, st.seq).await;
    let stopped = match ran? {
        Ran::Parked => return Ok(Ok(None)),
        Ran::Gated(why) => return Ok(Err(why)),
        Ran::Stopped => true,
        Ran::Through => false,
    };
    closed?;
    let shutting = s.is_shutting_down() && !st.active.token.is_cancelled();
    if stopped || st.active.token.is_cancelled() {
        if shutting {
            st.active.why.lock().expect("why").get_or_insert(StopReason::Shutdown);
        }
        return Ok(Err(PluginError::retryable("stopped before every item had run")));
    }
    let failed = s.store.items_failed_in(st.id, st.seq, plan.round).await?;
    if failed.len() as u32 > plan.budget {
        let why = format!(
            "not started: {} of {} items failed, over the failure budget of {}",
            failed.len(),
            plan.items,
            plan.budget
        );
        s.store.items_not_started(st.id, st.seq, &why).await?;
        let names: Vec<&str> = failed.iter().map(|(_, l)| l.as_str()).collect();
        return Ok(Err(PluginError::retryable(format!(
            "{} of {} items failed (budget {}): {}",
            failed.len(),
            plan.items,
            plan.budget,
            apollo_shared::text::one_line(&names.join(", "), 400)
        ))));
    }
    let items = s.store.items(st.id, st.seq).await?;
    Ok(Ok(Some(output(&items, s.config().scheduler.step_output_bytes))))
}

/// How the offered batches went.
enum Ran {
    /// Every batch ran (or the budget was spent).
    Through,
    /// A cancel or shutdown stopped it.
    Stopped,
    /// Parked at its gate.
    Parked,
    /// Its gate was refused (the items not started are noted).
    Gated(PluginError),
}

/// Offers the batches one after another, claiming and running items here
/// up to the step's parallel, and waits for those other agents run.
async fn offered(
    s: &Arc<Scheduler>,
    st: &Step<'_>,
    runner: &Runner,
    plan: FanoutPlan,
    items: &[ItemRun],
) -> Result<Ran, StoreError> {
    let d = &st.def.steps[st.seq as usize];
    let f = d.foreach.as_ref().expect("a fan-out step");
    let most = s.config().scheduler.concurrency().max(1) as usize;
    let shared = s.store.shared();
    // Other agents' items end here as events (the step's own agent wakes).
    let mut events = shared.then(|| s.store.bus().subscribe());
    let mut failed = 0u32;
    for batch in 1..=plan.batches {
        let of_batch: Vec<&ItemRun> = items.iter().filter(|i| i.batch == batch).collect();
        let todo = of_batch
            .iter()
            .filter(|i| !matches!(i.state, StepState::Success | StepState::RolledBack | StepState::Skipped))
            .count();
        if todo == 0 {
            continue;
        }
        if failed > plan.budget {
            break;
        }
        // The gate before the batches after its own: asked once the batch
        // it follows has ended (not when that batch is what fails).
        if f.gate.as_ref().is_some_and(|g| g.after + 1 == batch) {
            let counts = counts(&s.store.items(st.id, st.seq).await?, batch - 1);
            let step = (d.name.as_str(), st.seq);
            match approvals::batch_gate(s, (st.id, st.attempt), st.def, step, st.ctx, &counts).await? {
                approvals::BatchGate::Go => {}
                approvals::BatchGate::Parked => return Ok(Ran::Parked),
                approvals::BatchGate::Stop(why) => {
                    let why = st.masker.text(&why);
                    s.store.items_not_started(st.id, st.seq, &format!("not started: {why}")).await?;
                    let e = PluginError::permanent(format!("after batch {}: {why}", batch - 1));
                    return Ok(Ran::Gated(e));
                }
            }
        }
        // The step's parallel counts its items wherever they run; each
        // agent runs no more than its concurrency of them.
        let parallel = f.parallel(of_batch.len()).max(1);
        let here = parallel.min(most);
        let first = of_batch.iter().map(|i| i.index).min().unwrap_or(0);
        let last = of_batch.iter().map(|i| i.index).max().unwrap_or(0);
        let offer = Offer { batch, first, last, parallel: if shared { parallel } else { here } as u32 };
        s.store.items_offer(st.id, st.seq, FanoutPlan { batch, ..plan }, offer, todo).await?;
        let mut running = FuturesUnordered::new();
        // Items whose agent stopped answering are looked for now and then.
        let mut look = tokio::time::interval(OTHERS_LOOKED_AT);
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let mut stopped = false;
            // Every free place claimed in one write: the items start
            // together, not one commit after another.
            if running.len() < here {
                if st.active.token.is_cancelled() || s.is_shutting_down() {
                    stopped = true;
                } else {
                    for it in runner.claim(s, here - running.len()).await? {
                        running.push(runner.run(s, it));
                    }
                }
            }
            if stopped && running.is_empty() {
                return Ok(Ran::Stopped);
            }
            if running.is_empty() {
                // Nothing to claim here: the batch has ended unless other
                // agents still run items of it.
                let Some(ev) = events.as_mut() else { break };
                let now = s.store.items_offer_now(st.id, st.seq).await?.unwrap_or_default();
                failed = now.failed;
                if now.running == 0 {
                    break;
                }
                tokio::select! {
                    _ = changed(ev, st.id) => {}
                    _ = look.tick() => {
                        s.store.items_interrupt_dead(st.id, st.seq, 0).await?;
                    }
                    _ = st.active.token.cancelled() => {}
                }
                continue;
            }
            let outside = async {
                match events.as_mut() {
                    Some(ev) => changed(ev, st.id).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ended = running.next() => {
                    if ended.expect("an item runs")?.is_some() {
                        failed += 1;
                    }
                    // And every other that has ended by now: their places
                    // are claimed together.
                    while let Some(Some(ended)) = running.next().now_or_never() {
                        if ended?.is_some() {
                            failed += 1;
                        }
                    }
                }
                // An item ended elsewhere: room to claim another.
                _ = outside, if !stopped => {}
                _ = look.tick(), if shared => {
                    s.store.items_interrupt_dead(st.id, st.seq, running.len() as u32).await?;
                }
            }
        }
        if shared {
            failed = s.store.items_offer_now(st.id, st.seq).await?.unwrap_or_default().failed;
        }
    }
    Ok(Ran::Through)
}

/// How often the step's own agent looks at items other agents run (one
/// whose agent stopped answering is offered again).
const OTHERS_LOOKED_AT: std::time::Duration = std::time::Duration::from_millis(500);

/// Until an event about instance `id` (or events were missed).
async fn changed(events: &mut tokio::sync::broadcast::Receiver<Arc<Event>>, id: &str) {
    loop {
        match events.recv().await {
            Ok(ev) if ev.data.instance() == Some(id) => return,
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return,
            Err(_) => std::future::pending().await,
        }
    }
}

/// How the batches up to `last` went, for the gate's message.
fn counts(items: &[ItemRun], last: u32) -> String {
    let so_far: Vec<&ItemRun> = items.iter().filter(|i| i.batch <= last).collect();
    let ok = so_far.iter().filter(|i| i.state == StepState::Success).count();
    let failed: Vec<&str> = so_far.iter().filter(|i| i.state == StepState::Failed).map(|i| i.label.as_str()).collect();
    let mut said = format!("batches 1-{last}: {ok} of {} items ok", so_far.len());
    if last == 1 {
        said = format!("batch 1: {ok} of {} items ok", so_far.len());
    }
    if !failed.is_empty() {
        said.push_str(&format!(", failed: {}", apollo_shared::text::one_line(&failed.join(", "), 200)));
    }
    said
}

fn budget(f: &apollo_shared::def::Fanout, n: usize) -> u32 {
    f.max_failures.of_budget(n) as u32
}

/// The items rendered and recorded at the step's first start: its plan
/// and the items as recorded (all PENDING), `None` for an empty list, or
/// why the list cannot be run.
async fn first_plan(
    s: &Arc<Scheduler>,
    st: &Step<'_>,
    secrets: &Secrets,
) -> Result<Result<Option<(FanoutPlan, Vec<ItemRun>)>, PluginError>, StoreError> {
    let f = st.def.steps[st.seq as usize].foreach.as_ref().expect("a fan-out step");
    let list = match crate::steps::items(st.def, st.seq, st.ctx, secrets) {
        Ok(l) => l,
        Err(e) => return Ok(Err(e)),
    };
    let max = s.config().scheduler.max_items;
    if list.len() > max {
        let msg = format!("foreach: {} items is more than scheduler.max_items ({max}) allows", list.len());
        return Ok(Err(PluginError::permanent(msg)));
    }
    let sizes = match f.plan(list.len()) {
        Ok(s) => s,
        Err(e) => return Ok(Err(PluginError::permanent(e))),
    };
    let mut plans = Vec::with_capacity(list.len());
    for (b, size) in sizes.iter().enumerate() {
        for v in list.iter().skip(plans.len()).take(*size) {
            plans.push(ItemPlan { label: st.masker.text(&label(v)), value: st.masker.value(v), batch: b as u32 + 1 });
        }
    }
    let plan = FanoutPlan {
        items: list.len() as u32,
        batches: sizes.len() as u32,
        budget: budget(f, list.len()),
        batch: 0,
        round: 0,
    };
    let recorded: Vec<ItemRun> = plans
        .iter()
        .enumerate()
        .map(|(i, p)| ItemRun {
            index: i as u32,
            label: p.label.clone(),
            value: p.value.clone(),
            batch: p.batch,
            state: StepState::Pending,
            attempts: 0,
            params: None,
            output: None,
            error: None,
            started_at: None,
            finished_at: None,
            done: None,
            history: Vec::new(),
            holder: None,
        })
        .collect();
    s.store.items_plan(st.id, st.seq, plans, plan).await?;
    Ok(Ok((!list.is_empty()).then_some((plan, recorded))))
}

/// The step's output: each item's output in list order (null where it did
/// not succeed), the labels of the failed ones, and the counts. Item
/// outputs that would pass the step's output limit are left out (each
/// item keeps its own in the store).
fn output(items: &[ItemRun], limit: usize) -> Value {
    let failed: Vec<&str> = items.iter().filter(|i| i.state == StepState::Failed).map(|i| i.label.as_str()).collect();
    let ok = items.iter().filter(|i| i.state == StepState::Success).count();
    let outputs: Vec<Value> = items
        .iter()
        .map(|i| if i.state == StepState::Success { i.output.clone().unwrap_or(Value::Null) } else { Value::Null })
        .collect();
    let skipped: Vec<&str> = items.iter().filter(|i| i.state == StepState::Skipped).map(|i| i.label.as_str()).collect();
    let mut full = json!({"items": outputs, "failed": failed, "ok": ok, "total": items.len()});
    if !skipped.is_empty() {
        full["skipped"] = json!(skipped);
    }
    if serde_json::to_vec(&full).map_or(usize::MAX, |v| v.len()) <= limit {
        return full;
    }
    json!({
        "items": Value::Null,
        "failed": failed,
        "ok": ok,
        "total": items.len(),
        "note": format!("the items' outputs pass the {limit} byte limit of a step's output: each is kept with its item (apollo show ID --items)")
    })
}
