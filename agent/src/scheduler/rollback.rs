//! A rollback: the failed step, then every succeeded step, in reverse
//! order, each through its plugin's rollback under the step's fixed
//! timeout; the first that fails leaves the instance FAILED with an alert.

use super::calls::watchdog;
use super::state::finished;
use super::Scheduler;
use crate::logs::StepLog;
use crate::plugins::Call;
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
                let context = ctx.to_value();
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
