//! What a process prints: each stream kept bounded (its tail, or its head in capture mode) and written to the step log line by line, masked.

use crate::logs::StepLog;
use apollo_shared::def::Masker;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Bytes of stdout kept for the step's output.
pub(super) const TAIL_BYTES: usize = 4096;
/// Longest log line; longer ones are split.
pub(super) const MAX_LINE: usize = 8192;
/// Bytes kept of stdout's last non-empty line (a command's `result`).
pub const RESULT_LINE_BYTES: usize = 1024 * 1024;

/// What is kept of one stream: its last [`TAIL_BYTES`] (and `slack` more,
/// for a secret's value across the tail's start), or (capture mode) its
/// first `cap` bytes. Memory stays bounded whatever the process prints.
pub(super) struct Buffer {
    bytes: Vec<u8>,
    pub(super) total: u64,
    capture: Option<usize>,
    slack: usize,
    /// The line being read, up to [`RESULT_LINE_BYTES`] + 1, and its length.
    line: Vec<u8>,
    line_len: u64,
    /// The last complete non-empty line, and its length.
    pub(super) last: Vec<u8>,
    pub(super) last_len: u64,
}

impl Buffer {
    pub(super) fn new(capture: Option<usize>, slack: usize) -> Self {
        let (line, last) = (Vec::new(), Vec::new());
        Buffer { bytes: Vec::new(), total: 0, capture, slack, line, line_len: 0, last, last_len: 0 }
    }

    /// What is kept, as text: in logged mode masked first, then cut to the
    /// last [`TAIL_BYTES`] (a value across the cut is masked whole).
    pub(super) fn text(&self, masker: &Masker) -> String {
        let text = String::from_utf8_lossy(&self.bytes);
        match self.capture.is_some() || masker.is_empty() {
            true => text.into_owned(),
            false => masker.tail(&text, TAIL_BYTES, self.total > self.bytes.len() as u64),
        }
    }

    fn add_to_line(&mut self, seg: &[u8]) {
        self.line_len += seg.len() as u64;
        let room = (RESULT_LINE_BYTES + 1).saturating_sub(self.line.len());
        self.line.extend_from_slice(&seg[..seg.len().min(room)]);
    }

    pub(super) fn end_line(&mut self) {
        if self.line.iter().any(|b| !b.is_ascii_whitespace()) {
            self.last = std::mem::take(&mut self.line);
            self.last_len = self.line_len;
        }
        self.line.clear();
        self.line_len = 0;
    }

    pub(super) fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        if self.capture.is_none() {
            let mut rest = chunk;
            while let Some(i) = rest.iter().position(|b| *b == b'\n') {
                self.add_to_line(&rest[..i]);
                self.end_line();
                rest = &rest[i + 1..];
            }
            self.add_to_line(rest);
        }
        match self.capture {
            Some(cap) => {
                let room = (cap + 1).saturating_sub(self.bytes.len());
                self.bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            None => {
                self.bytes.extend_from_slice(chunk);
                if self.bytes.len() > TAIL_BYTES + self.slack {
                    let cut = self.bytes.len() - TAIL_BYTES - self.slack;
                    self.bytes.drain(..cut);
                }
            }
        }
    }
}

pub(super) async fn pump(
    mut r: impl AsyncRead + Unpin,
    log: Option<&StepLog>,
    keep: Arc<Mutex<Buffer>>,
    masker: &Masker,
) {
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
                // A secret's value across a split for length goes on whole to the next piece.
                let carry = {
                    let text = String::from_utf8_lossy(&line);
                    let at = if b == b'\n' { text.len() } else { masker.split_at(&text, MAX_LINE / 2) };
                    log.line(&text[..at]);
                    text[at..].as_bytes().to_vec()
                };
                line.clear();
                line.extend_from_slice(&carry);
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
