//! A fan-out step (`foreach:`): its plugin once per item, batch after
//! batch, up to `max_parallel` items at once (never more than the agent's
//! concurrency), each item a ledger row of its own. An item whose SUCCESS
//! is recorded never runs again: a retry, a resume after a crash or a
//! takeover runs only the items that did not succeed. The failure budget
//! counts over the whole step: once failures pass it no further item
//! starts, the running ones finish, the rest are noted as not started, and
//! the step fails naming the failed items.

use crate::handles::StopReason;
use crate::logs::StepLog;
use crate::plugins::{Call, PluginError, Registration};
use crate::scheduler::approvals;
use crate::scheduler::calls::watchdog;
use crate::scheduler::{Active, Scheduler};
use crate::secrets::Secrets;
use crate::store::{FanoutPlan, ItemPlan, StoreError};
use apollo_shared::context::Context;
use apollo_shared::def::{Masker, TaskDef};
use apollo_shared::protocol::ItemRun;
use apollo_shared::state::StepState;
use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU32, Ordering};
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
    let plan = match items.is_empty() {
        true => match first_plan(s, &st, &secrets).await? {
            Ok(Some(p)) => {
                items = s.store.items(st.id, st.seq).await?;
                p
            }
            Ok(None) => return empty(),
            Err(e) => return Ok(Err(e)),
        },
        false => {
            // Items an earlier life of the step left RUNNING run again.
            if items.iter().any(|i| i.state == StepState::Running) {
                s.store.items_interrupted(st.id, st.seq).await?;
                items = s.store.items(st.id, st.seq).await?;
            }
            let batches = items.iter().map(|i| i.batch).max().unwrap_or(0);
            FanoutPlan { items: items.len() as u32, batches, budget: budget(f, items.len()), batch: 0 }
        }
    };
    let done = AtomicU32::new(items.iter().filter_map(|i| i.done).max().map_or(0, |d| d + 1));
    let base = st.ctx.to_value();
    let timeout = crate::timeouts::fixed(d, st.reg);
    let most = s.config().scheduler.concurrency().max(1) as usize;
    let (mut failed, mut stopped) = (Vec::<(u32, String)>::new(), false);
    for batch in 1..=plan.batches {
        let todo: Vec<&ItemRun> = items
            .iter()
            .filter(|i| {
                i.batch == batch && !matches!(i.state, StepState::Success | StepState::RolledBack | StepState::Skipped)
            })
            .collect();
        if todo.is_empty() {
            continue;
        }
        if failed.len() as u32 > plan.budget || stopped {
            break;
        }
        // The gate before the batches after its own: asked once the batch
        // it follows has ended (not when that batch is what fails).
        if f.gate.as_ref().is_some_and(|g| g.after + 1 == batch) {
            let counts = counts(&s.store.items(st.id, st.seq).await?, batch - 1);
            let step = (d.name.as_str(), st.seq);
            match approvals::batch_gate(s, (st.id, st.attempt), st.def, step, st.ctx, &counts).await? {
                approvals::BatchGate::Go => {}
                approvals::BatchGate::Parked => return Ok(Ok(None)),
                approvals::BatchGate::Stop(why) => {
                    let why = st.masker.text(&why);
                    s.store.items_not_started(st.id, st.seq, &format!("not started: {why}")).await?;
                    return Ok(Err(PluginError::permanent(format!("after batch {}: {why}", batch - 1))));
                }
            }
        }
        let size = items.iter().filter(|i| i.batch == batch).count();
        s.store.items_batch(st.id, st.seq, FanoutPlan { batch, ..plan }, todo.len()).await?;
        let parallel = f.parallel(size).min(most).max(1);
        let mut next = todo.into_iter();
        let mut running = FuturesUnordered::new();
        loop {
            while running.len() < parallel && !stopped && failed.len() as u32 <= plan.budget {
                if st.active.token.is_cancelled() || s.is_shutting_down() {
                    stopped = true;
                    break;
                }
                let Some(it) = next.next() else { break };
                running.push(item(s, &st, &secrets, &base, it, &timeout, &done));
            }
            let Some(ended) = running.next().await else { break };
            if let Some(e) = ended? {
                failed.push(e);
            }
        }
    }
    let shutting = s.is_shutting_down() && !st.active.token.is_cancelled();
    if stopped || st.active.token.is_cancelled() {
        if shutting {
            st.active.why.lock().expect("why").get_or_insert(StopReason::Shutdown);
        }
        return Ok(Err(PluginError::retryable("stopped before every item had run")));
    }
    failed.sort();
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

