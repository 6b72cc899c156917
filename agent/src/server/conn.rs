//! One client connection. Requests are answered in order; pushed
//! notifications go through the same writer. Every bad frame gets a JSON-RPC
//! error and the connection carries on.

use super::access::{peer_groups, Access};
use super::frame::{Frame, FrameCodec};
use super::Api;
use apollo_shared::protocol::methods as m;
use apollo_shared::protocol::{
    code, Event, EventData, Method, Request, Response, RpcError, SubscribeResult, Topic, MAX_FRAME_BYTES,
};
use futures::StreamExt;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::{broadcast, mpsc};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

/// Lines queued for one client; past this a subscriber is behind and gets a resync.
const OUTBOX: usize = 1024;
/// Bytes queued for one client: past this an answer waits for the client to
/// read, and a subscriber is behind. Memory per connection stays bounded
/// whatever a client asks for and however slowly it reads.
const OUTBOX_BYTES: usize = 4 * MAX_FRAME_BYTES;
/// The longest request id echoed back.
const MAX_ID_CHARS: usize = 256;

/// What is queued for one client, bounded in lines and in bytes.
#[derive(Clone)]
struct Outbox {
    tx: mpsc::Sender<(String, OwnedSemaphorePermit)>,
    budget: Arc<Semaphore>,
}

impl Outbox {
    fn cost(line: &str) -> u32 {
        (line.len() + 1).min(OUTBOX_BYTES) as u32
    }

    /// Queues a line, waiting for room; false once the connection is gone.
    async fn send(&self, line: String) -> bool {
        let Ok(permit) = self.budget.clone().acquire_many_owned(Self::cost(&line)).await else { return false };
        self.tx.send((line, permit)).await.is_ok()
    }

    /// Queues a line if there is room now.
    fn try_send(&self, line: String) -> bool {
        let Ok(permit) = self.budget.clone().try_acquire_many_owned(Self::cost(&line)) else { return false };
        self.tx.try_send((line, permit)).is_ok()
    }
}
/// Calls of one connection running at once; more wait to be read.
const IN_FLIGHT: usize = 32;

fn reply(id: Value, result: Result<Value, RpcError>) -> Response {
    match result {
        Ok(v) => Response::ok(id, v),
        Err(e) => Response::err(id, e),
    }
}

/// The line of an answer: an error's message is bounded, and an answer that
/// would exceed the frame limit becomes an error saying so (a client never
/// sees its connection dropped for it).
fn answer(method: &str, r: &Response) -> String {
    let mut r = r.clone();
    r.error = r.error.map(RpcError::bounded);
    let line = to_line(&r);
    if line.len() < MAX_FRAME_BYTES {
        return line;
    }
    let e = RpcError::new(
        code::TOO_LARGE,
        format!("the answer to {method} would be {} bytes, over the {MAX_FRAME_BYTES} byte frame limit", line.len()),
    )
    .with_hint("ask for less (a smaller limit, one instance at a time); large step outputs belong in files");
    to_line(&Response::err(r.id, e))
}

/// The uid an unmapped user has inside a user namespace.
const OVERFLOW_UID: u32 = 65534;

