//! Notifications between agents on one PostgreSQL schema: each committed
//! change is sent to the others (`pg_notify`, delivered at commit), and each
//! agent listens on a connection of its own, publishing what it hears on its
//! bus and waking its scheduler when the change may free work.

use super::db::Db;
use super::postgres::{quote_ident, Target};
use super::Result;
use apollo_shared::protocol::{EventData, Topic};
use apollo_shared::state::TaskState;

/// The schema's notification channel: `apollo_` and 16 hex digits of the
/// schema name's MD5 (a channel name is at most 63 bytes; a schema name may
/// be 63 itself). The SQL side computes the same from `current_schema()`.
pub fn channel(schema: &str) -> String {
    use md5::Digest as _;
    format!("apollo_{}", &hex::encode(md5::Md5::digest(schema.as_bytes()))[..16])
}

/// The longest notification payload PostgreSQL carries, less a margin.
pub const MAX_NOTIFY: usize = 7900;

/// Queues notifications to every agent on the schema, sent when the
/// transaction commits: `{"agent": …, "events": [...]}`, as few as fit.
/// They go with the write's next statement or its commit: no round trip of
/// their own.
pub fn notify(c: &dyn Db, agent: &str, events: &[String]) -> Result<()> {
    let head = format!("{{\"agent\":{},\"events\":[", serde_json::Value::from(agent));
    let mut payload = head.clone();
    for (i, e) in events.iter().enumerate() {
        if payload.len() + e.len() + 2 > MAX_NOTIFY && payload.len() > head.len() {
            payload.push_str("]}");
            send(c, &payload)?;
            payload = head.clone();
        } else if i > 0 && payload.len() > head.len() {
            payload.push(',');
        }
        payload.push_str(e);
    }
    if payload.len() > head.len() {
        payload.push_str("]}");
        send(c, &payload)?;
    }
    Ok(())
}

/// One event as the other agents hear it: `{"topic":…,"kind":…,"data":…}`.
pub fn note(topic: Topic, data: &EventData) -> String {
    #[derive(serde::Serialize)]
    struct Note<'a> {
        topic: Topic,
        #[serde(flatten)]
        data: &'a EventData,
    }
    serde_json::to_string(&Note { topic, data }).expect("an event is JSON")
}

/// The SQL that sends one notification.
const NOTIFY: &str = "SELECT pg_notify('apollo_' || left(md5(current_schema()), 16), ";

/// Sends `payload` later, as a dollar-quoted literal (independent of
/// `standard_conforming_strings`); one that holds the quote's tag goes as
/// a bound value, at once.
fn send(c: &dyn Db, payload: &str) -> Result<()> {
    const TAG: &str = "$apollo_note$";
    if payload.contains(TAG) {
        c.query(&format!("{NOTIFY}?1)"), super::value::p![payload])?;
        return Ok(());
    }
    c.execute_later(&format!("{NOTIFY}{TAG}{payload}{TAG})"))
}

/// A listening connection, whichever its transport.
type Pinned = std::pin::Pin<Box<dyn ConnectionLike + Send>>;