/// The items rendered and recorded at the step's first start: its plan,
/// `None` for an empty list, or why the list cannot be run.
async fn first_plan(
    s: &Arc<Scheduler>,
    st: &Step<'_>,
    secrets: &Secrets,
) -> Result<Result<Option<FanoutPlan>, PluginError>, StoreError> {
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
    let plan =
        FanoutPlan { items: list.len() as u32, batches: sizes.len() as u32, budget: budget(f, list.len()), batch: 0 };
    s.store.items_plan(st.id, st.seq, plans, plan).await?;
    Ok(Ok((!list.is_empty()).then_some(plan)))
}

/// Runs one item: its start, its call, its end, each recorded. `Some`
/// (index, label) when it failed.
async fn item(
    s: &Arc<Scheduler>,
    st: &Step<'_>,
    secrets: &Secrets,
    base: &Value,
    it: &ItemRun,
    timeout: &crate::timeouts::Applied,
    done: &AtomicU32,
) -> Result<Option<(u32, String)>, StoreError> {
    let d = &st.def.steps[st.seq as usize];
    let f = d.foreach.as_ref().expect("a fan-out step");
    let mut over = base.clone();
    if let Value::Object(o) = &mut over {
        o.insert(f.name.clone(), it.value.clone());
    }
    let call = crate::steps::item_call(d, &over, secrets);
    let recorded = match &call {
        Ok((p, _)) => st.masker.value(&Value::Object(p.clone())),
        Err(_) => Value::Null,
    };
    let attempt = s.store.item_start(st.id, st.seq, it.index, &recorded).await?;
    let log = StepLog::new(StepLog::item_path(&s.data_dir, st.id, st.seq, it.index), s.config().logging.step_log_bytes);
    let heading = format!("[apollo: step {}, item {} ({}), attempt {attempt}]", d.name, it.index, it.label);
    match attempt {
        1 => log.opening(&heading),
        _ => log.line(&heading),
    }
    log.mask(st.masker.clone());
    let result = async {
        let (params, env) = call?;
        crate::steps::validate_item(st.reg, &params).await?;
        let key = crate::steps::item_key(st.id, st.seq, it.index, &it.label);
        let token = st.active.token.child_token();
        let c = Call {
            params: &params,
            context: &over,
            idempotency_key: &key,
            work_dir: st.work_dir,
            tasks_dir: &s.tasks_dir,
            previous: None,
            step: &d.name,
            attempt,
            env: &env,
            log: &log,
            cancel: token.clone(),
            kill_grace: s.config().scheduler.kill_grace,
        };
        let call = (st.reg.name.as_str(), st.reg.plugin.execute(c));
        watchdog(s, (timeout.timeout, &timeout.basis), &token, Some(&st.active.token), call, "").await
    }
    .await;
    let order = done.fetch_add(1, Ordering::Relaxed);
    let ended = match result {
        Ok(out) => {
            s.store.item_end(st.id, st.seq, it.index, Ok(&st.masker.value(&out)), order).await?;
            None
        }
        Err(e) => {
            let msg = st.masker.text(&e.message);
            s.store.item_end(st.id, st.seq, it.index, Err(&msg), order).await?;
            tracing::warn!(step = %d.name, item = %it.label, "item failed: {msg}");
            Some((it.index, it.label.clone()))
        }
    };
    Ok(ended)
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
