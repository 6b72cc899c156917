//! What the console asks of the agent for a key: a run, an operator action, a decision, a pause; the answer goes back as news.

use crate::client::{Client, ClientError};
use crate::console::app::{Cmd, News};
use apollo_shared::protocol::methods as m;
use apollo_shared::protocol::{ListParams, TriggerParams};
use tokio::sync::mpsc;

/// Why a session ended: asked to quit, or the connection was lost.
pub(super) enum Ended {
    Quit,
    Lost(String),
}

pub(super) fn lost(e: ClientError) -> Ended {
    Ended::Lost(e.to_string())
}

/// An answer, or the agent's refusal as the agent worded it; a lost
/// connection ends the session.
pub(super) fn answer<T>(r: Result<T, ClientError>) -> Result<Result<T, String>, Ended> {
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(ClientError::Rpc(e)) => Ok(Err(e.to_string())),
        Err(e) => Err(lost(e)),
    }
}

/// Runs one action; the agent's refusal is shown as the agent worded it.
pub(super) async fn act(client: &Client, cmd: Cmd, news: &mpsc::Sender<News>) -> Result<(), Ended> {
    let out = match cmd {
        Cmd::MoreTasks { query, cursor } => {
            match answer(client.request::<m::TasksList>(ListParams { cursor: Some(cursor), ..query }).await)? {
                Ok(page) => News::Tasks { items: page.items, next_cursor: page.next_cursor, append: true },
                Err(e) => News::Done(Err(e)),
            }
        }
        Cmd::Trigger { task, params } => {
            let p = TriggerParams { task, params, dedup_key: None, reason: None };
            match answer(client.request::<m::TasksTrigger>(p).await)? {
                Ok(r) => News::Triggered(r.id),
                Err(e) => News::Done(Err(e)),
            }
        }
        Cmd::DryRun { task, params } => {
            let p = TriggerParams { task, params, dedup_key: None, reason: None };
            match answer(client.request::<m::TasksDryRun>(p).await)? {
                Ok(r) => News::DryRun(r),
                Err(e) => News::Done(Err(e)),
            }
        }
        Cmd::Timeline { ids } => {
            // Named after the instance, or the first of several and how many.
            let name = match ids.len() {
                1 => ids[0].clone(),
                n => format!("{}-and-{}-more", ids[0], n - 1),
            };
            let p = apollo_shared::protocol::TimelineParams { ids, ..Default::default() };
            match answer(client.timeline(p).await)? {
                Ok(t) => {
                    // Written where the console runs, for the postmortem.
                    let path = std::env::temp_dir().join(format!("apollo-timeline-{name}.md"));
                    let file = std::fs::write(&path, t.markdown())
                        .map(|()| path.display().to_string())
                        .map_err(|e| format!("cannot write {}: {e}", path.display()));
                    News::Timeline { lines: t.lines(), file }
                }
                Err(e) => News::Done(Err(e)),
            }
        }
        Cmd::Act { action, id, reason } => {
            let reason = reason.unwrap_or_else(|| "from the console".into());
            match answer(client.operate(action, &id, Some(&reason)).await)? {
                Ok(i) => News::Done(Ok(format!("{} {}: now {}", action.name(), id, i.state))),
                Err(e) => News::Done(Err(e)),
            }
        }
        Cmd::Approve { id, deny, reason } => {
            use apollo_shared::protocol::{methods::ApprovalsDecide, ApprovalDecide};
            let p = ApprovalDecide { id: id.clone(), deny, reason };
            News::Done(
                answer(client.request::<ApprovalsDecide>(p).await)?
                    .map(|a| format!("step {} of {id} {}", a.step, a.decision.unwrap_or_default())),
            )
        }
        Cmd::Pause { queue, resume, reason } => {
            use apollo_shared::protocol::{methods as m, PauseEnd, PauseScope, PauseStart};
            let target = Some(queue.clone());
            let done = match resume {
                true => answer(
                    client.request::<m::SchedulerResume>(PauseEnd { scope: PauseScope::Queue, target, reason }).await,
                )?
                .map(|_| format!("queue {queue} resumed")),
                false => {
                    let p = PauseStart { scope: PauseScope::Queue, target, until: None, reason };
                    answer(client.request::<m::SchedulerPause>(p).await)?
                        .map(|p| format!("queue {queue} paused ({})", p.id))
                }
            };
            News::Done(done)
        }
        Cmd::Skip { id, seq, reason, item } => {
            let p = apollo_shared::protocol::SkipParams {
                id: id.clone(),
                step: seq.to_string(),
                reason,
                item: item.map(|i| i.to_string()),
            };
            match (answer(client.request::<apollo_shared::protocol::methods::StepsSkip>(p).await)?, item) {
                (Ok(_), Some(item)) => {
                    News::Done(Ok(format!("item #{item} of step #{seq} of {id} skipped: t retries the items left")))
                }
                (Ok(i), None) => News::Done(Ok(format!("step #{seq} of {id} skipped: now {}", i.state))),
                (Err(e), _) => News::Done(Err(e)),
            }
        }
        Cmd::Batch { action, ids, reason } => {
            let reason = reason.unwrap_or_else(|| "batch from the console".into());
            let mut results = Vec::new();
            for id in ids {
                let r = answer(client.operate(action, &id, Some(&reason)).await)?.map(|i| i.state.to_string());
                results.push((id, r));
            }
            News::BatchDone(action.name(), results)
        }
        // The console itself handles these.
        Cmd::Watch { .. } | Cmd::Quit | Cmd::Switch(_) | Cmd::WatchFleet => return Ok(()),
    };
    let _ = news.send(out).await;
    Ok(())
}
