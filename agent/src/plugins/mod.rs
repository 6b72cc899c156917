//! Plugins: the four calls every step goes through, the built-ins, and the
//! registry that maps the names definitions use to registrations.
//!
//! Layout:
//! - `process`: subprocesses in their own process group, killed as a group.
//! - `external`: plugins that are executables speaking JSON (PLUGINS.md).
//! - `worker`: the process pool of external plugins in worker mode.
//! - `shell`, `downloader`, `parser`, `report`, `http`, `sleep`: the built-ins.

mod downloader;
pub mod external;
mod http;
pub mod kit;
mod parser;
pub mod process;
mod report;
mod s3;
mod shell;
mod sleep;
pub mod worker;

use crate::logs::StepLog;
use futures::future::BoxFuture;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::config::BuiltinClass;

/// A failed call. `permanent` errors are not retried.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginError {
    pub message: String,
    pub permanent: bool,
    /// The call panicked: a bug in the plugin (or a library it uses), not a
    /// transient fault. Permanent, and raised as a `plugin_panicked` alert.
    pub panicked: bool,
}

impl PluginError {
    pub fn retryable(message: impl Into<String>) -> Self {
        PluginError { message: message.into(), permanent: false, panicked: false }
    }
    pub fn permanent(message: impl Into<String>) -> Self {
        PluginError { message: message.into(), permanent: true, panicked: false }
    }
    /// `plugin NAME panicked: MESSAGE`, from a panic's payload.
    pub fn panicked(plugin: &str, payload: &(dyn std::any::Any + Send)) -> Self {
        let message = format!("plugin {plugin} panicked: {}", panic_message(payload));
        PluginError { message, permanent: true, panicked: true }
    }
}

/// What a panic said (its payload is a `&str` or a `String` when it was
/// made by `panic!` or an `unwrap`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Runs one call of plugin `name`, turning a panic anywhere inside it (the
/// plugin's code, or a library's) into a failed call that says so: the
/// step fails and its instance follows its failure policy, instead of the
/// executor dying with the instance left RUNNING.
pub async fn unwinding<T>(
    name: &str,
    call: impl std::future::Future<Output = Result<T, PluginError>>,
) -> Result<T, PluginError> {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(call).catch_unwind().await {
        Ok(r) => r,
        Err(payload) => Err(PluginError::panicked(name, payload.as_ref())),
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
    /// Variables the step declares (`env:`), for external plugins.
    pub env: &'a [(String, String)],
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
    fn name(&self) -> &str;
    fn version(&self) -> semver::Version;
    fn description(&self) -> &str;
    fn params(&self) -> Vec<ParamDoc> {
        Vec::new()
    }
    fn idempotent(&self) -> bool {
        true
    }
    /// The fields of its output, when the plugin says (the built-ins do; an
    /// external plugin may, as `outputs` in its describe): a template that
    /// reads `steps.X.F` is refused at load when F is not among them.
    fn outputs(&self) -> Option<Vec<String>> {
        None
    }
    /// Whether a step of this plugin may use the instance's work dir (its
    /// files, or as the current directory): the executor creates the dir
    /// before the first such step. Every plugin is taken to, unless it says
    /// otherwise.
    fn uses_work_dir(&self) -> bool {
        true
    }
    /// The synchronous parameter check of a built-in.
    fn check_params(&self, _params: &Map<String, Value>) -> Result<(), String> {
        Ok(())
    }
    /// Checks parameters before anything runs; the message names the field.
    /// A refusal is permanent; a check that could not be made (a plugin that
    /// timed out or asked to be retried) is retryable, like an execute.
    fn validate<'a>(&'a self, params: &'a Map<String, Value>) -> BoxFuture<'a, Result<(), PluginError>> {
        Box::pin(std::future::ready(self.check_params(params).map_err(PluginError::permanent)))
    }
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, PluginError>>;
    fn rollback<'a>(&'a self, call: Call<'a>, output: Option<&'a Value>) -> BoxFuture<'a, Result<(), PluginError>>;

    /// The worker pool of a worker-mode external plugin.
    fn pool(&self) -> Option<apollo_shared::protocol::PoolStats> {
        None
    }

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
            "outputs": self.outputs(),
        })
    }
}

