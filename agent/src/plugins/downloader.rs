//! `file_downloader`: fetches a file://, http(s):// or s3:// source to a target,
//! verifies its checksum, and writes through a temp file and a rename so a
//! target is either whole or absent. A target that already has the expected
//! checksum is not downloaded again.
//!
//! Copying and hashing run on blocking threads, never on the async workers
//! (a large file would stall the socket server), and stop when the step's
//! timeout or a cancel fires.

use super::contract::{Call, ParamDoc, Plugin, PluginError};
use super::params::{check_known, io_err, required_str, str_param};
use futures::future::BoxFuture;
use md5::Md5;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

pub struct FileDownloader {
    /// Where `s3://` sources are read from (the agent config's `storage.s3`).
    pub s3: crate::config::S3Conf,
}

const PARAMS: &[&str] = &["source", "target", "md5", "sha256"];

#[derive(Debug)]
enum Source {
    File(PathBuf),
    Http(String),
    S3 { bucket: String, key: String },
}

fn source(s: &str) -> Result<Source, String> {
    match s.split_once("://") {
        Some(("file", rest)) if !rest.is_empty() => Ok(Source::File(PathBuf::from(rest))),
        Some(("http" | "https", _)) => Ok(Source::Http(s.to_string())),
        Some(("s3", rest)) => match rest.split_once('/') {
            Some((bucket, key)) if !bucket.is_empty() && !key.is_empty() && !key.ends_with('/') => {
                Ok(Source::S3 { bucket: bucket.to_string(), key: key.to_string() })
            }
            _ => Err(format!("source: {s:?} names no object (expected s3://BUCKET/KEY)")),
        },
        Some((scheme, _)) => Err(format!(
            "source: unsupported scheme {scheme:?} in {s:?} (expected file://, http://, https:// or s3://)"
        )),
        None => {
            Err(format!("source: {s:?} has no scheme (expected file://PATH, http://…, https://… or s3://BUCKET/KEY)"))
        }
    }
}

fn checksum(p: &Map<String, Value>, key: &str, len: usize) -> Result<Option<String>, String> {
    match str_param(p, key)? {
        Some(h) if h.len() == len && h.chars().all(|c| c.is_ascii_hexdigit()) => Ok(Some(h.to_ascii_lowercase())),
        Some(h) => Err(format!("{key}: {h:?} is not a {len}-character hex digest")),
        None => Ok(None),
    }
}

fn target(call: &Call<'_>, src: &str) -> PathBuf {
    match call.params.get("target").and_then(Value::as_str) {
        Some(t) => super::params::resolve_path(call.work_dir, t),
        None => call.work_dir.join(src.rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or("download")),
    }
}

struct Digests {
    md5: Md5,
    sha256: Sha256,
    bytes: u64,
}

impl Digests {
    fn new() -> Self {
        Digests { md5: Md5::new(), sha256: Sha256::new(), bytes: 0 }
    }
    fn update(&mut self, chunk: &[u8]) {
        self.md5.update(chunk);
        self.sha256.update(chunk);
        self.bytes += chunk.len() as u64;
    }
}

type Digested = (String, String, u64);

fn stopped() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::Interrupted, "stopped (the step timed out or was cancelled)")
}

/// Reads `path` to its end, hashing it and copying it to `copy_to` if given.
/// Checks `stop` between chunks.
fn digest_file(path: &Path, copy_to: Option<&Path>, stop: &AtomicBool) -> std::io::Result<Digested> {
    let mut f = std::fs::File::open(path)?;
    let mut out = copy_to.map(std::fs::File::create).transpose()?;
    let mut d = Digests::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(stopped());
        }
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        d.update(&buf[..n]);
        if let Some(o) = out.as_mut() {
            o.write_all(&buf[..n])?;
        }
    }
    if let Some(o) = out {
        o.sync_all()?;
    }
    Ok((hex::encode(d.md5.finalize()), hex::encode(d.sha256.finalize()), d.bytes))
}

