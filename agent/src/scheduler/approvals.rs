//! Approval steps in the executor: before such a step starts, its decision
//! is looked up. Without one, the request is recorded and the instance
//! parked on it in one write (RUNNING → PENDING: the executor ends, its slot
//! is free, no process waits) and an `approval_requested` alert says who
//! may decide and how. Once decided (or timed out), the claim that takes
//! the instance again runs the step with the decision. The request's
//! message has the step's secrets masked before it is stored.

use super::Scheduler;
use crate::plugins::approval::{request, DECISION};
pub(super) use crate::steps::is_approval;
use crate::steps::ready;
use crate::store::StoreError;
use apollo_shared::context::Context;
use apollo_shared::def::TaskDef;
use apollo_shared::protocol::{Approval, Pins, StepRun};
use serde_json::{json, Value};
use std::sync::Arc;

/// What the executor does at an approval step.
pub(super) enum Gate {
    /// Parked: the executor ends.
    Parked,
    /// Run the step with this decision (the `decision` param).
    Decided(Value),
    /// Run it as it is (its params do not make a request: the step's own
    /// validation says why it fails).
    Run,
}

fn decided(a: &Approval) -> Option<Value> {
    let d = a.decision.as_deref()?;
    Some(json!({"decision": d, "by": a.decided_by, "reason": a.reason, "at": a.decided_at, "on_timeout": a.on_timeout}))
}

/// Inserts the decision into a started approval step's params.
pub(super) fn with_decision(now: &mut crate::steps::Started, decision: Value) {
    if let Ok((_, params, _)) = &mut now.prepared {
        params.insert(DECISION.into(), decision);
    }
}

pub(super) async fn gate(
    s: &Arc<Scheduler>,
    (id, attempt, pins): (&str, u32, Option<&Pins>),
    def: &TaskDef,
    step: &StepRun,
    ctx: &Context,
) -> Result<Gate, StoreError> {
    if let Some(a) = s.store.approval_for(id, step.seq, attempt).await? {
        if let Some(d) = decided(&a) {
            return Ok(Gate::Decided(d));
        }
    }
    let r = ready(&s.registry.view(pins), def, step.seq, ctx);
    let Ok(req) = r.rendered.as_ref().map_err(|_| ()).and_then(|(_, p, _)| request(p).map_err(|_| ())) else {
        return Ok(Gate::Run);
    };
    let deadline = req.timeout.map(|t| {
        let at = chrono::Utc::now() + chrono::Duration::milliseconds((t * 1000.0) as i64);
        at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    });
    let a = Approval {
        id: format!("approval-{}", ulid::Ulid::new()),
        instance: id.to_string(),
        task: def.task.clone(),
        step: step.name.clone(),
        seq: step.seq,
        // What the request stores and says is masked like all a step leaves
        // behind; its approvers are names it is checked against, kept as rendered.
        message: r.masker.text(&req.message),
        approvers: req.approvers,
        requested_by: String::new(),
        distinct_approver: req.distinct_approver,
        requested_at: String::new(),
        deadline,
        on_timeout: req.on_timeout,
        decision: None,
        decided_by: None,
        decided_at: None,
        reason: None,
    };
    let say = |a: &Approval| {
        format!(
            "task {}: instance {} waits for approval of step {} (#{}) by {}: {}; decide with: {}",
            a.task,
            a.instance,
            a.step,
            a.seq,
            a.approvers.describe(),
            a.message,
            a.commands()
        )
    };
    match s.store.park_for_approval(a, attempt, say).await? {
        Some(fresh) => {
            tracing::info!("{}", say(&fresh));
            Ok(Gate::Parked)
        }
        None => match s.store.approval_for(id, step.seq, attempt).await?.as_ref().and_then(decided) {
            // Decided between the read and the park.
            Some(d) => Ok(Gate::Decided(d)),
            None => Ok(Gate::Parked),
        },
    }
}
