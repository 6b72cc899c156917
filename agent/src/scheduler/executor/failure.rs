//! A step's failure: retried within its budget, let through, or the instance's failure plan.

use crate::handles::StopReason;
use crate::plugins::PluginError;
use crate::scheduler::rollback::rollback;
use crate::scheduler::state::finished;
use crate::scheduler::{backoff, Scheduler};
use crate::steps::{registration, Started};
use crate::store::{FailurePlan, StoreError};
use apollo_shared::context::Context;
use apollo_shared::def::{OnFailure, TaskDef};
use apollo_shared::protocol::Pins;
use apollo_shared::state::TaskState;
use chrono::Utc;
use std::sync::Arc;

/// How one step attempt ended.
pub(super) enum Outcome {
    /// Its SUCCESS is recorded, with the next step's start when there was
    /// one to start.
    Done(Option<Box<Started>>),
    /// Its SUCCESS is recorded with the instance's.
    Finished,
    /// The instance was handed on (retry scheduled, stopped, rolled back).
    Ended,
    /// The step failed and was let through (`on_failure: continue`): the
    /// next step runs.
    Continued,
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn failed(
    s: &Arc<Scheduler>,
    (id, pins): (&str, Option<&Pins>),
    def: &TaskDef,
    seq: u32,
    e: PluginError,
    why: Option<StopReason>,
    ctx: &Context,
    work_dir: &std::path::Path,
) -> Result<Outcome, StoreError> {
    let name = def.steps[seq as usize].name.clone();
    match why {
        Some(StopReason::Shutdown) => {
            // Not a failure of the step: the next start runs it again.
            s.store
                .step_fail(id, seq, "interrupted: the agent shut down while this step ran; it runs again", false)
                .await?;
            tracing::info!(step = %name, "step interrupted by shutdown");
            return Ok(Outcome::Ended);
        }
        Some(StopReason::Cancel { actor, reason }) => {
            let msg = format!("cancelled: {reason}");
            let stop = msg.clone();
            let plan = Box::new(move |_| (FailurePlan::Stop, stop.clone()));
            s.store.fail_step_by(id, seq, &msg, false, plan, &actor).await?;
            finished(&def.task, TaskState::Failed);
            tracing::info!(step = %name, "instance cancelled");
            return Ok(Outcome::Ended);
        }
        _ => {}
    }
    if let Some(StopReason::Zombie(reaped)) = why {
        // Not retried, not rolled back by itself: what the step did is
        // unknown (see `reaper`).
        let stop = format!("step {name:?} (#{seq}) {reaped}");
        let plan = Box::new(move |_| (FailurePlan::Stop, stop.clone()));
        s.store.fail_step(id, seq, &reaped, true, plan).await?;
        finished(&def.task, TaskState::Failed);
        tracing::warn!(step = %name, "instance reaped");
        return Ok(Outcome::Ended);
    }
    let message = e.message.clone();
    let retries = def.steps[seq as usize]
        .retry
        .unwrap_or_else(|| registration(&s.registry.view(pins), def, seq).map(|r| r.retry).unwrap_or(0));
    let located = format!("step {name:?} (#{seq}) failed: {message}");
    let (base, max) = (s.config().scheduler.backoff_base, s.config().scheduler.backoff_max);
    let on_failure = def.steps[seq as usize].on_failure.unwrap_or(def.on_failure);
    let (permanent, jitter) = (e.permanent, rand::random::<f64>());
    let said = located.clone();
    // Decided inside the transaction that records the failure, from the count
    // it commits: the step's failure and the instance's fate are one write.
    let decide = Box::new(move |failures: u32| {
        if !permanent && failures <= retries {
            let delay = backoff::delay(base, max, failures, jitter);
            let at = Utc::now() + chrono::Duration::from_std(delay).unwrap_or_default();
            let msg = format!("{said} (retry {failures} of {retries} in {:.1}s)", delay.as_secs_f64());
            return (FailurePlan::Retry(at), msg);
        }
        let msg = if permanent {
            format!("{said} (permanent error, not retried)")
        } else {
            format!("{said} (after {failures} attempt{})", if failures == 1 { "" } else { "s" })
        };
        match on_failure {
            OnFailure::Stop => (FailurePlan::Stop, msg),
            OnFailure::Rollback => (FailurePlan::Rollback, msg),
            OnFailure::Continue => (FailurePlan::Continue, format!("{msg}; let through (on_failure: continue)")),
        }
    });
    let (failures, plan) = s.store.fail_step(id, seq, &message, true, decide).await?;
    crate::crash_point!("executor.after_failure_commit");
    if e.panicked {
        tracing::error!(step = %name, "{located}");
        let _ = s
            .store
            .alert(
                apollo_shared::protocol::AlertKind::PluginPanicked,
                &format!("task {}: {located}", def.task),
                Some(id),
            )
            .await;
    }
    if plan == FailurePlan::Continue {
        tracing::warn!(step = %name, failures, "{located}; let through (on_failure: continue), the next step runs");
        return Ok(Outcome::Continued);
    }
    if !matches!(plan, FailurePlan::Retry(_)) {
        let what = if plan == FailurePlan::Rollback { "rolling back" } else { "left FAILED" };
        let msg = format!("task {}: {located} ({what} after {failures} attempt(s))", def.task);
        let _ = s.store.alert(apollo_shared::protocol::AlertKind::InstanceFailed, &msg, Some(id)).await;
    }
    tracing::warn!(step = %name, failures, retries, permanent = e.permanent, "{located}");
    let m = crate::metrics::get();
    match plan {
        FailurePlan::Retry(at) => {
            m.retries.get_or_create(&crate::metrics::label("task", &def.task)).inc();
            s.retry_at(at)
        }
        FailurePlan::Rollback => rollback(s, id, def, ctx, work_dir).await?,
        FailurePlan::Stop => finished(&def.task, TaskState::Failed),
        FailurePlan::Continue => {}
    }
    Ok(Outcome::Ended)
}
