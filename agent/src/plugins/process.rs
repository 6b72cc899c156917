//! Subprocesses run in their own process group, so a timeout or a cancel
//! stops the command and everything it started: SIGTERM to the group, then
//! SIGKILL after a grace period. Output is read as it comes, into the step's
//! log and a bounded tail; memory does not grow with what a command prints.

use crate::logs::StepLog;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

/// Bytes of stdout kept for the step's output.
const TAIL_BYTES: usize = 4096;
/// Longest log line; longer ones are split.
const MAX_LINE: usize = 8192;

pub struct Spec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// Start from an empty environment (plus `env`) instead of the agent's.
    pub clean_env: bool,
    /// Written to stdin, which is then closed; `None` leaves stdin empty.
    pub stdin: Option<Vec<u8>>,
    /// Keep stdout (up to this many bytes) as the result instead of logging it.
    pub capture_stdout: Option<usize>,
}

pub struct Outcome {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The last bytes of stdout (logged mode) or its first bytes (capture mode).
    pub stdout_tail: String,
    /// Bytes printed on stdout in all.
    pub stdout_bytes: u64,
    /// The last bytes of stderr.
    pub stderr_tail: String,
    /// The run was stopped by the cancel token (timeout or cancel).
    pub stopped: bool,
}

/// Kills the whole group if the run is dropped before it finished.
struct GroupGuard(Option<Pid>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

pub async fn run(
    spec: Spec,
    log: Option<&StepLog>,
    cancel: CancellationToken,
    grace: Duration,
) -> Result<Outcome, String> {
    let (program, args) = spec.argv.split_first().ok_or("empty command")?;
    let mut cmd = tokio::process::Command::new(program);
    if spec.clean_env {
        cmd.env_clear();
    }
    cmd.args(args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.cwd)
        .stdin(if spec.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().map_err(|e| format!("cannot start {program:?}: {e}"))?;
    let pgid = child.id().map(|id| Pid::from_raw(id as i32));
    let mut guard = GroupGuard(pgid);
    if let (Some(doc), Some(mut stdin)) = (spec.stdin, child.stdin.take()) {
        // Written from its own task so a plugin that never reads cannot block us;
        // dropping the handle closes stdin.
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = stdin.write_all(&doc).await;
        });
    }
    let out_buf = Arc::new(Mutex::new(Buffer::new(spec.capture_stdout)));
    let err_buf = Arc::new(Mutex::new(Buffer::new(None)));
    let out = child.stdout.take().expect("piped stdout");
    let err = child.stderr.take().expect("piped stderr");
    let log_stdout = spec.capture_stdout.is_none();
    let readers = async {
        tokio::join!(pump(out, log.filter(|_| log_stdout), out_buf.clone()), pump(err, log, err_buf.clone()));
    };
    tokio::pin!(readers);

    // Resolves to the exit status and whether the cancel token stopped the run.
    let waiting = async {
        tokio::select! {
            s = child.wait() => (s, false),
            _ = cancel.cancelled() => {
                if let Some(g) = pgid { let _ = killpg(g, Signal::SIGTERM); }
                let s = match tokio::time::timeout(grace, child.wait()).await {
                    Ok(s) => s,
                    Err(_) => {
                        if let Some(log) = log {
                            log.line(&format!("[apollo: still running {}s after SIGTERM; sending SIGKILL]", grace.as_secs_f64()));
                        }
                        if let Some(g) = pgid { let _ = killpg(g, Signal::SIGKILL); }
                        child.wait().await
                    }
                };
                (s, true)
            }
        }
    };
    tokio::pin!(waiting);
    // The pipes are read while the process runs, or a chatty process would
    // block on a full pipe.
    let mut drained = false;
    let (status, stopped) = loop {
        tokio::select! {
            s = &mut waiting => break s,
            _ = &mut readers, if !drained => drained = true,
        }
    };
    let status = status.map_err(|e| format!("waiting for {program:?}: {e}"))?;
    if stopped {
        // Whatever the command started dies with it.
        if let Some(g) = pgid {
            let _ = killpg(g, Signal::SIGKILL);
        }
    }
    guard.0 = None;
    // A background grandchild may hold the pipes open; don't wait for it long.
    if !drained {
        let _ = tokio::time::timeout(Duration::from_millis(500), &mut readers).await;
    }
    use std::os::unix::process::ExitStatusExt;
    let out = out_buf.lock().expect("stdout");
    let err = err_buf.lock().expect("stderr");
    Ok(Outcome {
        code: status.code(),
        signal: status.signal(),
        stdout_tail: String::from_utf8_lossy(&out.bytes).into_owned(),
        stdout_bytes: out.total,
        stderr_tail: String::from_utf8_lossy(&err.bytes).into_owned(),
        stopped,
    })
}

/// What is kept of one stream: its last [`TAIL_BYTES`], or (capture mode)
/// its first `cap` bytes. Memory stays bounded whatever the process prints.
struct Buffer {
    bytes: Vec<u8>,
    total: u64,
    capture: Option<usize>,
}

impl Buffer {
    fn new(capture: Option<usize>) -> Self {
        Buffer { bytes: Vec::new(), total: 0, capture }
    }

    fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        match self.capture {
            Some(cap) => {
                let room = (cap + 1).saturating_sub(self.bytes.len());
                self.bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            None => {
                self.bytes.extend_from_slice(chunk);
                if self.bytes.len() > TAIL_BYTES {
                    let cut = self.bytes.len() - TAIL_BYTES;
                    self.bytes.drain(..cut);
                }
            }
        }
    }
}

async fn pump(mut r: impl AsyncRead + Unpin, log: Option<&StepLog>, keep: Arc<Mutex<Buffer>>) {
    let mut buf = vec![0u8; 8192];
    let mut line: Vec<u8> = Vec::new();
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        keep.lock().expect("buffer").push(&buf[..n]);
        let Some(log) = log else { continue };
        if log.truncated() {
            continue;
        }
        for &b in &buf[..n] {
            if b == b'\n' || line.len() >= MAX_LINE {
                log.line(&String::from_utf8_lossy(&line));
                line.clear();
                if b == b'\n' {
                    continue;
                }
            }
            line.push(b);
        }
    }
    if let Some(log) = log.filter(|_| !line.is_empty()) {
        log.line(&String::from_utf8_lossy(&line));
    }
}

/// Describes how a process ended, for error messages.
pub fn describe_exit(o: &Outcome) -> String {
    match (o.code, o.signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => {
            let name = Signal::try_from(s).map(|s| s.as_str().to_string()).unwrap_or_else(|_| s.to_string());
            format!("killed by signal {name}")
        }
        _ => "ended without a status".into(),
    }
}
