//! A rollback: the failed step, then every succeeded step, in reverse
//! order, each through its plugin's rollback under the step's fixed
//! timeout; the first that fails leaves the instance FAILED with an alert.

use super::calls::watchdog;
use super::state::finished;
use super::Scheduler;
use crate::logs::StepLog;
use crate::plugins::{Call, CallContext};
use crate::steps::{prepare, registration, step_env};
use crate::store::StoreError;
use apollo_shared::context::Context;
use apollo_shared::def::TaskDef;
use apollo_shared::state::{StepState, TaskState};
use serde_json::Value;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Rolls back the failed step, then every succeeded step, in reverse order.
pub(super) async fn rollback(
    s: &Arc<Scheduler>,
    id: &str,
    def: &TaskDef,
    ctx: &Context,
    work_dir: &std::path::Path,
) -> Result<(), StoreError> {
    let inst = s.store.get(id).await?;
    let steps = inst.steps.unwrap_or_default();
    crate::metrics::get().rollbacks.get_or_create(&crate::metrics::label("task", &def.task)).inc();
    tracing::info!("rolling back");
    for step in steps.iter().rev().filter(|st| matches!(st.state, StepState::Success | StepState::Failed)) {
        let d = &def.steps[step.seq as usize];
        if d.task.is_some() {
            // A sub-runbook: its child is rolled back, in full.
            if let Err(msg) = Box::pin(undo_child(s, id, step.seq, &d.name)).await? {
                tracing::error!("{msg}");
                s.store.step_note_error(id, step.seq, &msg).await?;
                s.store.rollback_failed(id, &msg).await?;
                finished(&def.task, TaskState::Failed);
                return Ok(());
            }
            s.store.step_rolled_back(id, step.seq).await?;
            continue;
        }
        if d.foreach.is_some() {
            // A fan-out step: its items that succeeded, last ended first.
            if let Err(msg) = Box::pin(undo_items(s, (id, inst.pins.as_ref()), def, step.seq, ctx, work_dir)).await? {
                tracing::error!("{msg}");
                s.store.step_note_error(id, step.seq, &msg).await?;
                s.store.rollback_failed(id, &msg).await?;
                finished(&def.task, TaskState::Failed);
                return Ok(());
            }
            s.store.step_rolled_back(id, step.seq).await?;
            tracing::info!(step = %d.name, "fan-out step rolled back");
            continue;
        }
        let log = StepLog::new(StepLog::path_for(&s.data_dir, id, step.seq), s.config().logging.step_log_bytes);
        log.line(&format!("[apollo: rollback of step {}]", d.name));
        // The secrets' values, which the recorded params have masked.
        let secrets = crate::secrets::resolve(def);
        let mask = secrets.as_ref().map(|s| s.masker.clone()).unwrap_or_else(|_| crate::secrets::masker(def));
        log.mask(mask.clone());
        let result = match (registration(&s.registry.view(inst.pins.as_ref()), def, step.seq), secrets) {
            (Err(e), _) => Err(e),
            (_, Err(e)) => Err(crate::plugins::PluginError::permanent(e)),
            (Ok(reg), Ok(secrets)) => {
                let params = match &step.params {
                    Some(Value::Object(p)) if secrets.values.is_none() => p.clone(),
                    _ => prepare(&reg, &d.params, ctx, &secrets).await.unwrap_or_default(),
                };
                let env = step_env(&d.env, ctx, &secrets).unwrap_or_default();
                let key = format!("{id}:{}", step.seq);
                let context = CallContext::of(ctx);
                let token = CancellationToken::new();
                let call = Call {
                    params: &params,
                    context: &context,
                    idempotency_key: &key,
                    work_dir,
                    tasks_dir: &s.tasks_dir,
                    previous: None,
                    step: &d.name,
                    attempt: step.attempts,
                    env: &env,
                    log: &log,
                    cancel: token.clone(),
                    kill_grace: s.config().scheduler.kill_grace,
                };
                // A rollback is not the work its runs measured: the fixed timeout.
                let timeout = crate::timeouts::fixed(d, &reg);
                let call = (reg.name.as_str(), reg.plugin.rollback(call, step.output.as_ref()));
                watchdog(s, (timeout.timeout, &timeout.basis), &token, None, call, "rollback ").await
            }
        };
        match result {
            Ok(()) => {
                s.store.step_rolled_back(id, step.seq).await?;
                crate::crash_point!("executor.during_rollback");
                tracing::info!(step = %d.name, "step rolled back");
            }
            Err(e) => {
                let msg = mask.text(&format!("rollback of step {:?} (#{}) failed: {}", d.name, step.seq, e.message));
                tracing::error!("{msg}");
                s.store.step_note_error(id, step.seq, &msg).await?;
                s.store.rollback_failed(id, &msg).await?;
                finished(&def.task, TaskState::Failed);
                return Ok(());
            }
        }
    }
    s.store.finish_rolled_back(id).await?;
    finished(&def.task, TaskState::RolledBack);
    tracing::info!("instance rolled back");
    Ok(())
}

