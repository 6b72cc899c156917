//! Subprocesses run in their own process group, so a timeout or a cancel
//! stops the command and everything it started: SIGTERM to the group, then
//! SIGKILL after a grace period. Output is read as it comes, into the step's
//! log and a bounded tail; memory does not grow with what a command prints.

use crate::logs::StepLog;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

mod output;
pub use output::RESULT_LINE_BYTES;

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
    /// The step this process runs for (`<instance>:<seq>`, its idempotency
    /// key): its process group is recorded under it while it runs, so a
    /// restarted agent can find and stop what an earlier life left running.
    pub step_key: Option<String>,
}

/// Variables a step's process inherits from the agent's environment; nothing
/// else of it (a database password, a token) reaches a step unless named.
pub const ALLOWED_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "TMPDIR"];

/// A clean environment: the allowlist, the variables a registration passes
/// through, then `extra` (the call's own variables, which win).
pub fn clean_env(pass: &[String], extra: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = ALLOWED_ENV
        .iter()
        .map(|k| k.to_string())
        .chain(pass.iter().cloned())
        .filter_map(|k| std::env::var(&k).ok().map(|v| (k, v)))
        .collect();
    env.extend(extra);
    env
}

/// The environment variable that names the step a process runs for. Every
/// descendant inherits it; a restarted agent looks for it in `/proc`.
pub const STEP_VAR: &str = "APOLLO_IDEMPOTENCY_KEY";

/// Where running steps' process groups are recorded (`<data>/procs`).
static RECORDS: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Records step process groups under `data_dir` from now on.
pub fn record_in(data_dir: &Path) {
    let dir = data_dir.join("procs");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot create the process record dir");
    }
    let _ = RECORDS.set(dir);
}

fn record_path(key: &str) -> Option<PathBuf> {
    RECORDS.get().map(|d| d.join(key.replace([':', '/'], ".")))
}

/// The step's key (`<instance>:<seq>`) of a key, a fan-out item's
/// (`<instance>:<seq>:<index>:<item>`) or the step's own.
fn step_of(key: &str) -> String {
    key.splitn(3, ':').take(2).collect::<Vec<_>>().join(":")
}

/// This boot's id, read once: it is the same for the life of the agent.
fn boot_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default().trim().to_string())
}

/// What `/proc/<pid>/stat` says of a process: (state, process group, start time in ticks since boot).
fn stat(pid: i32) -> Option<(char, i32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses; the fields follow the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.first()?.chars().next()?, f.get(2)?.parse().ok()?, f.get(19)?.parse().ok()?))
}

/// Notes a step's process group (the leader's pid and start time, and the
/// boot) while it runs. Not synced: it must survive the agent, not the host,
/// whose reboot ends the processes anyway.
fn record(key: &str, pgid: i32) {
    let (Some(path), Some((_, _, start))) = (record_path(key), stat(pgid)) else { return };
    if let Err(e) = std::fs::write(&path, format!("{pgid} {start} {}\n", boot_id())) {
        tracing::warn!(path = %path.display(), error = %e, "cannot record a step's process group");
    }
}

/// Stops every process an earlier life of the agent left running for these
/// steps: those whose environment names one of them ([`STEP_VAR`]), and the
/// members of each step's recorded process group (the same boot, started no
/// earlier than the group's leader, so a reused pid never matches). Their
/// groups get SIGKILL, and this waits (up to 5 s) until they are gone, so a
/// step is never run while an earlier copy of it still runs. The fan-out
/// items in `spare` (their keys) run for a live agent and are left alone.
/// Returns a line for each process stopped.
pub fn reap(keys: &HashSet<String>, spare: &HashSet<String>) -> Vec<String> {
    if keys.is_empty() {
        return Vec::new();
    }
    let boot = boot_id();
    let mut groups: HashMap<i32, u64> = HashMap::new();
    // A fan-out step's items are recorded under the step's key and theirs.
    let records: Vec<PathBuf> = match RECORDS.get() {
        Some(dir) => std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    let key = n.replace('.', ":");
                    keys.contains(&step_of(&key)) && !spare.contains(&key)
                })
            })
            .collect(),
        None => Vec::new(),
    };
    for path in &records {
        let Ok(text) = std::fs::read_to_string(path) else { continue };
        let f: Vec<&str> = text.split_whitespace().collect();
        if let [pgid, start, b] = f[..] {
            if b == boot {
                if let (Ok(g), Ok(s)) = (pgid.parse(), start.parse()) {
                    groups.insert(g, s);
                }
            }
        }
    }
    let me = std::process::id() as i32;
    let my_group = nix::unistd::getpgrp().as_raw();
    let mut victims = Vec::new();
    let mut kill_groups = HashSet::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Some((state, pgrp, start)) = stat(pid) else { continue };
        if state == 'Z' {
            continue;
        }
        let by_env = std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
            env.split(|b| *b == 0).any(|kv| {
                std::str::from_utf8(kv)
                    .ok()
                    .and_then(|kv| kv.strip_prefix(STEP_VAR)?.strip_prefix('='))
                    .is_some_and(|v| (keys.contains(v) || keys.contains(&step_of(v))) && !spare.contains(v))
            })
        });
        let by_group = groups.get(&pgrp).is_some_and(|leader| start >= *leader);
        if by_env || by_group {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            victims.push((pid, String::from_utf8_lossy(&cmd).replace('\0', " ").trim().to_string()));
            if pgrp > 1 && pgrp != my_group {
                kill_groups.insert(pgrp);
            }
        }
    }
    for g in &kill_groups {
        let _ = killpg(Pid::from_raw(*g), Signal::SIGKILL);
    }
    for (pid, _) in &victims {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while victims.iter().any(|(pid, _)| stat(*pid).is_some_and(|(st, _, _)| st != 'Z'))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    for p in records {
        let _ = std::fs::remove_file(p);
    }
    victims.into_iter().map(|(pid, cmd)| format!("pid {pid} ({cmd})")).collect()
}

