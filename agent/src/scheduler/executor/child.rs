//! A sub-runbook's step (`task: NAME`) in the executor: before the step
//! starts, its child instance is looked up by its key. None yet: it is
//! created (with the step's params, rendered) and the parent parked until
//! it ends — holding no slot, as an approval waits. Under way: parked
//! again. Ended: the step runs with the child's outcome as its own (its
//! steps' outputs on SUCCESS; its error on FAILED). A retry of a parent
//! whose step failed with its child retries that child, from its failed
//! step: what the child did is never done twice.

use crate::plugins::PluginError;
use crate::scheduler::Scheduler;
use crate::steps::ready;
use crate::store::{child_key, StoreError};
use apollo_shared::context::Context;
use apollo_shared::def::TaskDef;
use apollo_shared::protocol::{Instance, Pins, StepRun};
use apollo_shared::state::{StepState, TaskState};
use serde_json::{json, Value};
use std::sync::Arc;

pub(super) enum Gate {
    /// The parent waits for its child: the executor ends.
    Parked,
    /// The child ended: the step's outcome.
    Ended(Result<Value, PluginError>),
}

/// What the step records of its ended child.
fn outcome(c: &Instance) -> Result<Value, PluginError> {
    let named = format!("child instance {} (task {})", c.id, c.task);
    match c.state {
        TaskState::Success => Ok(json!({
            "instance": c.id,
            "task": c.task,
            "state": c.state.as_str(),
            "steps": c.context.get("steps").cloned().unwrap_or(Value::Null),
        })),
        TaskState::RolledBack => Err(PluginError::permanent(format!("{named} was rolled back"))),
        _ => Err(PluginError::permanent(format!(
            "{named} ended {}: {}",
            c.state.as_str(),
            c.error.as_deref().unwrap_or("no error recorded")
        ))),
    }
}

pub(super) async fn gate(
    s: &Arc<Scheduler>,
    (id, pins): (&str, Option<&Pins>),
    def: &TaskDef,
    step: &StepRun,
    ctx: &Context,
) -> Result<Gate, StoreError> {
    let d = &def.steps[step.seq as usize];
    let task = d.task.as_deref().expect("a task: step");
    let child = match s.store.child(id, step.seq).await? {
        Some(c) => c,
        None => {
            let r = ready(&s.registry.view(pins), def, step.seq, ctx);
            let params = match r.rendered {
                Ok((_, p, _)) => p,
                Err(e) => return Ok(Gate::Ended(Err(e))),
            };
            let Some(maker) = s.children.get() else {
                return Ok(Gate::Ended(Err(PluginError::permanent("sub-runbooks cannot be started here"))));
            };
            let by = format!("{} (step {} of {id})", s.store.agent(), step.name);
            match maker.create(task, params, child_key(id, step.seq), by, ctx.trace_id.clone()).await {
                Ok(child) => {
                    tracing::info!(step = %step.name, child = %child, "child instance created");
                    s.store.get(&child).await?
                }
                Err(msg) => return Ok(Gate::Ended(Err(PluginError::permanent(format!("task {task:?}: {msg}"))))),
            }
        }
    };
    let seen = step.state == StepState::Failed && step.finished_at.zip(child.finished_at).is_some_and(|(s, c)| s >= c);
    match child.state {
        // Failed, and this step has failed with it already: a retry of the
        // parent is a retry of the child.
        TaskState::Failed if seen && child.ended() => {
            let why = format!("its parent {id} was retried");
            s.store.manual_retry(&child.id, &why, s.store.agent()).await?;
        }
        _ if child.ended() => return Ok(Gate::Ended(outcome(&child))),
        _ => {}
    }
    let waiting = format!("waits for its child instance {} (task {task}) of step {:?}", child.id, step.name);
    s.store.park_for_child(id, &waiting).await?;
    // The child may have ended between the look and the park.
    if s.store.get(&child.id).await?.ended() && s.store.unpark(id).await? {
        s.wake();
    }
    tracing::info!(step = %step.name, "parked: {waiting}");
    Ok(Gate::Parked)
}

/// A child's end lets its parent go (looked at again by a claim).
pub(super) async fn ended(s: &Arc<Scheduler>, child: &str) {
    let Ok(c) = s.store.get(child).await else { return };
    let Some((parent, _)) = crate::store::parent_of(c.dedup_key.as_deref()) else { return };
    if c.ended() {
        // A crash here leaves the parent parked: the maintenance lets it go.
        crate::crash_point!("executor.before_parent_release");
        match s.store.unpark(&parent).await {
            Ok(true) => s.wake(),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, parent = %parent, "cannot let the parent of a child that ended go"),
        }
    }
}
