//! The async client the CLI, the console and the tests share: JSON-RPC over
//! a Unix socket, or over `ssh host apollo-agent dial-stdio`.

use apollo_shared::protocol::methods as m;
use apollo_shared::protocol::{
    ClientInfo, Event, Hello, HelloResult, IdParams, Instance, Method, Request, Response, RpcError, SubscribeParams,
    Timeline, TimelineParams, Topic, MAX_FRAME_BYTES, PROTOCOL_VERSION,
};
use apollo_shared::state::OperatorAction;
use futures::StreamExt;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{FramedRead, LinesCodec};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to the agent: {}", crate::reach::why_not(path, source))]
    Connect { path: PathBuf, source: std::io::Error },
    /// No socket of the default places answered: each, and why.
    #[error("{}", crate::reach::none_answered(.0))]
    NoAgent(Vec<(PathBuf, std::io::Error)>),
    #[error("cannot start `{command}`: {source}")]
    Spawn { command: String, source: std::io::Error },
    #[error("{0}")]
    Rpc(#[from] RpcError),
    #[error("the connection to the agent closed")]
    Closed,
    #[error("unexpected answer from the agent: {0}")]
    Decode(String),
}

/// The calls waiting for their answer, by id; `None` once the reader has
/// seen the connection end, so a call made after that fails at once instead
/// of waiting for an answer nobody will deliver.
type Pending = Arc<Mutex<Option<HashMap<u64, oneshot::Sender<Response>>>>>;

/// A connection to one agent. Calls may be made concurrently.
pub struct Client {
    out: mpsc::Sender<String>,
    pending: Pending,
    /// An error the agent sent not tied to a request (a refused connection),
    /// reported by calls that find the connection closed.
    refused: Arc<Mutex<Option<RpcError>>>,
    next_id: AtomicU64,
    events: Mutex<Option<mpsc::Receiver<Event>>>,
    /// Where this client is connected, for messages and the console header.
    pub transport: String,
    _child: Option<tokio::process::Child>,
}

impl Client {
    pub async fn connect_unix(path: &Path) -> Result<Client, ClientError> {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .map_err(|source| ClientError::Connect { path: path.to_path_buf(), source })?;
        let (r, w) = stream.into_split();
        Ok(Client::from_io(r, w, None, path.display().to_string()))
    }

