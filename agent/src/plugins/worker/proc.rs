//! One worker process of a pool: started as `<exe> serve`, it answers one
//! JSON reply a line on stdout for each request a line on stdin; what it
//! prints on stderr (and its `log` lines) go to the step's log.

use super::super::contract::PluginError;
use super::super::process;
use crate::logs::StepLog;
use futures::StreamExt;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::{Map, Value};
use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, LinesCodec};
use tokio_util::sync::CancellationToken;

/// Bytes a reply may add around its result (`{"id": …, "result": …}`).
pub const ENVELOPE: usize = 4096;
/// Longest stderr line kept as one log line.
const MAX_LOG_LINE: usize = 8192;
/// How often a busy worker's memory is read.
const MEMORY_EVERY: Duration = Duration::from_millis(200);

/// One worker process.
pub struct Worker {
    child: Child,
    pub pid: i32,
    stdin: Option<ChildStdin>,
    stdout: FramedRead<ChildStdout, LinesCodec>,
    /// Lines the worker prints on stderr, read by a task of their own.
    stderr: mpsc::Receiver<String>,
    /// Its last stderr lines, for the message when it dies.
    tail: VecDeque<String>,
    /// The masker of the last call that logged (its secrets' values): the
    /// tail is masked with it before it is cut.
    masker: apollo_shared::def::Masker,
    pub calls: u64,
    pub last_used: Instant,
    /// When its memory was last read.
    memory_read: Instant,
    /// The longest stdout line read.
    line_max: usize,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Whatever the worker started goes with it.
        let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
    }
}

/// How an exchange with a worker ended.
pub enum Exchange {
    /// The worker answered; it can serve again.
    Answered(Result<Map<String, Value>, PluginError>),
    /// The worker must go: it died, overran or broke the protocol.
    Lost(PluginError),
}

impl Worker {
    fn take_stderr(&mut self, log: Option<&StepLog>) {
        while let Ok(line) = self.stderr.try_recv() {
            self.note(&line, log);
        }
    }

    fn note(&mut self, line: &str, log: Option<&StepLog>) {
        if let Some(log) = log {
            self.masker = log.masker();
        }
        // Masked whole, then cut (never inside a `***`).
        let masked = self.masker.text(line);
        match log {
            Some(log) => log.line(&masked),
            None => tracing::debug!(pid = self.pid, "plugin worker stderr: {masked}"),
        }
        if self.tail.len() == 3 {
            self.tail.pop_front();
        }
        self.tail.push_back(apollo_shared::text::until(&masked, 300).to_string());
    }

    /// Sends one request and reads up to its reply, logging what the worker
    /// says meanwhile; `cancel` (the step's timeout or a cancel) stops it.
    pub async fn exchange(
        &mut self,
        verb: &str,
        request: &Value,
        log: Option<&StepLog>,
        cancel: &CancellationToken,
        cap: usize,
        grace: Duration,
    ) -> Exchange {
        self.take_stderr(None);
        let id = request["id"].as_u64().unwrap_or_default();
        let mut line = serde_json::to_vec(request).unwrap_or_default();
        line.push(b'\n');
        let Some(stdin) = self.stdin.as_mut() else {
            return Exchange::Lost(PluginError::retryable(format!("{verb}: the worker's stdin is closed")));
        };
        let wrote = tokio::select! {
            r = async { stdin.write_all(&line).await?; stdin.flush().await } => r,
            _ = cancel.cancelled() => {
                self.stop(grace).await;
                return Exchange::Lost(PluginError::retryable(format!("{verb} was stopped")));
            }
        };
        if wrote.is_err() {
            return Exchange::Lost(self.died(verb).await);
        }
        loop {
            tokio::select! {
                next = self.stdout.next() => match next {
                    Some(Ok(text)) => {
                        if let Some(done) = self.reply(verb, id, &text, log, cap) {
                            self.take_stderr(log);
                            return Exchange::Answered(done);
                        }
                    }
                    Some(Err(tokio_util::codec::LinesCodecError::MaxLineLengthExceeded)) => {
                        self.stop(grace).await;
                        return Exchange::Lost(PluginError::permanent(format!(
                            "{verb} printed a line over the {} byte limit for a reply: write large data to a file in the work dir and return its path",
                            self.line_max
                        )));
                    }
                    Some(Err(_)) | None => return Exchange::Lost(self.died(verb).await),
                },
                Some(text) = self.stderr.recv() => self.note(&text, log),
                _ = cancel.cancelled() => {
                    self.stop(grace).await;
                    return Exchange::Lost(PluginError::retryable(format!("{verb} was stopped")));
                }
            }
        }
    }

