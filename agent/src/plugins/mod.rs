//! Plugins: the four calls every step goes through, the built-ins, and the
//! registry that maps the names definitions use to registrations.
//!
//! Layout:
//! - `process`: subprocesses in their own process group, killed as a group.
//! - `shell`, `downloader`, `parser`, `report`, `http`, `sleep`: the built-ins.

mod downloader;
mod http;
mod parser;
mod process;
mod report;
mod shell;
mod sleep;

use crate::logs::StepLog;
use futures::future::BoxFuture;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The class names a config may register, as in the original design.
pub const CLASSES: &[&str] = &[
    "apollo.plugins.downloader.FileDownloader",
    "apollo.plugins.parser.DataParser",
    "apollo.plugins.report.ReportGenerator",
    "apollo.plugins.shell.Shell",
    "apollo.plugins.http.HttpRequest",
    "apollo.plugins.sleep.Sleep",
];

/// A failed call. `permanent` errors are not retried.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginError {
    pub message: String,
    pub permanent: bool,
}

impl PluginError {
    pub fn retryable(message: impl Into<String>) -> Self {
        PluginError { message: message.into(), permanent: false }
    }
    pub fn permanent(message: impl Into<String>) -> Self {
        PluginError { message: message.into(), permanent: true }
    }
}

impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What one execute or rollback receives.
pub struct Call<'a> {
    pub params: &'a Map<String, Value>,
    pub context: &'a Value,
    /// `<instance id>:<step seq>`: the same for every attempt of the step.
    pub idempotency_key: &'a str,
    pub work_dir: &'a Path,
    /// The definitions directory, for templates and data files the tasks ship.
    pub tasks_dir: &'a Path,
    /// The output of the step before this one, if any.
    pub previous: Option<&'a Value>,
    pub step: &'a str,
    pub attempt: u32,
    pub log: &'a StepLog,
    /// Fired when the step times out or is cancelled; a plugin with a
    /// subprocess stops it (SIGTERM to the group, SIGKILL after `kill_grace`).
    pub cancel: CancellationToken,
    pub kill_grace: Duration,
}

/// A plugin parameter, for describe() and the console's run form.
pub struct ParamDoc {
    pub name: &'static str,
    pub kind: &'static str,
    pub required: bool,
    pub description: &'static str,
}

/// The four calls of the plugin contract.
pub trait Plugin: Send + Sync {
    fn name(&self) -> &'static str;
    fn version(&self) -> semver::Version;
    fn description(&self) -> &'static str;
    fn params(&self) -> Vec<ParamDoc>;
    fn idempotent(&self) -> bool {
        true
    }
    /// Checks parameters before anything runs; the message names the field.
    fn validate(&self, params: &Map<String, Value>) -> Result<(), String>;
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, PluginError>>;
    fn rollback<'a>(&'a self, call: Call<'a>, output: Option<&'a Value>) -> BoxFuture<'a, Result<(), PluginError>>;

    fn describe(&self) -> Value {
        let params: Vec<Value> = self
            .params()
            .iter()
            .map(|p| json!({"name": p.name, "type": p.kind, "required": p.required, "description": p.description}))
            .collect();
        json!({
            "name": self.name(),
            "version": self.version().to_string(),
            "description": self.description(),
            "idempotent": self.idempotent(),
            "params": params,
        })
    }
}

/// A plugin under the name definitions use, with its defaults.
#[derive(Clone)]
pub struct Registration {
    pub name: String,
    pub class: &'static str,
    pub timeout: Duration,
    pub retry: u32,
    pub plugin: Arc<dyn Plugin>,
}

impl Registration {
    pub fn version(&self) -> semver::Version {
        self.plugin.version()
    }
}

/// Every registration, by name.
#[derive(Clone)]
pub struct Registry {
    regs: BTreeMap<String, Registration>,
}

fn builtin(class: &str) -> Option<(&'static str, &'static str, Arc<dyn Plugin>)> {
    // (class, plain name, plugin); network steps default to 30 s and 3 retries.
    let (name, plugin): (&str, Arc<dyn Plugin>) = match class {
        "apollo.plugins.downloader.FileDownloader" => ("file_downloader", Arc::new(downloader::FileDownloader)),
        "apollo.plugins.parser.DataParser" => ("data_parser", Arc::new(parser::DataParser)),
        "apollo.plugins.report.ReportGenerator" => ("report_generator", Arc::new(report::ReportGenerator)),
        "apollo.plugins.shell.Shell" => ("shell", Arc::new(shell::Shell)),
        "apollo.plugins.http.HttpRequest" => ("http", Arc::new(http::HttpRequest::new())),
        "apollo.plugins.sleep.Sleep" => ("sleep", Arc::new(sleep::Sleep)),
        _ => return None,
    };
    let class = CLASSES.iter().find(|c| **c == class)?;
    Some((class, name, plugin))
}

impl Registry {
    /// The built-ins under their plain names, then the config's registrations
    /// (which replace a built-in of the same name).
    pub fn new(configured: &[crate::config::PluginReg]) -> Registry {
        let mut regs = BTreeMap::new();
        for class in CLASSES {
            let (class, name, plugin) = builtin(class).expect("every class is built in");
            let network = matches!(name, "file_downloader" | "http");
            let (timeout, retry) = if network { (30, 3) } else { (300, 1) };
            regs.insert(
                name.to_string(),
                Registration { name: name.into(), class, timeout: Duration::from_secs(timeout), retry, plugin },
            );
        }
        for p in configured {
            let Some((class, _, plugin)) = p.class.as_deref().and_then(builtin) else { continue };
            let base = regs.values().find(|r| r.class == class).cloned();
            let (timeout, retry) = base.map(|b| (b.timeout, b.retry)).unwrap_or((Duration::from_secs(300), 1));
            regs.insert(
                p.name.clone(),
                Registration {
                    name: p.name.clone(),
                    class,
                    timeout: p.timeout.unwrap_or(timeout),
                    retry: p.retry.unwrap_or(retry),
                    plugin,
                },
            );
        }
        Registry { regs }
    }

    /// The registration a step uses: by name, and by version requirement when
    /// the step pins one.
    pub fn resolve(&self, name: &str, version: Option<&str>) -> Result<&Registration, String> {
        let reg = self.regs.get(name).ok_or_else(|| {
            format!(
                "unknown plugin {name:?} (registered: {})",
                self.regs.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })?;
        if let Some(req) = version {
            let req = semver::VersionReq::parse(req).map_err(|e| format!("bad version requirement {req:?}: {e}"))?;
            if !req.matches(&reg.version()) {
                return Err(format!("plugin {name:?} has no version matching {req} (available: {})", reg.version()));
            }
        }
        Ok(reg)
    }

    pub fn all(&self) -> impl Iterator<Item = &Registration> {
        self.regs.values()
    }
}

// ----- helpers shared by the built-ins -----

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