/// Sets the flag when dropped: a call abandoned by the watchdog stops its
/// blocking work too.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs `f` on a blocking thread; a cancel (or dropping the future) raises
/// the flag `f` checks between chunks.
async fn off_runtime<T: Send + 'static>(
    cancel: &CancellationToken,
    f: impl FnOnce(&AtomicBool) -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let stop = Arc::new(AtomicBool::new(false));
    let _guard = StopOnDrop(stop.clone());
    let flag = stop.clone();
    let task = tokio::task::spawn_blocking(move || f(&flag));
    tokio::select! {
        r = task => r.unwrap_or_else(|e| Err(std::io::Error::other(e.to_string()))),
        _ = cancel.cancelled() => Err(stopped()),
    }
}

async fn file_digests(path: &Path, cancel: &CancellationToken) -> std::io::Result<Digested> {
    let p = path.to_path_buf();
    off_runtime(cancel, move |stop| digest_file(&p, None, stop)).await
}

impl FileDownloader {
    /// Fetches the source into `tmp`; returns its digests.
    async fn fetch(&self, src: &Source, tmp: &Path, cancel: &CancellationToken) -> Result<Digested, PluginError> {
        match src {
            Source::File(p) => {
                let (from, to) = (p.clone(), tmp.to_path_buf());
                off_runtime(cancel, move |stop| digest_file(&from, Some(&to), stop)).await.map_err(|e| {
                    let msg = format!("cannot copy source {}: {e}", p.display());
                    if e.kind() == std::io::ErrorKind::NotFound {
                        PluginError::permanent(msg)
                    } else {
                        PluginError::retryable(msg)
                    }
                })
            }
            Source::Http(url) => {
                let mut resp =
                    reqwest::get(url).await.map_err(|e| PluginError::retryable(format!("GET {url}: {e}")))?;
                let status = resp.status();
                if !status.is_success() {
                    let msg = format!("GET {url}: HTTP {status}");
                    let retry = status.is_server_error() || status.as_u16() == 429;
                    return Err(if retry { PluginError::retryable(msg) } else { PluginError::permanent(msg) });
                }
                // Writes go through tokio's file (on blocking threads); the
                // hash is taken off the runtime once the body is on disk.
                use tokio::io::AsyncWriteExt;
                let mut f = tokio::fs::File::create(tmp).await.map_err(|e| io_err("cannot create", tmp, e))?;
                while let Some(chunk) =
                    resp.chunk().await.map_err(|e| PluginError::retryable(format!("GET {url}: {e}")))?
                {
                    f.write_all(&chunk).await.map_err(|e| io_err("cannot write", tmp, e))?;
                }
                f.sync_all().await.map_err(|e| io_err("cannot sync", tmp, e))?;
                drop(f);
                file_digests(tmp, cancel).await.map_err(|e| io_err("cannot read", tmp, e))
            }
            Source::S3 { bucket, key } => {
                super::s3::fetch(&self.s3, bucket, key, tmp).await?;
                file_digests(tmp, cancel).await.map_err(|e| io_err("cannot read", tmp, e))
            }
        }
    }
}