pub async fn handle(stream: UnixStream, api: Arc<Api>, access: Arc<Access>, shutdown: CancellationToken) {
    let cred = stream.peer_cred().ok();
    let uid = cred.map(|c| c.uid());
    let groups = cred.map(|c| peer_groups(std::os::fd::AsRawFd::as_raw_fd(&stream), c.uid(), c.gid()));
    let role = uid.and_then(|u| access.role(u, groups.as_deref().unwrap_or_default()));
    let mut actor = match uid {
        Some(u) => nix::unistd::User::from_uid(u.into())
            .ok()
            .flatten()
            .map(|user| format!("{} (uid {u})", user.name))
            .unwrap_or_else(|| format!("uid {u}")),
        None => "unknown peer".into(),
    };
    // A client that came through `ssh … apollo-agent dial-stdio`: the peer is
    // that bridge, whose environment names the SSH client's address.
    if let Some(from) = cred.and_then(|c| c.pid()).and_then(ssh_client) {
        actor.push_str(&format!(" via ssh from {from}"));
    }
    let clients = &crate::metrics::get().clients;
    clients.inc();
    struct Gone;
    impl Drop for Gone {
        fn drop(&mut self) {
            crate::metrics::get().clients.dec();
        }
    }
    let _gone = Gone;
    let (rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<(String, OwnedSemaphorePermit)>(OUTBOX);
    let tx = Outbox { tx, budget: Arc::new(Semaphore::new(OUTBOX_BYTES)) };
    let writer = tokio::spawn(async move {
        while let Some((mut line, permit)) = rx.recv().await {
            line.push('\n');
            if wr.write_all(line.as_bytes()).await.is_err() {
                break;
            }
            drop(permit);
        }
    });
    let Some(role) = role else {
        tracing::warn!(peer = %actor, "refused a connection: not an operator or observer");
        let e = if uid == Some(OVERFLOW_UID) {
            // The agent runs in a user namespace that hides who connects
            // (systemd's PrivateUsers=yes): everyone looks like this.
            RpcError::new(
                code::FORBIDDEN,
                format!(
                    "{actor} may not use this agent: the agent cannot see who connects (uid {OVERFLOW_UID} is how a user \
                     namespace shows every unmapped user); do not add it to socket.operators, remove PrivateUsers= \
                     from the agent's unit"
                ),
            )
        } else {
            RpcError::new(code::FORBIDDEN, format!("{actor} may not use this agent"))
                .with_hint("add the user (a name or a uid) or one of its groups (@group) to socket.operators or socket.observers in the agent's config")
        };
        let _ = tx.send(answer("hello", &Response::err(Value::Null, e))).await;
        drop(tx);
        let _ = writer.await;
        return;
    };
    let mut frames = FramedRead::new(rd, FrameCodec::default());
    let in_flight = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut subscription: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        let frame = tokio::select! {
            f = frames.next() => f,
            _ = shutdown.cancelled() => break,
        };
        let reply = match frame {
            None | Some(Err(_)) => break,
            Some(Ok(Frame::TooLong)) => Some(Response::err(
                Value::Null,
                RpcError::new(
                    code::INVALID_REQUEST,
                    format!("frame longer than {MAX_FRAME_BYTES} bytes; it was skipped"),
                )
                .with_hint("send one JSON-RPC object per line, each under the limit"),
            )),
            Some(Ok(Frame::Line(bytes))) => {
                let (id, req) = match parse(&bytes) {
                    Ok(r) => r,
                    Err((id, e)) => {
                        if !tx.send(answer("the request", &Response::err(id, e))).await {
                            break;
                        }
                        continue;
                    }
                };
                let Some(req) = req else { continue };
                if req.method == m::Subscribe::NAME {
                    let result = subscribe(&api, req.params.clone(), &tx, &mut subscription);
                    req.id.as_ref().map(|_| reply(id, result))
                } else {
                    // Calls run concurrently (a slow one does not hold up the
                    // others); answers carry their id and may come out of order.
                    let Ok(permit) = in_flight.clone().acquire_owned().await else { break };
                    let (api, actor, tx) = (api.clone(), actor.clone(), tx.clone());
                    tokio::spawn(async move {
                        let result = api.call(&req.method, req.params.unwrap_or(Value::Null), role, &actor).await;
                        // A request without an id is a notification: no reply.
                        if req.id.is_some() {
                            let _ = tx.send(answer(&req.method, &reply(id, result))).await;
                        }
                        drop(permit);
                    });
                    None
                }
            }
        };
        if let Some(r) = reply {
            if !tx.send(answer("subscribe", &r)).await {
                break;
            }
        }
    }
    if let Some(s) = subscription {
        s.abort();
    }
    drop(tx);
    let _ = writer.await;
}

/// The SSH client address (`SSH_CLIENT`'s first field) in a process's environment.
fn ssh_client(pid: i32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|b| *b == 0).find_map(|kv| {
        let kv = std::str::from_utf8(kv).ok()?;
        let v = kv.strip_prefix("SSH_CLIENT=").or_else(|| kv.strip_prefix("SSH_CONNECTION="))?;
        v.split_whitespace().next().map(str::to_string)
    })
}

fn to_line<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "{}".into())
}