    /// One stdout line: the reply to call `id` (`Some`), or a log line.
    fn reply(
        &mut self,
        verb: &str,
        id: u64,
        text: &str,
        log: Option<&StepLog>,
        cap: usize,
    ) -> Option<Result<Map<String, Value>, PluginError>> {
        let msg = match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) if m.get("id").and_then(Value::as_u64) == Some(id) => m,
            _ => {
                // Not a reply to this call: a stray print. Logged, not fatal.
                if !text.trim().is_empty() {
                    self.note(&format!("stdout: {text}"), log);
                }
                return None;
            }
        };
        if let Some(line) = msg.get("log") {
            let line = line.as_str().map(str::to_string).unwrap_or_else(|| line.to_string());
            self.note(&line, log);
            return None;
        }
        if text.len() > cap + ENVELOPE {
            return Some(Err(PluginError::permanent(format!(
                "{verb} replied with {} bytes, over the {cap} byte limit for a result: write large data to a file in the work dir and return its path",
                text.len()
            ))));
        }
        Some(match (msg.get("result"), msg.get("error")) {
            (Some(Value::Object(r)), None) => Ok(r.clone()),
            (Some(other), None) => Err(PluginError::permanent(format!(
                "{verb} replied with a result that is not an object ({})",
                apollo_shared::def::kind(other)
            ))),
            (None, Some(e)) => {
                let message = e.as_str().map(str::to_string).unwrap_or_else(|| e.to_string());
                if msg.get("retryable").and_then(Value::as_bool).unwrap_or(false) {
                    Err(PluginError::retryable(format!("{verb} asked to be retried: {message}")))
                } else {
                    Err(PluginError::permanent(format!("{verb} failed (permanent): {message}")))
                }
            }
            _ => Err(PluginError::permanent(format!(
                "{verb} replied without exactly one of \"result\" or \"error\": {}",
                text.chars().take(200).collect::<String>()
            ))),
        })
    }

    /// The worker's stdout closed: it died (or is dying). Returns the
    /// retryable error for the call in flight, naming how it ended.
    async fn died(&mut self, verb: &str) -> PluginError {
        let status = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await;
        self.take_stderr(None);
        use std::os::unix::process::ExitStatusExt;
        let how = match status {
            Ok(Ok(s)) => match (s.code(), s.signal()) {
                (Some(c), _) => format!("exited with code {c}"),
                (None, Some(sig)) => {
                    let name =
                        Signal::try_from(sig).map(|s| s.as_str().to_string()).unwrap_or_else(|_| sig.to_string());
                    format!("was killed by signal {name}")
                }
                _ => "ended".to_string(),
            },
            _ => "closed its stdout".to_string(),
        };
        let tail: Vec<String> = self.tail.iter().cloned().collect();
        PluginError::retryable(format!(
            "{verb}: worker pid {} {how} during the call; stderr: {:?}",
            self.pid,
            tail.join(" | ")
        ))
    }

    /// Stops the worker and its group: SIGTERM, SIGKILL after `grace`.
    async fn stop(&mut self, grace: Duration) {
        let group = Pid::from_raw(self.pid);
        let _ = killpg(group, Signal::SIGTERM);
        if tokio::time::timeout(grace, self.child.wait()).await.is_err() {
            let _ = killpg(group, Signal::SIGKILL);
            let _ = self.child.wait().await;
        }
    }

    /// Whether its resident memory (from /proc) is over `limit_mb`. Read
    /// after its first call and then at most every [`MEMORY_EVERY`], so a
    /// busy worker does not pay a /proc read per call.
    pub fn over_memory(&mut self, limit_mb: u64) -> bool {
        if self.calls > 1 && self.memory_read.elapsed() < MEMORY_EVERY {
            return false;
        }
        self.memory_read = Instant::now();
        let statm = std::fs::read_to_string(format!("/proc/{}/statm", self.pid)).unwrap_or_default();
        let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        pages * 4096 / (1024 * 1024) > limit_mb
    }

    /// Whether it has exited while idle.
    pub fn gone(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }
}

/// Ends a worker politely: its stdin closes (a worker ends at EOF), and it
/// is killed with its group if it is still there after the grace.
pub fn retire(mut w: Worker, grace: Duration) {
    w.stdin = None;
    tokio::spawn(async move {
        let _ = tokio::time::timeout(grace, w.child.wait()).await;
        drop(w);
    });
}

pub fn spawn(path: &Path, pass_env: &[String], line_max: usize) -> Result<Worker, String> {
    let mut cmd = tokio::process::Command::new(path);
    cmd.arg("serve")
        .env_clear()
        .envs(process::clean_env(pass_env, vec![("APOLLO_WORKER".into(), "1".into())]))
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    process::isolate(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| format!("{} serve: {e}", path.display()))?;
    let pid = child.id().ok_or("the worker exited at once")? as i32;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(read_lines(stderr, tx));
    tracing::debug!(plugin = %path.display(), pid, "plugin worker started");
    Ok(Worker {
        child,
        pid,
        stdin,
        stdout: FramedRead::new(stdout, LinesCodec::new_with_max_length(line_max)),
        stderr: rx,
        tail: VecDeque::new(),
        masker: Default::default(),
        calls: 0,
        last_used: Instant::now(),
        memory_read: Instant::now(),
        line_max,
    })
}

/// Reads a stream as lines of at most [`MAX_LOG_LINE`] bytes until it
/// ends; lines the receiver has no room for are dropped, so a chatty worker
/// never blocks on a full pipe.
async fn read_lines(mut r: impl tokio::io::AsyncRead + Unpin, tx: mpsc::Sender<String>) {
    let mut buf = vec![0u8; 8192];
    let mut line = Vec::new();
    while let Ok(n) = r.read(&mut buf).await {
        if n == 0 {
            break;
        }
        for &b in &buf[..n] {
            if b == b'\n' || line.len() >= MAX_LOG_LINE {
                let _ = tx.try_send(String::from_utf8_lossy(&line).into_owned());
                line.clear();
                if b == b'\n' {
                    continue;
                }
            }
            line.push(b);
        }
    }
    if !line.is_empty() {
        let _ = tx.try_send(String::from_utf8_lossy(&line).into_owned());
    }
}
