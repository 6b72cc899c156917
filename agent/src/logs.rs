//! Per-step logs: what a subprocess printed and what a built-in said, one
//! file per step under `<data dir>/logs/<instance>/<seq>.log`, capped in size.
//! The file is created on the first line, so silent steps cost nothing.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use tokio::sync::Notify;

pub struct StepLog {
    path: PathBuf,
    cap: u64,
    state: Mutex<LogState>,
    /// Wakes whoever follows this log (`steps.logs` with `wait_ms`) when a
    /// line is written: taken at the first line, so a silent attempt looks
    /// up no notifier (see [`StepLog::drop`]).
    grew: OnceLock<Arc<Notify>>,
}

#[derive(Default)]
struct LogState {
    file: Option<std::fs::File>,
    written: u64,
    truncated: bool,
    /// The attempt's first line, if anything is written (see [`StepLog::opening`]).
    opening: Option<String>,
    /// A line to write first if anything else is written (see [`StepLog::header`]).
    header: Option<String>,
    /// Secrets' values, replaced with `***` in every line (see [`StepLog::mask`]).
    masker: apollo_shared::def::Masker,
}

/// The notifier of each log being written or followed, by path: held
/// strongly by writers and waiters, so an entry lives while either does.
static GROWTH: Mutex<Option<HashMap<PathBuf, Weak<Notify>>>> = Mutex::new(None);

/// How many callers follow a log at this moment (see [`follow`]).
static FOLLOWERS: AtomicUsize = AtomicUsize::new(0);

/// A follower of a log: its notifier, which fires when the log grows and
/// when the attempt writing it ends.
pub struct Follow {
    pub grew: Arc<Notify>,
}

/// Follows the log at `path` until the [`Follow`] is dropped.
pub fn follow(path: &Path) -> Follow {
    FOLLOWERS.fetch_add(1, Ordering::SeqCst);
    Follow { grew: growth(path) }
}

impl Drop for Follow {
    fn drop(&mut self) {
        FOLLOWERS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The notifier that fires when the log at `path` grows.
fn growth(path: &Path) -> Arc<Notify> {
    let mut map = GROWTH.lock().expect("log growth");
    let map = map.get_or_insert_with(HashMap::new);
    if let Some(n) = map.get(path).and_then(Weak::upgrade) {
        return n;
    }
    // Forget the logs nobody writes or follows any more, now and then.
    if map.len() >= 64 && map.len().is_power_of_two() {
        map.retain(|_, w| w.strong_count() > 0);
    }
    let n = Arc::new(Notify::new());
    map.insert(path.to_path_buf(), Arc::downgrade(&n));
    n
}

impl StepLog {
    pub fn new(path: PathBuf, cap: u64) -> StepLog {
        StepLog { path, cap, state: Mutex::new(LogState::default()), grew: OnceLock::new() }
    }

    /// The line that opens this attempt's part of the log
    /// (`[apollo: step NAME, attempt N]`), written before anything else the
    /// attempt writes, and not at all by a silent attempt.
    pub fn opening(&self, text: &str) {
        self.state.lock().expect("step log").opening = Some(text.to_string());
    }

    /// Every line written from now on has these secrets' values masked.
    pub fn mask(&self, masker: apollo_shared::def::Masker) {
        self.state.lock().expect("step log").masker = masker;
    }

    /// The secrets' values this log masks: for what a step cuts from its
    /// output before the executor masks it (an error's lines, a tail), which
    /// must be masked before it is cut.
    pub fn masker(&self) -> apollo_shared::def::Masker {
        self.state.lock().expect("step log").masker.clone()
    }

    pub fn path_for(data_dir: &Path, instance: &str, seq: u32) -> PathBuf {
        log_path(data_dir, instance, format_args!("{seq}.log"))
    }

    /// A fan-out item's log: `<seq>.<index>.log` beside its step's.
    pub fn item_path(data_dir: &Path, instance: &str, seq: u32, index: u32) -> PathBuf {
        log_path(data_dir, instance, format_args!("{seq}.{index}.log"))
    }

    /// A line that heads the log if the step writes one: written before the
    /// first line, and not at all by a silent step, whose log stays
    /// uncreated (a file per step would cost more than the step). A later
    /// header replaces one not yet written.
    pub fn header(&self, text: &str) {
        self.state.lock().expect("step log").header = Some(text.to_string());
    }

    /// Appends one line (a newline is added), after the pending header if
    /// any. Past the cap, one note is written and the rest dropped; logging
    /// never fails a step.
    pub fn line(&self, text: &str) {
        let mut st = self.state.lock().expect("step log");
        for first in [st.opening.take(), st.header.take()].into_iter().flatten() {
            self.write(&mut st, &first);
        }
        if st.masker.is_empty() {
            self.write(&mut st, text);
        } else {
            let masked = st.masker.text(text);
            self.write(&mut st, &masked);
        }
        drop(st);
        self.grew.get_or_init(|| growth(&self.path)).notify_waiters();
    }

    fn write(&self, st: &mut LogState, text: &str) {
        if st.truncated {
            return;
        }
        if st.file.is_none() {
            if let Some(dir) = self.path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            match std::fs::OpenOptions::new().create(true).append(true).open(&self.path) {
                Ok(f) => {
                    st.written = f.metadata().map(|m| m.len()).unwrap_or(0);
                    st.file = Some(f);
                }
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "cannot open step log");
                    st.truncated = true;
                    return;
                }
            }
        }
        let len = text.len() as u64 + 1;
        // One write a line: the line and its newline together.
        let line = if st.written + len > self.cap {
            st.truncated = true;
            format!("[apollo: log truncated at {} bytes; later output dropped]\n", self.cap)
        } else {
            st.written += len;
            format!("{text}\n")
        };
        if let Some(f) = st.file.as_mut() {
            let _ = f.write_all(line.as_bytes());
        }
    }