/// A plugin under the name definitions use, with its defaults.
#[derive(Clone)]
pub struct Registration {
    pub name: String,
    /// The built-in class, or `None` for an external command.
    pub class: Option<BuiltinClass>,
    pub command: Option<PathBuf>,
    pub timeout: Duration,
    pub retry: u32,
    pub plugin: Arc<dyn Plugin>,
}

impl Registration {
    pub fn version(&self) -> semver::Version {
        self.plugin.version()
    }
}

/// A registration that could not be used (an external plugin whose
/// describe failed), kept to be shown.
#[derive(Clone, Debug)]
pub struct Broken {
    pub name: String,
    pub command: PathBuf,
    pub error: String,
}

/// Every registration, by name; a name may have several versions.
#[derive(Clone, Default)]
pub struct Registry {
    regs: BTreeMap<String, Vec<Registration>>,
    pub broken: Vec<Broken>,
}

/// The plain name a built-in class registers under, and the plugin.
fn builtin(
    class: BuiltinClass,
    pass_env: &[String],
    storage: &crate::config::StorageConf,
) -> (&'static str, Arc<dyn Plugin>) {
    match class {
        BuiltinClass::FileDownloader => {
            ("file_downloader", Arc::new(downloader::FileDownloader { s3: storage.s3.clone() }))
        }
        BuiltinClass::DataParser => ("data_parser", Arc::new(parser::DataParser)),
        BuiltinClass::ReportGenerator => ("report_generator", Arc::new(report::ReportGenerator)),
        BuiltinClass::Shell => ("shell", Arc::new(shell::Shell { pass_env: pass_env.to_vec() })),
        BuiltinClass::HttpRequest => ("http", Arc::new(http::HttpRequest::new())),
        BuiltinClass::Sleep => ("sleep", Arc::new(sleep::Sleep)),
    }
}

/// Network steps default to 30 s and 3 retries, others to 300 s and 1 retry,
/// as the original design found in practice.
fn defaults(name: &str) -> (Duration, u32) {
    match name {
        "file_downloader" | "http" => (Duration::from_secs(30), 3),
        _ => (Duration::from_secs(300), 1),
    }
}

impl Registry {
    /// The built-ins under their plain names, then the config's class
    /// registrations (a same name replaces a built-in).
    pub fn new(configured: &[crate::config::PluginReg], storage: &crate::config::StorageConf) -> Registry {
        let mut r = Registry::default();
        for class in BuiltinClass::ALL {
            let (name, plugin) = builtin(class, &[], storage);
            let (timeout, retry) = defaults(name);
            r.add(Registration { name: name.into(), class: Some(class), command: None, timeout, retry, plugin }, true);
        }
        for p in configured {
            let Some(class) = p.class else { continue };
            let (plain, plugin) = builtin(class, &p.env, storage);
            let (timeout, retry) = defaults(plain);
            let reg = Registration {
                name: p.name.clone(),
                class: Some(class),
                command: None,
                timeout: p.timeout.unwrap_or(timeout),
                retry: p.retry.unwrap_or(retry),
                plugin,
            };
            r.add(reg, true);
        }
        r
    }

    /// Adds a registration. With `replace`, it replaces every version under
    /// its name; otherwise it is one more version (a same version replaces).
    pub fn add(&mut self, reg: Registration, replace: bool) {
        let list = self.regs.entry(reg.name.clone()).or_default();
        if replace {
            list.clear();
        }
        list.retain(|r| r.version() != reg.version());
        list.push(reg);
        list.sort_by_key(|r| r.version());
    }