    /// Connects through SSH: `ssh [-p PORT] [user@]host apollo-agent dial-stdio`.
    /// `target` is `[user@]host[:port]`; the `ssh` found first in PATH is
    /// used, or the command in `APOLLO_SSH_COMMAND` (words split on white
    /// space, e.g. `ssh -F ~/.ssh/ops_config`), as git's `GIT_SSH_COMMAND`.
    pub async fn connect_ssh(target: &str, remote_socket: Option<&str>) -> Result<Client, ClientError> {
        let (host, port) = match target.rsplit_once(':') {
            Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) && !p.is_empty() => (h, Some(p)),
            _ => (target, None),
        };
        let ssh = std::env::var("APOLLO_SSH_COMMAND").ok().filter(|c| !c.trim().is_empty());
        let mut words = ssh.as_deref().unwrap_or("ssh").split_whitespace();
        let mut cmd = tokio::process::Command::new(words.next().unwrap_or("ssh"));
        cmd.args(words);
        cmd.arg("-T").arg("-o").arg("BatchMode=yes");
        if let Some(p) = port {
            cmd.arg("-p").arg(p);
        }
        cmd.arg(host).arg("apollo-agent");
        if let Some(s) = remote_socket {
            cmd.arg("--socket").arg(s);
        }
        cmd.arg("dial-stdio");
        cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|source| ClientError::Spawn { command: format!("ssh {host}"), source })?;
        let r = child.stdout.take().ok_or(ClientError::Closed)?;
        let w = child.stdin.take().ok_or(ClientError::Closed)?;
        Ok(Client::from_io(r, w, Some(child), format!("ssh {target}")))
    }

    fn from_io(
        r: impl AsyncRead + Unpin + Send + 'static,
        mut w: impl AsyncWrite + Unpin + Send + 'static,
        child: Option<tokio::process::Child>,
        transport: String,
    ) -> Client {
        let (out, mut out_rx) = mpsc::channel::<String>(256);
        tokio::spawn(async move {
            while let Some(mut line) = out_rx.recv().await {
                line.push('\n');
                if w.write_all(line.as_bytes()).await.is_err() || w.flush().await.is_err() {
                    break;
                }
            }
        });
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));
        let refused: Arc<Mutex<Option<RpcError>>> = Arc::default();
        let (ev_tx, ev_rx) = mpsc::channel(4096);
        let p = pending.clone();
        let r2 = refused.clone();
        tokio::spawn(async move {
            let mut lines = FramedRead::new(r, LinesCodec::new_with_max_length(MAX_FRAME_BYTES));
            while let Some(Ok(line)) = lines.next().await {
                let Ok(v) = serde_json::from_str::<Value>(&line) else { continue };
                if v.get("method").and_then(Value::as_str) == Some("event") {
                    if let Ok(ev) = serde_json::from_value::<Event>(v["params"].clone()) {
                        let _ = ev_tx.try_send(ev);
                    }
                    continue;
                }
                let Ok(resp) = serde_json::from_value::<Response>(v) else { continue };
                if let Some(id) = resp.id.as_u64() {
                    if let Some(tx) = p.lock().expect("pending").as_mut().and_then(|w| w.remove(&id)) {
                        let _ = tx.send(resp);
                    }
                } else if let Some(e) = &resp.error {
                    // An error not tied to a request (a refused connection): every
                    // call gets the agent's words rather than "closed".
                    *r2.lock().expect("refused") = Some(e.clone());
                    for (_, tx) in p.lock().expect("pending").iter_mut().flat_map(|w| w.drain()) {
                        let _ = tx.send(resp.clone());
                    }
                }
            }
            // Dropping the senders tells every waiting call the connection
            // closed; a later call finds `None` and fails without waiting.
            p.lock().expect("pending").take();
        });
        Client {
            out,
            pending,
            refused,
            next_id: AtomicU64::new(1),
            events: Mutex::new(Some(ev_rx)),
            transport,
            _child: child,
        }
    }

    /// Sends one request of method `M` and returns its typed result.
    pub async fn request<M: Method>(&self, params: M::Params) -> Result<M::Result, ClientError> {
        let params = serde_json::to_value(params).map_err(|e| ClientError::Decode(format!("{}: {e}", M::NAME)))?;
        let v = self.send(M::NAME, params).await?;
        serde_json::from_value(v).map_err(|e| ClientError::Decode(format!("{}: {e}", M::NAME)))
    }

    /// Sends a request exactly as given, typed or not: for tests that send
    /// what a typed client never would (an unknown method, wrong params).
    pub async fn call_raw(&self, method: &str, params: Value) -> Result<Value, ClientError> {
        self.send(method, params).await
    }

    async fn send(&self, method: &str, params: Value) -> Result<Value, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let closed = || match self.refused.lock().expect("refused").clone() {
            Some(e) => ClientError::Rpc(e),
            None => ClientError::Closed,
        };
        match self.pending.lock().expect("pending").as_mut() {
            Some(waiting) => waiting.insert(id, tx),
            None => return Err(closed()),
        };
        let line =
            serde_json::to_string(&Request::new(id, method, params)).map_err(|e| ClientError::Decode(e.to_string()))?;
        self.out.send(line).await.map_err(|_| closed())?;
        let resp = rx.await.map_err(|_| closed())?;
        match (resp.result, resp.error) {
            (_, Some(e)) => Err(ClientError::Rpc(e)),
            (Some(v), None) => Ok(v),
            (None, None) => Ok(Value::Null),
        }
    }

    /// Retries, rolls back or cancels one instance; returns it as it is now.
    pub async fn operate(
        &self,
        action: OperatorAction,
        id: &str,
        reason: Option<&str>,
    ) -> Result<Instance, ClientError> {
        let p = IdParams { id: id.to_string(), reason: reason.map(str::to_string) };
        match action {
            OperatorAction::Retry => self.request::<m::TasksRetry>(p).await,
            OperatorAction::Rollback => self.request::<m::TasksRollback>(p).await,
            OperatorAction::Cancel => self.request::<m::TasksCancel>(p).await,
        }
    }

    /// A whole timeline, page after page (a large one does not fit in one
    /// answer); a window's end is fixed first, so the pages agree.
    pub async fn timeline(&self, mut p: TimelineParams) -> Result<Timeline, ClientError> {
        if p.ids.is_empty() && p.until.is_none() {
            p.until = Some(chrono::Utc::now());
        }
        let mut t = self.request::<m::TasksTimeline>(p.clone()).await?;
        while let Some(next) = t.next_event {
            p.from_event = Some(next);
            t.extend(self.request::<m::TasksTimeline>(p.clone()).await?);
        }
        Ok(t)
    }

    pub async fn hello(&self, client: &str) -> Result<HelloResult, ClientError> {
        let name = ClientInfo::Named { name: client.into(), version: Some(env!("CARGO_PKG_VERSION").into()) };
        self.request::<m::Hello>(Hello { client: Some(name), protocol: Some(PROTOCOL_VERSION) }).await
    }

    /// Subscribes to `topics`; pushed events arrive on [`Client::take_events`].
    pub async fn subscribe(&self, topics: &[Topic]) -> Result<u64, ClientError> {
        Ok(self.request::<m::Subscribe>(SubscribeParams { topics: topics.to_vec() }).await?.seq)
    }

    /// The stream of pushed events (once).
    pub fn take_events(&self) -> Option<mpsc::Receiver<Event>> {
        self.events.lock().expect("events").take()
    }
}