    pub fn truncated(&self) -> bool {
        self.state.lock().expect("step log").truncated
    }
}

impl Drop for StepLog {
    /// The attempt has ended (its log is dropped after its outcome is
    /// committed): whoever follows the log looks at the step again. A
    /// silent attempt's log looks its notifier up only while someone
    /// follows a log; a follower that comes later reads the step's state
    /// after it listens, and finds the end committed.
    fn drop(&mut self) {
        let grew = match self.grew.get() {
            Some(n) => Some(n.clone()),
            None if FOLLOWERS.load(Ordering::SeqCst) > 0 => {
                GROWTH.lock().expect("log growth").as_ref().and_then(|m| m.get(&self.path)).and_then(Weak::upgrade)
            }
            None => None,
        };
        if let Some(n) = grew {
            n.notify_waiters();
        }
    }
}

/// `<data dir>/logs/<instance>/<file>`, written into one buffer (a step's
/// start makes one: three `Path::join`s each copied the path again).
fn log_path(data_dir: &Path, instance: &str, file: std::fmt::Arguments) -> PathBuf {
    use std::fmt::Write as _;
    let mut tail = String::with_capacity(instance.len() + 24);
    let _ = write!(tail, "logs/{instance}/{file}");
    let mut path = std::ffi::OsString::with_capacity(data_dir.as_os_str().len() + 1 + tail.len());
    path.push(data_dir.as_os_str());
    if !data_dir.as_os_str().is_empty() && !data_dir.as_os_str().as_encoded_bytes().ends_with(b"/") {
        path.push("/");
    }
    path.push(tail);
    PathBuf::from(path)
}

/// Reads a step log from `offset`, at most `max` bytes.
pub fn read(path: &Path, offset: u64, max: usize) -> std::io::Result<(String, u64, bool)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((String::new(), 0, true)),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let offset = offset.min(len);
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::with_capacity(max.min((len - offset) as usize));
    f.take(max as u64).read_to_end(&mut buf)?;
    let next = offset + buf.len() as u64;
    Ok((String::from_utf8_lossy(&buf).into_owned(), next, next >= len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_is_written_before_the_first_line_and_not_for_a_silent_step() {
        let dir = tempfile::tempdir().unwrap();
        let silent = StepLog::new(dir.path().join("i/0.log"), 1024);
        silent.header("[header 0]");
        assert!(!dir.path().join("i").exists(), "a silent step creates nothing");

        let log = StepLog::new(dir.path().join("i/1.log"), 1024);
        log.header("[first header]");
        log.header("[header]");
        log.line("one");
        log.line("two");
        let text = std::fs::read_to_string(dir.path().join("i/1.log")).unwrap();
        assert_eq!(text, "[header]\none\ntwo\n");

        let log = StepLog::new(dir.path().join("i/2.log"), 1024);
        log.opening("[apollo: step x, attempt 2]");
        log.header("[worker]");
        log.line("three");
        let text = std::fs::read_to_string(dir.path().join("i/2.log")).unwrap();
        assert_eq!(text, "[apollo: step x, attempt 2]\n[worker]\nthree\n");
    }

    #[tokio::test]
    async fn a_follower_is_woken_when_the_log_grows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i/0.log");
        let f = follow(&path);
        let woken = f.grew.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        StepLog::new(path.clone(), 1024).line("hello");
        tokio::time::timeout(std::time::Duration::from_secs(5), woken).await.expect("woken by the line");
        assert!(Arc::ptr_eq(&f.grew, &growth(&path)), "one notifier per log");
    }

    #[test]
    fn a_log_path_is_the_one_path_join_makes() {
        for dir in ["/var/lib/apollo", "/var/lib/apollo/", "data", ""] {
            let d = Path::new(dir);
            assert_eq!(StepLog::path_for(d, "01ABC", 3), d.join("logs").join("01ABC").join("3.log"), "{dir:?}");
            assert_eq!(StepLog::item_path(d, "01ABC", 3, 12), d.join("logs").join("01ABC").join("3.12.log"), "{dir:?}");
        }
    }

    /// A silent attempt takes no notifier, yet its end wakes a follower.
    #[tokio::test]
    async fn a_follower_is_woken_when_a_silent_attempt_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i/0.log");
        let log = StepLog::new(path.clone(), 1024);
        assert!(log.grew.get().is_none(), "no notifier before a line");
        let f = follow(&path);
        let woken = f.grew.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        drop(log);
        tokio::time::timeout(std::time::Duration::from_secs(5), woken).await.expect("woken by the end");
    }
}