/// Checks a frame is one JSON-RPC 2.0 request. `Ok((id, None))` is an empty line.
pub fn parse(bytes: &[u8]) -> Result<(Value, Option<Request>), (Value, RpcError)> {
    let text = std::str::from_utf8(bytes).map_err(|_| {
        (
            Value::Null,
            RpcError::new(code::PARSE_ERROR, "parse error: the frame is not UTF-8 text (expected one JSON object)"),
        )
    })?;
    if text.trim().is_empty() {
        return Ok((Value::Null, None));
    }
    let v: Value = serde_json::from_str(text).map_err(|e| {
        (Value::Null, RpcError::new(code::PARSE_ERROR, format!("parse error: {e} (expected one JSON object per line)")))
    })?;
    let invalid = |id: Value, m: String| Err((id, RpcError::new(code::INVALID_REQUEST, m)));
    let mut obj = match v {
        Value::Object(o) => o,
        Value::Array(_) => {
            return invalid(Value::Null, "batch requests are not supported; send one object per line".into())
        }
        other => {
            return invalid(
                Value::Null,
                format!("expected a JSON-RPC request object, found {}", apollo_shared::def::kind(&other)),
            )
        }
    };
    let id = obj.get("id").cloned().unwrap_or(Value::Null);
    if !matches!(id, Value::Null | Value::String(_) | Value::Number(_)) {
        return invalid(Value::Null, "id must be a string or a number".into());
    }
    if id.as_str().is_some_and(|s| s.chars().count() > MAX_ID_CHARS) {
        return invalid(Value::Null, format!("id is longer than {MAX_ID_CHARS} characters"));
    }
    if obj.get("jsonrpc") != Some(&json!("2.0")) {
        return invalid(id, "jsonrpc must be \"2.0\"".into());
    }
    let Some(Value::String(method)) = obj.remove("method") else {
        return invalid(id, "method must be a string, e.g. \"tasks.list\"".into());
    };
    // The request is taken apart as checked, not deserialized again (its
    // params would be copied once more): `null` params are none, as serde
    // reads them.
    let params = match obj.remove("params") {
        None | Some(Value::Null) => None,
        Some(p @ Value::Object(_)) => Some(p),
        Some(_) => {
            return Err((id, RpcError::new(code::INVALID_PARAMS, "params must be an object of named parameters")))
        }
    };
    let req = Request { jsonrpc: "2.0".into(), id: (!id.is_null()).then(|| id.clone()), method, params };
    Ok((id, Some(req)))
}

/// Starts (or replaces) this connection's subscription.
fn subscribe(
    api: &Api,
    params: Option<Value>,
    tx: &Outbox,
    current: &mut Option<tokio::task::JoinHandle<()>>,
) -> Result<Value, RpcError> {
    let p = m::Subscribe::params(params.unwrap_or(Value::Null))?;
    if let Some(bad) = p.topics.iter().find(|t| !Topic::SUBSCRIBABLE.contains(t)) {
        let known: Vec<&str> = Topic::SUBSCRIBABLE.iter().map(|t| t.as_str()).collect();
        return Err(RpcError::new(
            code::INVALID_PARAMS,
            format!("topic {bad:?} is not for clients (expected any of: {})", known.join(", ")),
        ));
    }
    if let Some(old) = current.take() {
        old.abort();
    }
    let mut events = api.bus().subscribe();
    let bus = api.bus().clone();
    let seq = bus.seq();
    let tx = tx.clone();
    let topics = p.topics;
    *current = Some(tokio::spawn(async move {
        let mut behind = false;
        loop {
            if behind {
                // The client missed events: it is told as soon as it has read
                // enough to take the notice, not only when the next event comes.
                let resync = Event { seq: bus.seq(), topic: Topic::All, data: EventData::Resync {} };
                if !tx.send(notification(&resync)).await {
                    break;
                }
                behind = false;
            }
            let ev = match events.recv().await {
                Ok(ev) => ev,
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    behind = true;
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => break,
            };
            if topics.iter().any(|t| *t == ev.topic) && !tx.try_send(notification(&ev)) {
                // The client is not reading fast enough; it gets a resync instead of a backlog.
                behind = true;
            }
        }
    }));
    serde_json::to_value(SubscribeResult { seq }).map_err(|e| RpcError::new(code::INTERNAL, e.to_string()))
}

fn notification(ev: &Event) -> String {
    to_line(&json!({ "jsonrpc": "2.0", "method": "event", "params": ev }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request taken apart by `parse` is the one serde reads from the
    /// same frame: ids absent, null, strings and numbers; params absent,
    /// null and objects; fields it does not know.
    #[test]
    fn a_parsed_request_is_the_one_serde_reads() {
        let frames = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tasks.list"}"#,
            r#"{"jsonrpc":"2.0","id":"a","method":"tasks.run","params":{"task":"t","params":{"n":[1,null]}}}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"agent.status","params":null}"#,
            r#"{"jsonrpc":"2.0","method":"agent.status","params":{},"extra":true}"#,
        ];
        for frame in frames {
            let (_, req) = parse(frame.as_bytes()).unwrap_or_else(|e| panic!("{frame}: {:?}", e.1));
            let read: Request = serde_json::from_str(frame).unwrap();
            assert_eq!(req, Some(read), "{frame}");
        }
    }
}
