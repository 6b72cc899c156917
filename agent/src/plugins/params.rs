//! Helpers the built-ins share: params read and checked, paths taken from
//! the work dir, files hashed, I/O errors worded.

use super::contract::PluginError;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

pub(crate) fn str_param<'a>(p: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, String> {
    match p.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(format!("{key}: expected a string, found {}", apollo_shared::def::kind(v))),
    }
}

pub(crate) fn required_str<'a>(p: &'a Map<String, Value>, key: &str, example: &str) -> Result<&'a str, String> {
    str_param(p, key)?.ok_or_else(|| format!("{key}: missing (e.g. {key}: {example})"))
}

pub(crate) fn check_known(p: &Map<String, Value>, known: &[&str]) -> Result<(), String> {
    match p.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(format!("unknown parameter {k:?} (expected one of: {})", known.join(", "))),
        None => Ok(()),
    }
}

/// A path parameter: relative paths are taken from the instance's work dir.
pub(crate) fn resolve_path(work_dir: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        work_dir.join(p)
    }
}

/// sha256 of a file, streamed.
pub(crate) fn sha256_file(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(hex::encode(h.finalize()))
}

pub(crate) fn io_err(what: &str, path: &Path, e: std::io::Error) -> PluginError {
    PluginError::retryable(format!("{what} {}: {e}", path.display()))
}