/// Undoes a fan-out step's items that succeeded, in reverse order of their
/// ending, each through the plugin's rollback with its own params and
/// output; the first that fails stops the rollback (`Err`: why, naming it).
async fn undo_items(
    s: &Arc<Scheduler>,
    (id, pins): (&str, Option<&apollo_shared::protocol::Pins>),
    def: &TaskDef,
    seq: u32,
    ctx: &Context,
    work_dir: &std::path::Path,
) -> Result<Result<(), String>, StoreError> {
    let d = &def.steps[seq as usize];
    let f = d.foreach.as_ref().expect("a fan-out step");
    let mut done: Vec<_> =
        s.store.items(id, seq).await?.into_iter().filter(|i| i.state == StepState::Success).collect();
    done.sort_by_key(|i| std::cmp::Reverse(i.done));
    let reg = match registration(&s.registry.view(pins), def, seq) {
        Ok(r) => r,
        Err(e) => return Ok(Err(format!("rollback of step {:?} (#{seq}) failed: {}", d.name, e.message))),
    };
    let secrets = crate::secrets::resolve(def);
    let mask = secrets.as_ref().map(|s| s.masker.clone()).unwrap_or_else(|_| crate::secrets::masker(def));
    let base = ctx.to_value();
    for it in done {
        let log = StepLog::new(StepLog::item_path(&s.data_dir, id, seq, it.index), s.config().logging.step_log_bytes);
        log.line(&format!("[apollo: rollback of step {}, item {} ({})]", d.name, it.index, it.label));
        log.mask(mask.clone());
        let mut over = base.clone();
        if let Value::Object(o) = &mut over {
            o.insert(f.name.clone(), it.value.clone());
        }
        let result = match &secrets {
            Err(e) => Err(crate::plugins::PluginError::permanent(e.clone())),
            Ok(secrets) => match crate::steps::item_call(d, &over, secrets) {
                Err(e) => Err(e),
                Ok((rendered, env)) => {
                    // The params the item ran with, as recorded (unless masked secrets are in them).
                    let params = match (&it.params, secrets.values.is_none()) {
                        (Some(Value::Object(p)), true) => p.clone(),
                        _ => rendered,
                    };
                    // The key its execute had.
                    let key = crate::steps::item_key(id, seq, it.index, &it.label);
                    let token = CancellationToken::new();
                    let call = Call {
                        params: &params,
                        context: &CallContext::made(&over),
                        idempotency_key: &key,
                        work_dir,
                        tasks_dir: &s.tasks_dir,
                        previous: None,
                        step: &d.name,
                        attempt: it.attempts,
                        env: &env,
                        log: &log,
                        cancel: token.clone(),
                        kill_grace: s.config().scheduler.kill_grace,
                    };
                    let timeout = crate::timeouts::fixed(d, &reg);
                    let call = (reg.name.as_str(), reg.plugin.rollback(call, it.output.as_ref()));
                    watchdog(s, (timeout.timeout, &timeout.basis), &token, None, call, "rollback ").await
                }
            },
        };
        match result {
            Ok(()) => {
                s.store.item_rolled_back(id, seq, it.index, None).await?;
                crate::crash_point!("executor.during_rollback");
            }
            Err(e) => {
                let msg = mask.text(&format!(
                    "rollback of step {:?} (#{seq}) item {} ({}) failed: {}",
                    d.name, it.index, it.label, e.message
                ));
                s.store.item_rolled_back(id, seq, it.index, Some(&msg)).await?;
                return Ok(Err(msg));
            }
        }
    }
    Ok(Ok(()))
}

/// Rolls back step `seq`'s child instance (run here, as an operator's
/// rollback would be) and waits for it; `Err`: why it is not undone.
async fn undo_child(s: &Arc<Scheduler>, id: &str, seq: u32, name: &str) -> Result<Result<(), String>, StoreError> {
    let Some(child) = s.store.child(id, seq).await? else { return Ok(Ok(())) };
    let failed =
        |why: String| Ok(Err(format!("rollback of step {name:?} (#{seq}): child instance {} {why}", child.id)));
    match child.state {
        TaskState::RolledBack => return Ok(Ok(())),
        TaskState::Success | TaskState::Failed if child.ended() => {}
        other => return failed(format!("is {} and cannot be rolled back now", other.as_str())),
    }
    let lease = s.config().scheduler.lease;
    let why = format!("its parent {id} is rolled back");
    if let Err(e) = s.store.manual_rollback(&child.id, lease, &why, s.store.agent()).await {
        return failed(format!("could not be rolled back: {e}"));
    }
    s.adopt(s.store.get(&child.id).await?, None);
    let done = s.active.lock().expect("active").get(&child.id).map(|a| a.done.subscribe());
    if let Some(mut done) = done {
        let _ = done.wait_for(|d| *d).await;
    }
    let after = s.store.get(&child.id).await?;
    match after.state {
        TaskState::RolledBack => Ok(Ok(())),
        _ => failed(format!("ended {}: {}", after.state.as_str(), after.error.as_deref().unwrap_or("no error"))),
    }
}
