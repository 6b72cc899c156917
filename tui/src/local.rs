//! `--local`: start an agent with the default config in the current
//! directory (or reuse one already listening there), and stop the one we
//! started when done.

use crate::client::{Client, ClientError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub struct LocalAgent {
    child: tokio::process::Child,
    pub log: PathBuf,
}

/// The agent binary: next to this executable, else `apollo-agent` in PATH.
pub fn agent_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("apollo-agent")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("apollo-agent"))
}

/// Connects to the agent of `dir` (its `.apollo/agent.sock`), starting one
/// when none answers. The second value is the agent started here, if any.
pub async fn attach(dir: &Path) -> Result<(Client, Option<LocalAgent>), ClientError> {
    let socket = dir.join(".apollo").join("agent.sock");
    if let Ok(c) = Client::connect_unix(&socket).await {
        return Ok((c, None));
    }
    let data = dir.join(".apollo");
    std::fs::create_dir_all(&data).map_err(|source| ClientError::Connect { path: data.clone(), source })?;
    let log = data.join("agent.log");
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|source| ClientError::Connect { path: log.clone(), source })?;
    let err = out.try_clone().map_err(|source| ClientError::Connect { path: log.clone(), source })?;
    let bin = agent_binary();
    let mut cmd = tokio::process::Command::new(&bin);
    // The agent ends with this process even when it dies without stopping
    // it (a signal, a closed pipe): a local agent never outlives its user.
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM).map_err(std::io::Error::from)
        });
    }
    let mut child = cmd
        .current_dir(dir)
        .env_remove("APOLLO_SOCKET")
        .env_remove("APOLLO_CONFIG")
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| ClientError::Spawn { command: bin.display().to_string(), source })?;
    // Wait for the socket to answer; the agent binds it once it is ready.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(c) = Client::connect_unix(&socket).await {
            return Ok((c, Some(LocalAgent { child, log })));
        }
        if let Ok(Some(status)) = child.try_wait() {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            let msg = format!(
                "the local agent exited ({status}) before it was ready; last lines of {}:\n{}",
                log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
            return Err(ClientError::Connect { path: socket, source: std::io::Error::other(msg) });
        }
        if Instant::now() > deadline {
            return Err(ClientError::Connect {
                path: socket,
                source: std::io::Error::other(format!("the local agent did not start in 30s; see {}", log.display())),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl LocalAgent {
    /// SIGTERM, then wait for the clean shutdown.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
        }
        if tokio::time::timeout(Duration::from_secs(40), self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
    }
}