/// What `listen` needs of a connection: its messages.
trait ConnectionLike {
    fn poll_message(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::result::Result<tokio_postgres::AsyncMessage, tokio_postgres::Error>>>;
}

impl<S, T> ConnectionLike for tokio_postgres::Connection<S, T>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    fn poll_message(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::result::Result<tokio_postgres::AsyncMessage, tokio_postgres::Error>>> {
        self.get_mut().poll_message(cx)
    }
}

/// Listens for the other agents' notifications (see [`notify`]) on a
/// connection of its own, reconnecting with backoff when it drops; each is
/// published on `bus` as if it had happened here, and a change to an
/// instance that may let this agent claim something calls `wake` with what
/// it was (see [`Change`]). After a reconnect `wake` is called too (as for
/// new work): what was missed meanwhile is found by the next claim.
pub async fn listen(
    target: Target,
    agent: String,
    bus: crate::bus::Bus,
    wake: std::sync::Arc<dyn Fn(Change) + Send + Sync>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    use futures::StreamExt as _;
    let channel = channel(&target.schema);
    let mut backoff = std::time::Duration::from_millis(100);
    while !shutdown.is_cancelled() {
        let connected = match &target.tls {
            Some(tls) => target.async_config.connect(tls.clone()).await.map(|(c, conn)| (c, Box::pin(conn) as Pinned)),
            None => {
                target.async_config.connect(tokio_postgres::NoTls).await.map(|(c, conn)| (c, Box::pin(conn) as Pinned))
            }
        };
        let (client, mut connection) = match connected {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(store = %target.shown, error = %e, "cannot listen for other agents' changes; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.cancelled() => return,
                }
                backoff = (backoff * 2).min(std::time::Duration::from_secs(5));
                continue;
            }
        };
        let mut messages = futures::stream::poll_fn(move |cx| connection.as_mut().poll_message(cx));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let pump = tokio::spawn(async move {
            while let Some(Ok(m)) = messages.next().await {
                if tx.send(m).is_err() {
                    break;
                }
            }
        });
        if let Err(e) = client.batch_execute(&format!("LISTEN {}", quote_ident(&channel))).await {
            tracing::warn!(error = %e, "LISTEN failed; retrying");
            pump.abort();
            continue;
        }
        backoff = std::time::Duration::from_millis(100);
        wake(Change::Work);
        loop {
            let message = tokio::select! {
                m = rx.recv() => m,
                _ = shutdown.cancelled() => None,
            };
            let Some(message) = message else { break };
            let tokio_postgres::AsyncMessage::Notification(n) = message else { continue };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(n.payload()) else { continue };
            if v["agent"] == agent.as_str() {
                continue;
            }
            let mut strongest: Option<Change> = None;
            for e in v["events"].as_array().into_iter().flatten() {
                let topic: Option<Topic> = e["topic"].as_str().and_then(|t| t.parse().ok());
                let Some(topic) = topic else { continue };
                let data = EventData::from_parts(e["kind"].as_str().unwrap_or_default(), e["data"].clone());
                if topic == Topic::Tasks || topic == Topic::Queues {
                    strongest = strongest.max(change(&data));
                }
                bus.publish(topic, data);
            }
            if let Some(c) = strongest {
                wake(c);
            }
        }
        pump.abort();
        drop(client);
    }
}

/// What another agent's change to an instance may let this agent claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    /// An instance ended (or stopped): a place under a cluster-wide limit
    /// (a queue's, a task's `max_active`, an ordered queue's turn) may be
    /// free. This agent's own slots are as they were.
    Freed,
    /// New work: an instance created, or a retry.
    Work,
}

/// What an instance's change is to the other agents (see [`Change`]). A
/// move to or within RUNNING (a claim, a step's progress) is nothing to
/// them, and waking the scheduler for each would cost every agent a claim
/// per step of every other agent.
fn change(data: &EventData) -> Option<Change> {
    let state = match data {
        EventData::InstanceCreated { state, .. } | EventData::InstanceUpdated { state, .. } => *state,
        // A pause that ended may let work waiting in its scope be claimed.
        EventData::PausesChanged { ended: true, .. } => return Some(Change::Work),
        // Items any agent may claim.
        EventData::ItemsOffered { .. } => return Some(Change::Work),
        _ => return None,
    };
    match state {
        TaskState::Running => None,
        TaskState::Pending | TaskState::Retrying => Some(Change::Work),
        _ => Some(Change::Freed),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_changes_that_may_free_work_wake_the_other_agents() {
        use super::{change, Change};
        use apollo_shared::protocol::{EventData, StepMoved};
        use apollo_shared::state::{StepState, TaskState};
        let moved = |state, step: Option<(u32, StepState)>| EventData::InstanceUpdated {
            id: "a".into(),
            state,
            step: step.map(|(seq, state)| StepMoved { seq, state }),
        };
        let created = EventData::InstanceCreated { id: "a".into(), task: "t".into(), state: TaskState::Pending };
        assert_eq!(change(&created), Some(Change::Work));
        assert_eq!(change(&moved(TaskState::Success, None)), Some(Change::Freed));
        assert_eq!(change(&moved(TaskState::Retrying, Some((0, StepState::Failed)))), Some(Change::Work));
        assert_eq!(change(&moved(TaskState::Running, None)), None);
        assert_eq!(change(&moved(TaskState::Running, Some((1, StepState::Success)))), None);
        assert_eq!(change(&EventData::InstanceArchived { id: "a".into() }), None);
    }

    #[test]
    fn the_channel_is_apollo_and_the_schemas_md5_as_postgresql_computes_it() {
        // PostgreSQL: SELECT 'apollo_' || left(md5('apollo'), 16)
        assert_eq!(super::channel("apollo"), "apollo_31f2385ba9cc65db");
        assert!(super::channel(&"s".repeat(63)).len() <= 63);
    }
}
