//! The executor: runs one instance's steps in order, persisting each step's
//! SUCCESS with its output and the context before the next step starts, and
//! decides what a failure leads to (retry, rollback, stop).

use super::approvals::{gate, is_approval, with_decision, Gate};
use super::calls::{durably, resume, start, watchdog};
use super::rollback::rollback;
use super::state::finished;
use super::{Active, Scheduler};
use crate::logs::StepLog;
use crate::plugins::{Call, CallContext, PluginError};
use crate::steps::{check, ready, uses_work_dir, FirstStart, Started};
use crate::store::{Claimed, FailurePlan, Followed, StoreError, Then};
use apollo_shared::context::{Context, Limits};
use apollo_shared::def::{OnInterrupt, TaskDef};
use apollo_shared::protocol::{Pins, StepRun};
use apollo_shared::state::{StepState, TaskState};
use std::path::PathBuf;
use std::sync::Arc;
use tracing::Instrument;

mod child;
mod failure;
mod fanout;
use failure::Outcome;

/// Runs an instance; true when it stopped on a store error (the scheduler
/// takes it up again once the store can be written).
pub async fn run(s: &Arc<Scheduler>, inst: Claimed, first: Option<Box<FirstStart>>, active: &Active) -> bool {
    let span = tracing::info_span!("instance", task_id = %inst.id, trace_id = %inst.trace_id, task = %inst.task);
    let id = inst.id.clone();
    let child = crate::store::parent_of(inst.dedup_key.as_deref()).is_some();
    let stalled = run_outer(s, inst, first, active).instrument(span).await;
    // A sub-runbook's child that ended lets its parent go.
    if child {
        Box::pin(child::ended(s, &id)).await;
    }
    stalled
}

async fn run_outer(s: &Arc<Scheduler>, inst: Claimed, first: Option<Box<FirstStart>>, active: &Active) -> bool {
    let id = inst.id.clone();
    async {
        match run_inner(s, inst, first, active).await {
            Ok(()) => false,
            Err(e @ (StoreError::Illegal(_) | StoreError::Invalid(_))) => {
                // The instance cannot go on as the store holds it: it ends FAILED
                // with the reason, never RUNNING without an executor.
                let msg = format!("stopped: {e}");
                tracing::error!("{msg}");
                // Not when another agent has taken it over (on a shared
                // database): it is that agent's to finish.
                let ours = s.store.get(&id).await.is_ok_and(|i| {
                    i.state == TaskState::Running && i.lease_owner.as_deref() == Some(s.store.agent())
                });
                if ours {
                    if let Err(e) = s.store.fail(&id, &msg, FailurePlan::Stop, s.store.agent()).await {
                        tracing::warn!(error = %e, "could not mark the instance FAILED");
                    }
                }
                false
            }
            Err(e) => {
                // A store error (disk full, I/O, the database out of reach):
                // the instance is taken up again once the store can be written
                // (or by anyone when its lease runs out).
                tracing::error!(error = %e, "executor stopped on a store error; the instance resumes when the store is back");
                !s.is_shutting_down()
            }
        }
    }
    .await
}

