//! The registry: the names definitions use, mapped to the registrations
//! of the built-ins, the config's classes and the external plugins found.

use super::contract::Plugin;
use super::{approval, downloader, external, http, parser, report, shell, sleep, task, worker};
use crate::config::{BuiltinClass, TimeoutConf};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A plugin under the name definitions use, with its defaults.
#[derive(Clone)]
pub struct Registration {
    pub name: String,
    /// The built-in class, or `None` for an external command.
    pub class: Option<BuiltinClass>,
    pub command: Option<PathBuf>,
    /// The fixed timeout (with `auto`, the one until history is enough).
    pub timeout: Duration,
    /// `timeout: auto` in its registration: learned from its runs.
    pub auto_timeout: bool,
    pub retry: u32,
    pub plugin: Arc<dyn Plugin>,
    /// What runs: the executable's SHA-256, or `builtin:<agent version>`
    /// (published with the heartbeat, so agents' builds can be told apart).
    pub digest: String,
    /// The plugin's version as text, formatted once (each step's row keeps it).
    version_text: String,
}

impl Registration {
    fn new(
        name: String,
        class: Option<BuiltinClass>,
        command: Option<PathBuf>,
        plugin: Arc<dyn Plugin>,
    ) -> Registration {
        let version_text = plugin.version().to_string();
        Registration {
            name,
            class,
            command,
            timeout: Duration::ZERO,
            auto_timeout: false,
            retry: 0,
            plugin,
            digest: String::new(),
            version_text,
        }
    }

    pub fn version(&self) -> semver::Version {
        self.plugin.version()
    }

    /// [`Registration::version`] as text.
    pub fn version_text(&self) -> &str {
        &self.version_text
    }

    /// As the heartbeat publishes it.
    pub fn cap(&self) -> apollo_shared::protocol::PluginCap {
        apollo_shared::protocol::PluginCap {
            name: self.name.clone(),
            version: self.version_text.clone(),
            digest: self.digest.clone(),
        }
    }
}

/// A built-in's digest: the agent's build.
fn builtin_digest() -> String {
    format!("builtin:{}", env!("CARGO_PKG_VERSION"))
}

/// An executable's digest: the SHA-256 of its bytes.
fn file_digest(path: &std::path::Path) -> String {
    use sha2::{Digest, Sha256};
    match std::fs::read(path) {
        Ok(bytes) => Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect(),
        Err(e) => format!("unreadable: {e}"),
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
    /// The rollouts' rules this view applies, by plugin name (none in the
    /// registry itself; see `Plugins::view`).
    pub(super) rules: BTreeMap<String, super::rollout::Rule>,
    /// This agent's name, for a rule that names the agents it holds on.
    pub(super) me: String,
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
        BuiltinClass::Approval => ("approval", Arc::new(approval::Approval)),
        BuiltinClass::Task => ("task", Arc::new(task::Task)),
    }
}

/// A registration's fixed timeout, if it names one.
fn fixed(t: Option<TimeoutConf>) -> Option<Duration> {
    match t {
        Some(TimeoutConf::Fixed(d)) => Some(d),
        _ => None,
    }
}

/// Network steps default to 30 s and 3 retries, others to 300 s and 1 retry,
/// as the original design found in practice.
fn defaults(name: &str) -> (Duration, u32) {
    match name {
        "file_downloader" | "http" => (Duration::from_secs(30), 3),
        // The wait is the request's own (`timeout` param); the step itself
        // only reads the decision, and is never retried.
        "approval" => (Duration::from_secs(30), 0),
        // The child instance's steps have their own retries.
        "task" => (Duration::from_secs(300), 0),
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
            let reg = Registration {
                timeout,
                retry,
                digest: builtin_digest(),
                ..Registration::new(name.into(), Some(class), None, plugin)
            };
            r.add(reg, true);
        }
        for p in configured {
            let Some(class) = p.class else { continue };
            let (plain, plugin) = builtin(class, &p.env, storage);
            let (timeout, retry) = defaults(plain);
            let reg = Registration {
                timeout: fixed(p.timeout).unwrap_or(timeout),
                auto_timeout: p.timeout == Some(TimeoutConf::Auto),
                retry: p.retry.unwrap_or(retry),
                digest: builtin_digest(),
                ..Registration::new(p.name.clone(), Some(class), None, plugin)
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
    /// matches the step's requirement (or the highest of all), as this
    /// view's rollout rule for `name` shapes the choice (see `rollout`).
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
        let rule = self.rules.get(name);
        // No requirement and no rollout's rule (most steps): the highest.
        if let (None, None, Some(highest)) = (version, rule, list.last()) {
            return Ok(highest);
        }
        let req = match version {
            None => None,
            Some(req) => {
                Some(semver::VersionReq::parse(req).map_err(|e| format!("bad version requirement {req:?}: {e}"))?)
            }
        };
        let versions: Vec<semver::Version> = list.iter().map(|r| r.version()).collect();
        match super::rollout::choose(&versions, req.as_ref(), rule, &self.me) {
            Ok(i) => Ok(&list[i]),
            Err(why) => {
                let available = versions.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ");
                let wanted = version.unwrap_or("*");
                Err(format!("plugin {name:?} has no version matching {wanted:?} (available: {available}){why}"))
            }
        }
    }

    pub fn all(&self) -> impl Iterator<Item = &Registration> {
        self.regs.values().flatten()
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
        timeout: Option<TimeoutConf>,
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
    // Each directory of the plugin path in order; a name found in an
    // earlier one (or registered in the config) wins.
    for dir in config.plugin_dirs() {
        let mut found: Vec<PathBuf> =
            std::fs::read_dir(&dir).map(|rd| rd.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        found.sort();
        for path in found {
            use std::os::unix::fs::PermissionsExt;
            let executable = std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
            let Some(stem) = path.file_stem().and_then(|s| s.to_str()).map(str::to_string) else { continue };
            if !executable {
                continue;
            }
            match externals.iter().find(|e| e.name == stem) {
                Some(first) if first.path == path => {}
                Some(first) => tracing::warn!(
                    plugin = %stem,
                    used = %first.path.display(),
                    "{} is not registered: a plugin of that name comes first",
                    path.display()
                ),
                None => externals.push(Wanted {
                    name: stem,
                    path,
                    env: Vec::new(),
                    timeout: None,
                    retry: None,
                    workers: None,
                }),
            }
        }
    }
    for Wanted { name, path, env, timeout, retry, workers } in externals {
        match external::External::load(&name, &path, env, cap, grace, workers).await {
            Ok(plugin) => {
                let replace = !named.contains(&name);
                named.push(name.clone());
                let digest = file_digest(&path);
                let reg = Registration {
                    timeout: fixed(timeout).unwrap_or(config.scheduler.default_timeout),
                    auto_timeout: timeout == Some(TimeoutConf::Auto),
                    retry: retry.unwrap_or(1),
                    digest,
                    ..Registration::new(name.clone(), None, Some(path), Arc::new(plugin))
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
