//! Per-step logs: what a subprocess printed and what a built-in said, one
//! file per step under `<data dir>/logs/<instance>/<seq>.log`, capped in size.
//! The file is created on the first line, so silent steps cost nothing.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub struct StepLog {
    path: PathBuf,
    cap: u64,
    state: Mutex<LogState>,
}

#[derive(Default)]
struct LogState {
    file: Option<std::fs::File>,
    written: u64,
    truncated: bool,
}

impl StepLog {
    pub fn new(path: PathBuf, cap: u64) -> StepLog {
        StepLog { path, cap, state: Mutex::new(LogState::default()) }
    }

    pub fn path_for(data_dir: &Path, instance: &str, seq: u32) -> PathBuf {
        data_dir.join("logs").join(instance).join(format!("{seq}.log"))
    }

    /// Appends one line (a newline is added). Past the cap, one note is
    /// written and the rest dropped; logging never fails a step.
    pub fn line(&self, text: &str) {
        let mut st = self.state.lock().expect("step log");
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