/// The socket a client uses: the flag, then `APOLLO_SOCKET`, then
/// `./.apollo/agent.sock`, then the system path. Returns every candidate
/// tried, for the message when none answers.
pub fn socket_candidates(flag: Option<&Path>) -> Vec<PathBuf> {
    let env = std::env::var_os("APOLLO_SOCKET").filter(|p| !p.is_empty()).map(PathBuf::from);
    apollo_shared::paths::client_sockets(flag, env.as_deref())
}

/// Connects to the first candidate that answers.
pub async fn connect_default(flag: Option<&Path>) -> Result<Client, ClientError> {
    let mut tried = Vec::new();
    for c in socket_candidates(flag) {
        match Client::connect_unix(&c).await {
            Ok(client) => return Ok(client),
            Err(ClientError::Connect { path, source }) => tried.push((path, source)),
            Err(e) => return Err(e),
        }
    }
    Err(ClientError::NoAgent(tried))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A call made after the reader saw the connection end fails at once: the
    /// console's refresh raced the agent's death this way and waited forever,
    /// never showing "disconnected".
    #[tokio::test]
    async fn a_call_after_the_connection_ended_fails_instead_of_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let client = Client::connect_unix(&path).await.unwrap();
        let mut events = client.take_events().unwrap();
        drop(listener.accept().await.unwrap());
        // The event stream ends when the reader has seen the end.
        assert!(events.recv().await.is_none());
        let call = client.call_raw("agent.status", Value::Null);
        let answer = tokio::time::timeout(Duration::from_secs(10), call).await;
        assert!(matches!(answer, Ok(Err(ClientError::Closed))), "{answer:?}");
    }
}

/// How to reach the agent.
#[derive(Debug, Clone)]
pub enum Target {
    Socket(PathBuf),
    Ssh { target: String, socket: Option<String> },
}

impl Target {
    /// Where a context points.
    pub fn of(c: &crate::contexts::Context) -> Target {
        match (&c.ssh, &c.socket) {
            (Some(t), remote) => {
                Target::Ssh { target: t.clone(), socket: remote.as_ref().map(|p| p.display().to_string()) }
            }
            (None, Some(p)) => Target::Socket(p.clone()),
            // Refused when the file is read; an empty path fails to connect, visibly.
            (None, None) => Target::Socket(PathBuf::new()),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Target::Socket(p) => p.display().to_string(),
            Target::Ssh { target, .. } => format!("ssh {target}"),
        }
    }

    pub async fn connect(&self) -> Result<Client, ClientError> {
        match self {
            Target::Socket(p) => Client::connect_unix(p).await,
            Target::Ssh { target, socket } => Client::connect_ssh(target, socket.as_deref()).await,
        }
    }
}
