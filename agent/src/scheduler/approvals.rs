//! Approval steps in the executor: before such a step starts, its decision
//! is looked up. Without one, the request is recorded and the instance
//! parked on it in one write (RUNNING → PENDING: the executor ends, its slot
//! is free, no process waits) and an `approval_requested` alert says who
//! may decide and how. Once decided (or timed out), the claim that takes
//! the instance again runs the step with the decision. The request's
//! message has the step's secrets masked before it is stored.

use super::Scheduler;
use crate::plugins::approval::{request, verdict, DECISION};
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
    ask(s, (id, attempt), def, (&step.name, step.seq), req, &r.masker).await
}

/// What a fan-out step's gate (`approve_after_batch`) says before the
/// batches after it start.
pub(super) enum BatchGate {
    /// Approved (now, or in an earlier attempt of the instance): go on.
    Go,
    /// Parked until it is decided: the executor ends, the step stays
    /// RUNNING with its items' ledger.
    Parked,
    /// Denied, timed out or cancelled: the step fails with this.
    Stop(String),
}

/// The gate of fan-out step `seq` of instance `id` before the batches
/// after its own: its decision in this attempt, else an approval in an
/// earlier one (the engineer looked at the canary once; a retry does not
/// ask again), else a request made and the instance parked on it.
/// `counts` says how the batches so far went, after the message.
pub(super) async fn batch_gate(
    s: &Arc<Scheduler>,
    (id, attempt): (&str, u32),
    def: &TaskDef,
    (name, seq): (&str, u32),
    ctx: &Context,
    counts: &str,
) -> Result<BatchGate, StoreError> {
    let decided_now = s.store.approval_for(id, seq, attempt).await?;
    if let Some(d) = decided_now.as_ref().and_then(decided) {
        return Ok(verdict(&d).map_or_else(BatchGate::Stop, |_| BatchGate::Go));
    }
    for earlier in (1..attempt).rev() {
        let a = s.store.approval_for(id, seq, earlier).await?;
        if a.as_ref().and_then(decided).is_some_and(|d| verdict(&d).is_ok()) {
            return Ok(BatchGate::Go);
        }
    }
    let secrets = match crate::secrets::resolve(def) {
        Ok(x) => x,
        Err(e) => return Ok(BatchGate::Stop(e)),
    };
    let params = match crate::steps::gate_params(def, seq, ctx, &secrets) {
        None => return Ok(BatchGate::Go),
        Some(Err(e)) => return Ok(BatchGate::Stop(format!("approve_after_batch: {}", e.message))),
        Some(Ok(p)) => p,
    };
    let mut req = match request(&params) {
        Ok(r) => r,
        Err(e) => return Ok(BatchGate::Stop(format!("approve_after_batch: {e}"))),
    };
    req.message = format!("{} ({counts})", req.message);
    Ok(match ask(s, (id, attempt), def, (name, seq), req, &secrets.masker).await? {
        Gate::Decided(d) => verdict(&d).map_or_else(BatchGate::Stop, |_| BatchGate::Go),
        _ => BatchGate::Parked,
    })
}

/// Records the request `req` of step `seq` (named `name`) and parks the
/// instance on it, unless it was decided meanwhile.
async fn ask(
    s: &Arc<Scheduler>,
    (id, attempt): (&str, u32),
    def: &TaskDef,
    (name, seq): (&str, u32),
    req: crate::plugins::approval::Request,
    masker: &apollo_shared::def::Masker,
) -> Result<Gate, StoreError> {
    let deadline = req.timeout.map(|t| {
        let at = chrono::Utc::now() + chrono::Duration::milliseconds((t * 1000.0) as i64);
        at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    });
    let a = Approval {
        id: format!("approval-{}", ulid::Ulid::new()),
        instance: id.to_string(),
        task: def.task.clone(),
        step: name.to_string(),
        seq,
        // What the request stores and says is masked like all a step leaves
        // behind; its approvers are names it is checked against, kept as rendered.
        message: masker.text(&req.message),
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
        None => match s.store.approval_for(id, seq, attempt).await?.as_ref().and_then(decided) {
            // Decided between the read and the park.
            Some(d) => Ok(Gate::Decided(d)),
            None => Ok(Gate::Parked),
        },
    }
}
