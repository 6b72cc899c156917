//! Asking the agent through the client library: triggers, reads, waits
//! for what its events announce.

use crate::*;
use apollo_tui::client::{Client, ClientError};
use serde_json::Value;
use std::time::Duration;

/// Triggers `task` and returns the new instance id.
pub async fn trigger(c: &Client, task: &str, params: Value) -> String {
    try_trigger(c, task, params).await.expect("trigger")
}

/// Triggers `task`; the agent's answer, a refusal included.
pub async fn try_trigger(c: &Client, task: &str, params: Value) -> Result<String, ClientError> {
    let params = match params {
        Value::Object(m) => m,
        Value::Null => Default::default(),
        other => panic!("params must be an object, not {other}"),
    };
    let p = TriggerParams { task: task.to_string(), params, dedup_key: None, reason: None };
    Ok(c.request::<m::TasksTrigger>(p).await?.id)
}

pub async fn get(c: &Client, id: &str) -> Instance {
    try_get(c, id).await.expect("get")
}

pub async fn try_get(c: &Client, id: &str) -> Result<Instance, ClientError> {
    c.request::<m::TasksGet>(IdParams { id: id.to_string(), reason: None }).await
}

/// The agent's status.
pub async fn status(c: &Client) -> Result<AgentStatus, ClientError> {
    c.request::<m::AgentStatus>(NoParams {}).await
}

/// The latest alerts, as JSON text (to look for a kind or a message).
pub async fn alerts_text(c: &Client) -> String {
    let alerts: Vec<Alert> = c.request::<m::AlertsList>(LimitParams::default()).await.expect("alerts.list");
    serde_json::to_string(&alerts).expect("alerts as JSON")
}

/// Publishes an event (`data` an object or null), as `apollo emit` does.
pub async fn publish(
    c: &Client,
    name: &str,
    data: Value,
    dedup_key: Option<&str>,
) -> Result<apollo_shared::protocol::PublishResult, ClientError> {
    let p = apollo_shared::protocol::PublishParams {
        name: name.to_string(),
        data: (!data.is_null()).then_some(data),
        dedup_key: dedup_key.map(str::to_string),
    };
    c.request::<m::EventsPublish>(p).await
}

/// Retries, rolls back or cancels `id` as an operator would.
pub async fn operate(
    c: &Client,
    action: apollo_shared::state::OperatorAction,
    id: &str,
) -> Result<Instance, ClientError> {
    c.operate(action, id, None).await
}

/// Waits, woken by the subscription, until `pred` holds for the instance.
/// The client must have subscribed to `tasks` before the change can happen.
pub async fn wait_until(
    c: &Client,
    events: &mut tokio::sync::mpsc::Receiver<apollo_shared::protocol::Event>,
    id: &str,
    what: &str,
    pred: impl Fn(&Instance) -> bool,
) -> Instance {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let inst = get(c, id).await;
        if pred(&inst) {
            return inst;
        }
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("connection closed while waiting for {what}"),
            Err(_) => panic!("timed out waiting for {what}; instance is {:?}", inst),
        }
    }
}

/// Waits (60 s at most), woken by the subscription, for the first pushed
/// event `pred` accepts, and returns it; panics naming `what` otherwise.
pub async fn wait_event(
    events: &mut tokio::sync::mpsc::Receiver<apollo_shared::protocol::Event>,
    what: &str,
    pred: impl Fn(&apollo_shared::protocol::Event) -> bool,
) -> apollo_shared::protocol::Event {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ev = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .unwrap_or_else(|| panic!("connection closed while waiting for {what}"));
        if pred(&ev) {
            return ev;
        }
    }
}

/// The agent's peak resident memory so far, in KiB.
pub fn peak_rss_kib(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The lines of a file in the agent's data directory (none when it is missing).
pub fn data_lines(agent: &Agent, file: &str) -> Vec<String> {
    std::fs::read_to_string(agent.path().join("data").join(file))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The instance has ended (nothing moves it without an operator).
pub fn ended(i: &Instance) -> bool {
    i.ended()
}
