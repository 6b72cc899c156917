//! The watchdog every plugin call runs under, a step's start written on its
//! own, and `durably`, for the writes an executor must not lose.

use super::{Active, Scheduler};
use crate::plugins::PluginError;
use crate::steps::{check, ready, Started};
use crate::store::StoreError;
use apollo_shared::context::Context;
use apollo_shared::def::TaskDef;
use apollo_shared::protocol::Pins;

use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Commits a result the agent must not lose: while the store cannot be
/// reached or written, the write is tried again (with growing pauses) for as
/// long as the executor runs; the result waits in memory meanwhile. A write
/// whose commit was cut off may have landed: `landed` tells from the stored
/// instance, before a repeat is refused as an illegal transition.
pub(super) async fn durably<R, F, Fut>(
    s: &Arc<Scheduler>,
    active: &Active,
    id: &str,
    what: &str,
    write: F,
    landed: impl Fn(&apollo_shared::protocol::Instance) -> Option<R>,
) -> Result<R, StoreError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<R, StoreError>>,
{
    let mut pause = Duration::from_millis(100);
    let mut tried = false;
    loop {
        match write().await {
            Ok(r) => return Ok(r),
            Err(StoreError::Unwritable(_) | StoreError::Commit(_) | StoreError::Closed)
                if active.token.is_cancelled() =>
            {
                return Err(StoreError::Closed)
            }
            Err(e @ (StoreError::Unwritable(_) | StoreError::Commit(_))) => {
                if !tried {
                    tracing::warn!(error = %e, "cannot record {what} now; it is kept and recorded when the store can be written");
                }
                tried = true;
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = active.token.cancelled() => {}
                }
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(e @ StoreError::Illegal(_)) if tried => {
                // The earlier attempt committed after all?
                return match s.store.get(id).await.map(|i| landed(&i)) {
                    Ok(Some(r)) => Ok(r),
                    _ => Err(e),
                };
            }
            Err(e) => return Err(e),
        }
    }
}

/// Starts step `seq` with a write of its own (the first step this executor
/// runs; later ones start with their predecessor's SUCCESS).
pub(super) async fn start(
    s: &Arc<Scheduler>,
    id: &str,
    def: &TaskDef,
    seq: u32,
    ctx: &Context,
    pins: Option<&Pins>,
) -> Result<Started, StoreError> {
    let r = ready(&s.registry.view(pins), def, seq, ctx);
    let (checked, attempt) = tokio::join!(check(&r), s.store.step_start(id, seq, &r.version, &r.params_json));
    Ok(r.started(attempt?, checked))
}

/// Takes up step `step`, left RUNNING while its instance was parked (a
/// fan-out at its gate, now decided): no new attempt, the same goes on.
pub(super) async fn resume(
    s: &Arc<Scheduler>,
    def: &TaskDef,
    step: &apollo_shared::protocol::StepRun,
    ctx: &Context,
    pins: Option<&Pins>,
) -> Started {
    let r = ready(&s.registry.view(pins), def, step.seq, ctx);
    let checked = check(&r).await;
    r.started(step.attempts.max(1), checked)
}

/// Runs one plugin call under the step's watchdog, for execute and rollback
/// alike: at the timeout the call's token fires (a subprocess gets SIGTERM to
/// its group, then SIGKILL after the grace) and the call has the grace to end
/// before it is abandoned. `stop` (a cancel, the reaper, shutdown) does the same.
/// The timeout comes with its basis, which a timeout's error names.
pub(super) async fn watchdog<T>(
    s: &Scheduler,
    (timeout, basis): (Duration, &str),
    token: &CancellationToken,
    stop: Option<&CancellationToken>,
    (plugin, call): (&str, impl std::future::Future<Output = Result<T, PluginError>>),
    what: &str,
) -> Result<T, PluginError> {
    let grace = s.config().scheduler.kill_grace + Duration::from_secs(1);
    // The fault tests' watchdog that never fires (the zombie reaper's case).
    let no_watchdog = || -> bool {
        fail::fail_point!("step.no_watchdog", |_| true);
        false
    };
    let timeout = if no_watchdog() { Duration::from_secs(86_400 * 365) } else { timeout };
    let call = crate::plugins::unwinding(plugin, call);
    tokio::pin!(call);
    let stopped = async {
        match stop {
            Some(t) => t.cancelled().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = &mut call => r,
        _ = tokio::time::sleep(timeout) => {
            token.cancel();
            let _ = tokio::time::timeout(grace, call).await;
            Err(PluginError::retryable(format!("{what}timed out after {}s ({basis})", timeout.as_secs_f64())))
        }
        _ = stopped => {
            token.cancel();
            let _ = tokio::time::timeout(grace, call).await;
            Err(PluginError::retryable(format!("{what}stopped")))
        }
    }
}