async fn run_inner(
    s: &Arc<Scheduler>,
    inst: Claimed,
    first: Option<Box<FirstStart>>,
    active: &Active,
) -> Result<(), StoreError> {
    let def = match s.def_for(&inst.def_hash).await {
        Ok(d) => d,
        Err(e) => {
            let msg = format!("cannot load the definition version this instance was created with: {e}");
            tracing::error!("{msg}");
            if inst.state == TaskState::Running {
                s.store.fail(&inst.id, &msg, FailurePlan::Stop, s.store.agent()).await?;
            }
            return Ok(());
        }
    };
    let mut ctx = Context::of(&inst);
    ctx.attempt = inst.attempt;
    // The context's length as JSON once measured, kept by each merge.
    let mut ctx_size = None;
    let work_dir = PathBuf::from(&ctx.work_dir);
    let steps = inst.steps.clone().unwrap_or_default();
    // Adopted FAILED or SUCCESS: its rollback is under way.
    let rolling_back = matches!(inst.state, TaskState::Failed | TaskState::Success);
    if rolling_back {
        return rollback(s, &inst.id, &def, &ctx, &work_dir).await;
    }
    // A step whose SUCCESS is committed never runs again, nor one that
    // failed and was let through.
    let todo: Vec<&StepRun> = steps.iter().filter(|st| st.state != StepState::Success && !st.passed).collect();
    // A step interrupted under it (a crash, a takeover, a shutdown) that
    // must not run again blindly holds the instance for an operator.
    if let Some(st) = todo.first().filter(|st| interrupted(st)) {
        let d = &def.steps[st.seq as usize];
        if d.on_interrupt.unwrap_or(def.on_interrupt) == OnInterrupt::Hold {
            let (id, name) = (&inst.id, &d.name);
            let msg = format!(
                "step {name:?} (#{}) was interrupted while it ran and has on_interrupt: hold, so it was not run \
                 again and nothing was rolled back; `apollo retry {id}` runs it again, `apollo skip {id} {name} \
                 --reason …` marks it done, `apollo rollback {id}` undoes the instance",
                st.seq
            );
            tracing::warn!("{msg}");
            s.store.hold(id, st.seq, &msg).await?;
            let alert = format!("task {}: {msg}", def.task);
            let _ = s.store.alert(apollo_shared::protocol::AlertKind::InstanceFailed, &alert, Some(id)).await;
            finished(&def.task, TaskState::Failed);
            return Ok(());
        }
    }
    // The first step started with the claim (a new instance's first).
    let mut started: Option<Box<Started>> = match first.filter(|_| todo.first().is_some_and(|t| t.seq == 0)) {
        Some(f) => Some(Box::new(f.started().await)),
        None => None,
    };
    tracing::info!(attempt = inst.attempt, "instance running");
    // The work dir is made before the first step whose plugin may use it
    // (an instance of steps that never touch files has none).
    let mut have_dir = false;
    for (i, step) in todo.iter().enumerate() {
        if !have_dir && uses_work_dir(&s.registry.view(inst.pins.as_ref()), &def, step.seq) {
            if let Err(e) = std::fs::create_dir_all(&work_dir) {
                let msg = format!("cannot create the work dir {}: {e}", work_dir.display());
                match started {
                    // This step is RUNNING already (it started with the claim
                    // or the step before's SUCCESS): it fails, for good.
                    Some(_) => {
                        let stop = msg.clone();
                        let plan = Box::new(move |_| (FailurePlan::Stop, stop.clone()));
                        s.store.fail_step(&inst.id, step.seq, &msg, false, plan).await?;
                    }
                    None => s.store.fail(&inst.id, &msg, FailurePlan::Stop, s.store.agent()).await?,
                }
                return Ok(());
            }
            have_dir = true;
        }
        let now = match started.take() {
            Some(now) => *now,
            // A fan-out parked at its gate goes on where it stood.
            None if step.state == StepState::Running => resume(s, &def, step, &ctx, inst.pins.as_ref()).await,
            None => {
                if s.is_shutting_down() {
                    tracing::info!(step = %step.name, "shutting down before this step; it resumes at the next start");
                    return Ok(());
                }
                // A false condition records the step SKIPPED; the instance goes on.
                match crate::steps::condition(&def, step.seq, &ctx) {
                    Ok(None) => {}
                    Ok(Some(reason)) => {
                        tracing::info!(step = %step.name, "{reason}; skipped");
                        s.store.skip_by_condition(&inst.id, step.seq, &reason).await?;
                        continue;
                    }
                    Err(e) => {
                        let msg = format!("step {:?} (#{}): {e}", step.name, step.seq);
                        tracing::warn!("{msg}");
                        s.store.fail(&inst.id, &msg, FailurePlan::Stop, s.store.agent()).await?;
                        return Ok(());
                    }
                }
                // A sub-runbook: its child's outcome, once the child has ended.
                let given = match def.steps[step.seq as usize].task {
                    Some(_) => {
                        match Box::pin(child::gate(s, (&inst.id, inst.pins.as_ref()), &def, step, &ctx)).await? {
                            child::Gate::Parked => return Ok(()),
                            child::Gate::Ended(r) => Some(r),
                        }
                    }
                    None => None,
                };
                let decision = match is_approval(&def, step.seq) {
                    true => match gate(s, (&inst.id, inst.attempt, inst.pins.as_ref()), &def, step, &ctx).await? {
                        Gate::Parked => return Ok(()),
                        Gate::Decided(d) => Some(d),
                        Gate::Run => None,
                    },
                    false => None,
                };
                let mut now = start(s, &inst.id, &def, step.seq, &ctx, inst.pins.as_ref()).await?;
                if let Some(d) = decision {
                    with_decision(&mut now, d);
                }
                now.given = given;
                now
            }
        };
        let next = todo.get(i + 1).map(|n| n.seq);
        let at = (inst.id.as_str(), inst.attempt, inst.pins.as_ref());
        match run_step(s, at, &def, step, now, next, (&mut ctx, &mut ctx_size), &work_dir, active).await? {
            Outcome::Done(next) => started = next,
            Outcome::Finished => {
                succeeded(&inst.task);
                return Ok(());
            }
            Outcome::Ended => return Ok(()),
            Outcome::Continued => started = None,
        }
    }
    let landed = |i: &apollo_shared::protocol::Instance| (i.state == TaskState::Success).then_some(());
    durably(s, active, &inst.id, "the instance's SUCCESS", || s.store.finish_success(&inst.id), landed).await?;
    succeeded(&inst.task);
    Ok(())
}