    /// The registration a step uses: the highest version of `name` that
    /// matches the step's requirement (or the highest of all).
    pub fn resolve(&self, name: &str, version: Option<&str>) -> Result<&Registration, String> {
        let Some(list) = self.regs.get(name) else {
            if let Some(b) = self.broken.iter().find(|b| b.name == name) {
                return Err(format!("plugin {name:?} is not usable: {}", b.error));
            }
            let names: Vec<&str> = self.regs.keys().map(String::as_str).collect();
            let near =
                apollo_shared::text::closest(name, &names).map(|n| format!("did you mean {n:?}? ")).unwrap_or_default();
            return Err(format!("unknown plugin {name:?} ({near}registered: {})", names.join(", ")));
        };
        let available = || list.iter().map(|r| r.version().to_string()).collect::<Vec<_>>().join(", ");
        match version {
            None => list.last().ok_or_else(|| format!("plugin {name:?} has no registration")),
            Some(req) => {
                let parsed =
                    semver::VersionReq::parse(req).map_err(|e| format!("bad version requirement {req:?}: {e}"))?;
                list.iter().rev().find(|r| parsed.matches(&r.version())).ok_or_else(|| {
                    format!("plugin {name:?} has no version matching {req:?} (available: {})", available())
                })
            }
        }
    }

    pub fn all(&self) -> impl Iterator<Item = &Registration> {
        self.regs.values().flatten()
    }
}

/// The registry in force, swapped whole when plugins are reloaded (SIGHUP);
/// a step in flight keeps the registration it resolved.
#[derive(Default)]
pub struct Plugins {
    current: std::sync::RwLock<Arc<Registry>>,
}

impl Plugins {
    pub fn new(r: Registry) -> Plugins {
        Plugins { current: std::sync::RwLock::new(Arc::new(r)) }
    }
    pub fn get(&self) -> Arc<Registry> {
        self.current.read().expect("plugins").clone()
    }
    pub fn set(&self, r: Registry) {
        *self.current.write().expect("plugins") = Arc::new(r);
    }
}

/// Every registration the agent uses: the built-ins and the config's classes,
/// then external plugins — the config's `command:` registrations (several of
/// one name are several versions), then executables found in
/// `<tasks dir>/plugins/`, registered under their file stem unless the config
/// names them. A plugin that fails to describe is kept in `broken`, reported,
/// and not usable; nothing else is affected.
pub async fn load(config: &crate::config::Config) -> Registry {
    let mut registry = Registry::new(&config.plugins, &config.storage);
    let cap = config.scheduler.step_output_bytes;
    let grace = config.scheduler.kill_grace;
    let mut named: Vec<String> = Vec::new();
    struct Wanted {
        name: String,
        path: PathBuf,
        env: Vec<String>,
        timeout: Option<Duration>,
        retry: Option<u32>,
        workers: Option<worker::PoolConf>,
    }
    let mut externals: Vec<Wanted> = config
        .plugins
        .iter()
        .filter_map(|p| {
            let cmd = p.command.as_deref()?;
            Some(Wanted {
                name: p.name.clone(),
                path: config.command_path(cmd),
                env: p.env.clone(),
                timeout: p.timeout,
                retry: p.retry,
                workers: p.workers.clone(),
            })
        })
        .collect();
    let dir = config.tasks_dir().join("plugins");
    let mut found: Vec<PathBuf> =
        std::fs::read_dir(&dir).map(|rd| rd.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    found.sort();
    for path in found {
        use std::os::unix::fs::PermissionsExt;
        let executable = std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()).map(str::to_string) else { continue };
        if executable && !externals.iter().any(|e| e.name == stem) {
            externals.push(Wanted { name: stem, path, env: Vec::new(), timeout: None, retry: None, workers: None });
        }
    }
    for Wanted { name, path, env, timeout, retry, workers } in externals {
        match external::External::load(&name, &path, env, cap, grace, workers).await {
            Ok(plugin) => {
                let replace = !named.contains(&name);
                named.push(name.clone());
                let reg = Registration {
                    name: name.clone(),
                    class: None,
                    command: Some(path),
                    timeout: timeout.unwrap_or(config.scheduler.default_timeout),
                    retry: retry.unwrap_or(1),
                    plugin: Arc::new(plugin),
                };
                tracing::info!(plugin = %name, version = %reg.version(), "external plugin registered");
                registry.add(reg, replace);
            }
            Err(error) => {
                tracing::warn!(plugin = %name, command = %path.display(), "external plugin not usable: {error}");
                registry.broken.push(Broken { name, command: path, error });
            }
        }
    }
    registry
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
