//! The socket server: accepts connections on the Unix socket, decides each
//! peer's role from its credentials, and serves JSON-RPC on it.
//!
//! Layout:
//! - `frame`: capped newline framing.
//! - `access`: who may operate and who may only observe, from the peer's credentials.
//! - `conn`: one connection — requests, responses, pushed notifications.
//! - `api`: what each method does; `reads`: the methods that describe what it holds.
//! - `pauses`: pauses and freeze windows.
//! - `metrics`: `GET /metrics` over HTTP when `metrics.listen` is set.
//! - `dial`: `apollo-agent dial-stdio`, the bridge SSH uses.

mod access;
mod api;
mod approvals;
mod conn;
pub mod dial;
mod frame;
mod metrics;
mod pauses;
mod reads;
mod stats;

pub use access::Access;
pub use api::Api;
pub use conn::parse as parse_request;
pub use frame::{Frame, FrameCodec};
pub use metrics::follow as follow_metrics;

use crate::shutdown::Shutdown;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use tokio::net::UnixListener;

/// Binds the socket (mode 0660), replacing a stale file left by a dead agent.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!("{}: another agent is already listening on this socket", path.display());
        }
        std::fs::remove_file(path)?;
    }
    let listener =
        UnixListener::bind(path).map_err(|e| anyhow::anyhow!("{}: cannot bind the socket: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    Ok(listener)
}

/// Serves connections until the shutdown; each connection runs on a task
/// of its own in the agent's tracker (the drain waits for it), and one
/// connection's failure never stops the server.
pub async fn serve(listener: UnixListener, api: Arc<Api>, access: Arc<Access>, tasks: Shutdown) {
    let shutdown = tasks.token();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let (api, access, shutdown) = (api.clone(), access.clone(), shutdown.clone());
                    tasks.spawn(async move { conn::handle(stream, api, access, shutdown).await });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.cancelled() => break,
        }
    }
}