/// Whether a step's last attempt was cut off under it (marked so by the
/// recovery or the shutdown), rather than failed by its plugin; a held one
/// (`held: …`) runs on an operator's retry.
fn interrupted(st: &StepRun) -> bool {
    st.state == StepState::Failed && st.error.as_deref().is_some_and(|e| e.starts_with("interrupted:"))
}

fn succeeded(task: &str) {
    finished(task, TaskState::Success);
    tracing::info!("instance succeeded");
}

/// Runs a started step; `next` is the step to start with its SUCCESS (none
/// after the last: the instance's SUCCESS goes with it).
#[allow(clippy::too_many_arguments)]
async fn run_step(
    s: &Arc<Scheduler>,
    (id, attempt_of_instance, pins): (&str, u32, Option<&Pins>),
    def: &TaskDef,
    step: &StepRun,
    now: Started,
    next: Option<u32>,
    (ctx, ctx_size): (&mut Context, &mut Option<usize>),
    work_dir: &std::path::Path,
    active: &Active,
) -> Result<Outcome, StoreError> {
    let d = &def.steps[step.seq as usize];
    let Started { attempt, prepared, masker: mask, given } = now;
    let span = tracing::info_span!("step", step = %d.name, seq = step.seq, attempt);
    let log = StepLog::new(StepLog::path_for(&s.data_dir, id, step.seq), s.config().logging.step_log_bytes);
    // A first attempt that writes nothing leaves no log (a file per silent
    // step would cost more than the step); a retry is always headed, so
    // the log says it was made even when it printed nothing.
    let heading = format!("[apollo: step {}, attempt {attempt}]", d.name);
    match attempt {
        1 => log.opening(&heading),
        _ => log.line(&heading),
    }
    // What the step leaves behind has its secrets' values masked (as read
    // when it was made ready).
    log.mask(mask.clone());
    // A learned timeout is recorded with the attempt before the call runs.
    let auto = &s.config().scheduler.auto_timeout;
    let applied = match &prepared {
        Ok((reg, ..)) => Some(crate::timeouts::applied(&s.store, auto, &def.task, d, reg).await),
        Err(_) => None,
    };
    if let Some(a) = applied.as_ref().filter(|a| a.auto) {
        s.store.step_note_timeout(id, step.seq, a.timeout.as_secs_f64(), &a.basis).await?;
    }
    let fanned = match (&d.foreach, prepared) {
        // A sub-runbook's step: its child's outcome.
        (_, _) if given.is_some() => Err(given.expect("given")),
        (Some(_), Ok((reg, ..))) => {
            let attempt = attempt_of_instance;
            let st = fanout::Step { id, attempt, seq: step.seq, def, reg: &reg, ctx, work_dir, active, masker: &mask };
            // Boxed: its state stays off the executor's future, which every
            // instance's spawn copies (the instruction guard measures it).
            match Box::pin(fanout::run(s, st).instrument(span.clone())).await? {
                // At its gate: the instance is parked, the executor ends.
                fanout::Fanned::Parked => return Ok(Outcome::Ended),
                fanout::Fanned::Ended(r) => Err(r),
            }
        }
        (_, prepared) => Ok(prepared),
    };
    let result = match fanned {
        Err(fanned) => fanned,
        Ok(prepared) => {
            async {
                let (reg, params, env) = prepared?;
                let applied = applied.expect("made ready");
                let timeout = applied.timeout;
                tracing::info!(
                    plugin = %reg.name,
                    version = %reg.version(),
                    timeout_secs = timeout.as_secs_f64(),
                    timeout = %applied.basis,
                    "step started"
                );
                let key = format!("{id}:{}", step.seq);
                let previous = step
                    .seq
                    .checked_sub(1)
                    .and_then(|p| def.steps.get(p as usize))
                    .and_then(|p| ctx.steps.get(&p.name));
                let context = CallContext::of(ctx);
                let token = active.token.child_token();
                let call = Call {
                    params: &params,
                    context: &context,
                    idempotency_key: &key,
                    work_dir,
                    tasks_dir: &s.tasks_dir,
                    previous,
                    step: &d.name,
                    attempt,
                    env: &env,
                    log: &log,
                    cancel: token.clone(),
                    kill_grace: s.config().scheduler.kill_grace,
                };
                let began = std::time::Instant::now();
                let call = (reg.name.as_str(), reg.plugin.execute(call));
                let r = watchdog(s, (timeout, &applied.basis), &token, Some(&active.token), call, "").await;
                let m = crate::metrics::get();
                let outcome = match &r {
                    Ok(_) => "success",
                    Err(e) if e.message.starts_with("timed out after") => {
                        m.timeouts.get_or_create(&crate::metrics::label("plugin", &reg.name)).inc();
                        "timeout"
                    }
                    Err(_) => "failure",
                };
                m.step_seconds
                    .get_or_create(&crate::metrics::labels(("plugin", &reg.name), ("outcome", outcome)))
                    .observe(began.elapsed().as_secs_f64());
                r
            }
            .instrument(span.clone())
            .await
        }
    };
    let limits = Limits {
        step_output_bytes: s.config().scheduler.step_output_bytes,
        context_bytes: s.config().scheduler.context_bytes,
    };
    let result = match mask.is_empty() {
        true => result,
        false => result.map(|out| mask.value(&out)).map_err(|e| PluginError { message: mask.text(&e.message), ..e }),
    };
    let result =
        result.and_then(|out| ctx.merge_output(&d.name, out, limits, ctx_size).map_err(PluginError::permanent));
    // The tests make the executor itself panic here (`executor.after_step=panic(…)`).
    fail::fail_point!("executor.after_step");
    crate::crash_point!("executor.before_step_commit");
    async {
        match result {
            Ok(output) => {
                // The next step starts in the same write, unless the agent is
                // shutting down: then it waits for the next start.
                // An approval step is not started here: its decision is
                // looked up first (see `approvals::gate`).
                let following = next
                    .filter(|n| !s.is_shutting_down() && !crate::steps::starts_alone(def, *n))
                    .map(|n| (n, ready(&s.registry.view(pins), def, n, ctx)));
                let then = match (&following, next) {
                    (Some((n, r)), _) => Then::Start { seq: *n, version: &r.version, params: &r.params_json },
                    (None, None) => Then::Finish,
                    (None, Some(_)) => Then::Nothing,
                };
                let landed = |i: &apollo_shared::protocol::Instance| {
                    let steps = i.steps.as_deref().unwrap_or_default();
                    let state = |seq| steps.iter().find(|x| x.seq == seq).map(|x| (x.state, x.attempts));
                    if !matches!(state(step.seq), Some((StepState::Success, _))) {
                        return None;
                    }
                    Some(match (&then, state(next.unwrap_or(u32::MAX))) {
                        (Then::Start { .. }, Some((StepState::Running, attempts))) => Followed::Started(attempts),
                        (Then::Finish, _) if i.state == TaskState::Success => Followed::Finished,
                        _ => Followed::Nothing,
                    })
                };
                let write = || s.store.step_success(id, step.seq, &output, then);
                let checked = async {
                    match &following {
                        Some((_, r)) => check(r).await,
                        None => Ok(()),
                    }
                };
                let (checked, followed) =
                    tokio::join!(checked, durably(s, active, id, "the step's SUCCESS", write, landed));
                tracing::info!("step succeeded");
                Ok(match (followed?, following) {
                    (Followed::Started(attempt), Some((_, r))) => {
                        Outcome::Done(Some(Box::new(r.started(attempt, checked))))
                    }
                    (Followed::Finished, _) => Outcome::Finished,
                    _ => Outcome::Done(None),
                })
            }
            Err(e) => {
                let why = active.why.lock().expect("why").clone();
                failure::failed(s, (id, pins), def, step.seq, e, why, ctx, work_dir).await
            }
        }
    }
    .instrument(span)
    .await
}