impl Plugin for FileDownloader {
    fn name(&self) -> &str {
        "file_downloader"
    }
    fn version(&self) -> semver::Version {
        semver::Version::new(1, 0, 0)
    }
    fn description(&self) -> &str {
        "Downloads a file://, http(s):// or s3:// source to a target, verifying md5/sha256, atomically"
    }
    fn outputs(&self) -> Option<Vec<String>> {
        Some(["path", "bytes", "md5", "sha256", "skipped", "created"].map(String::from).to_vec())
    }
    fn params(&self) -> Vec<ParamDoc> {
        vec![
            ParamDoc {
                name: "source",
                kind: "url",
                required: true,
                description: "file://PATH, http://…, https://… or s3://BUCKET/KEY",
            },
            ParamDoc {
                name: "target",
                kind: "path",
                required: false,
                description: "where to write (default: work dir/<file name>)",
            },
            ParamDoc { name: "md5", kind: "hex", required: false, description: "expected md5" },
            ParamDoc { name: "sha256", kind: "hex", required: false, description: "expected sha256" },
        ]
    }
    fn check_params(&self, p: &Map<String, Value>) -> Result<(), String> {
        check_known(p, PARAMS)?;
        source(required_str(p, "source", "file://tasks/data/report.csv")?)?;
        str_param(p, "target")?;
        checksum(p, "md5", 32)?;
        checksum(p, "sha256", 64)?;
        Ok(())
    }
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, PluginError>> {
        Box::pin(async move {
            let p = call.params;
            let raw = required_str(p, "source", "").map_err(PluginError::permanent)?;
            let src = match source(raw).map_err(PluginError::permanent)? {
                // A relative file:// path is taken from the directory that holds the tasks directory.
                Source::File(p) if p.is_relative() => {
                    Source::File(call.tasks_dir.parent().unwrap_or(Path::new(".")).join(p))
                }
                other => other,
            };
            let want_md5 = checksum(p, "md5", 32).map_err(PluginError::permanent)?;
            let want_sha = checksum(p, "sha256", 64).map_err(PluginError::permanent)?;
            let target = target(&call, raw);
            let matches = |md5: &str, sha: &str| {
                want_md5.as_deref().is_none_or(|w| w == md5) && want_sha.as_deref().is_none_or(|w| w == sha)
            };
            let existed = target.exists();
            if existed && (want_md5.is_some() || want_sha.is_some()) {
                if let Ok((md5, sha, bytes)) = file_digests(&target, &call.cancel).await {
                    if matches(&md5, &sha) {
                        call.log
                            .line(&format!("{} already has the expected checksum; not downloading", target.display()));
                        return Ok(
                            json!({"path": target, "bytes": bytes, "md5": md5, "sha256": sha, "skipped": true, "created": false}),
                        );
                    }
                }
            }
            if let Some(dir) = target.parent() {
                std::fs::create_dir_all(dir).map_err(|e| io_err("cannot create directory", dir, e))?;
            }
            let tmp = target.with_extension(format!("part-{}", ulid::Ulid::new()));
            let result = async {
                let (md5, sha, bytes) = self.fetch(&src, &tmp, &call.cancel).await?;
                if !matches(&md5, &sha) {
                    return Err(PluginError::retryable(format!(
                        "checksum mismatch for {raw}: got md5 {md5} sha256 {sha}, expected {}",
                        want_md5.clone().or(want_sha.clone()).unwrap_or_default()
                    )));
                }
                std::fs::rename(&tmp, &target).map_err(|e| io_err("cannot rename into", &target, e))?;
                Ok((md5, sha, bytes))
            }
            .await;
            let (md5, sha, bytes) = result.inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            })?;
            call.log.line(&format!("downloaded {raw} to {} ({bytes} bytes, sha256 {sha})", target.display()));
            Ok(
                json!({"path": target, "bytes": bytes, "md5": md5, "sha256": sha, "skipped": false, "created": !existed}),
            )
        })
    }
    fn rollback<'a>(&'a self, call: Call<'a>, output: Option<&'a Value>) -> BoxFuture<'a, Result<(), PluginError>> {
        Box::pin(async move {
            // Only what this step created is removed.
            let Some(out) = output.filter(|o| o["created"] == Value::Bool(true)) else { return Ok(()) };
            if let Some(path) = out["path"].as_str() {
                match std::fs::remove_file(path) {
                    Ok(()) => call.log.line(&format!("rollback: removed {path}")),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err("cannot remove", Path::new(path), e)),
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_schemes_are_named() {
        let e = source("ftp://host/report.csv").err().unwrap();
        assert!(e.contains("unsupported scheme \"ftp\""), "{e}");
        assert!(
            matches!(source("s3://bucket/dir/report.csv"), Ok(Source::S3 { bucket, key }) if bucket == "bucket" && key == "dir/report.csv")
        );
        assert!(source("s3://bucket/").unwrap_err().contains("s3://BUCKET/KEY"));
        assert!(source("report.csv").is_err());
        assert!(matches!(source("file://tasks/data/report.csv"), Ok(Source::File(_))));
    }
}