/// Runs the command in its own process group, killed with the agent: the
/// child dies with the agent (a parent-death signal), so a killed agent
/// leaves no plugin running; if the agent died before the signal was set,
/// the child's parent is already someone else and it exits at once.
pub fn isolate(cmd: &mut tokio::process::Command) {
    cmd.process_group(0);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

pub struct Outcome {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The last bytes of stdout (logged mode, secrets masked) or its first bytes (capture mode).
    pub stdout_tail: String,
    /// Bytes printed on stdout in all.
    pub stdout_bytes: u64,
    /// Stdout's last non-empty line, up to [`RESULT_LINE_BYTES`] (logged mode).
    pub last_line: Vec<u8>,
    /// That line's whole length, which may exceed what was kept.
    pub last_line_bytes: u64,
    /// The last bytes of stderr, the step's secrets masked.
    pub stderr_tail: String,
    /// The run was stopped by the cancel token (timeout or cancel).
    pub stopped: bool,
}

/// Kills the whole group if the run is dropped before it finished, and
/// forgets the group's record when the run ends either way.
struct GroupGuard(Option<Pid>, Option<PathBuf>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
        if let Some(p) = &self.1 {
            let _ = std::fs::remove_file(p);
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
        .stderr(Stdio::piped());
    isolate(&mut cmd);
    if let Some(key) = &spec.step_key {
        cmd.env(STEP_VAR, key);
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot start {program:?}: {e}"))?;
    let pgid = child.id().map(|id| Pid::from_raw(id as i32));
    let record_file = match (&spec.step_key, pgid) {
        (Some(key), Some(g)) => {
            record(key, g.as_raw());
            record_path(key)
        }
        _ => None,
    };
    let mut guard = GroupGuard(pgid, record_file);
    if let (Some(doc), Some(mut stdin)) = (spec.stdin, child.stdin.take()) {
        // Written from its own task so a plugin that never reads cannot block us;
        // dropping the handle closes stdin.
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = stdin.write_all(&doc).await;
        });
    }
    // The tails are masked before they are cut (see `Buffer::text`).
    let masker = log.map(StepLog::masker).unwrap_or_default();
    let out_buf = Arc::new(Mutex::new(output::Buffer::new(spec.capture_stdout, masker.longest())));
    let err_buf = Arc::new(Mutex::new(output::Buffer::new(None, masker.longest())));
    let out = child.stdout.take().expect("piped stdout");
    let err = child.stderr.take().expect("piped stderr");
    let log_stdout = spec.capture_stdout.is_none();
    let readers = async {
        tokio::join!(
            output::pump(out, log.filter(|_| log_stdout), out_buf.clone(), &masker),
            output::pump(err, log, err_buf.clone(), &masker)
        );
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
    let mut out = out_buf.lock().expect("stdout");
    out.end_line();
    let err = err_buf.lock().expect("stderr");
    Ok(Outcome {
        code: status.code(),
        signal: status.signal(),
        stdout_tail: out.text(&masker),
        stdout_bytes: out.total,
        last_line: std::mem::take(&mut out.last),
        last_line_bytes: out.last_len,
        stderr_tail: err.text(&masker),
        stopped,
    })
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
