//! The socket server: accepts connections on the Unix socket, decides each
//! peer's role from its credentials, and serves JSON-RPC on it.
//!
//! Layout:
//! - `frame`: capped newline framing.
//! - `conn`: one connection — requests, responses, pushed notifications.
//! - `api`: what each method does.
//! - `dial`: `apollo-agent dial-stdio`, the bridge SSH uses.

mod api;
mod conn;
pub mod dial;
mod frame;
mod stats;

pub use api::Api;
pub use conn::parse as parse_request;
pub use frame::{Frame, FrameCodec};

use apollo_shared::protocol::Role;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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

/// Who may do what: the agent's own user and root operate; the config names
/// other operators and observers; anyone else is refused.
pub struct Access {
    own_uid: u32,
    /// Operators' and observers' uids; SIGHUP sets them anew.
    roles: std::sync::RwLock<(Vec<u32>, Vec<u32>)>,
}

fn uid_of(name: &str) -> Option<u32> {
    name.parse().ok().or_else(|| nix::unistd::User::from_name(name).ok().flatten().map(|u| u.uid.as_raw()))
}

impl Access {
    pub fn new(socket: &crate::config::Socket) -> Access {
        let access = Access { own_uid: nix::unistd::getuid().as_raw(), roles: Default::default() };
        access.set(socket);
        access
    }

    /// Resolves the configured names to uids and puts them in force.
    pub fn set(&self, socket: &crate::config::Socket) {
        let resolve = |names: &[String]| {
            names
                .iter()
                .filter_map(|n| {
                    let uid = uid_of(n);
                    if uid.is_none() {
                        tracing::warn!(user = %n, "socket access: unknown user, ignored");
                    }
                    uid
                })
                .collect()
        };
        *self.roles.write().expect("roles") = (resolve(&socket.operators), resolve(&socket.observers));
    }

    pub fn role(&self, uid: u32) -> Option<Role> {
        let (operators, observers) = &*self.roles.read().expect("roles");
        if uid == 0 || uid == self.own_uid || operators.contains(&uid) {
            Some(Role::Operator)
        } else if observers.contains(&uid) {
            Some(Role::Observer)
        } else {
            None
        }
    }
}

/// Serves connections until `shutdown`; each connection runs on its own
/// task, and one connection's failure never stops the server.
pub async fn serve(listener: UnixListener, api: Arc<Api>, access: Arc<Access>, shutdown: CancellationToken) {
    let tracker = TaskTracker::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let (api, access, shutdown) = (api.clone(), access.clone(), shutdown.clone());
                    tracker.spawn(async move { conn::handle(stream, api, access, shutdown).await });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.cancelled() => break,
        }
    }
    tracker.close();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), tracker.wait()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_set_again_take_effect() {
        let socket = |operators: &[&str], observers: &[&str]| crate::config::Socket {
            path: None,
            operators: operators.iter().map(|s| s.to_string()).collect(),
            observers: observers.iter().map(|s| s.to_string()).collect(),
        };
        let access = Access::new(&socket(&[], &["4242"]));
        assert_eq!(access.role(4242), Some(Role::Observer));
        access.set(&socket(&["4242"], &[]));
        assert_eq!(access.role(4242), Some(Role::Operator));
        access.set(&socket(&[], &[]));
        assert_eq!(access.role(4242), None);
    }
}
