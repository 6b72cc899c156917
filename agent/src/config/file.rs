//! The config file as a whole: its sections, where it comes from, the
//! command line's paths over it, and every problem of it at once.

use super::database::Database;
use super::events::{EventsConf, StorageConf};
use super::plugins::PluginReg;
use super::problems::{self, Problems};
use super::scheduler::Scheduler;
use super::sections::{AgentConf, AlertsConf, Logging, MetricsConf, Socket};
use anyhow::{bail, Context as _};
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub database: Database,
    #[serde(default)]
    pub scheduler: Scheduler,
    /// Registrations added to (or replacing, by name) the built-in ones.
    #[serde(default)]
    pub plugins: Vec<PluginReg>,
    /// The definitions directory.
    #[serde(default)]
    pub tasks: Option<PathBuf>,
    /// Where executables are registered from as plugins (one directory or
    /// several, in order: the first of a name wins); default `<tasks>/plugins`.
    #[serde(default, deserialize_with = "one_or_many")]
    pub plugins_path: Option<Vec<PathBuf>>,
    /// Watch the definitions directory and reload on changes (SIGHUP reloads either way).
    #[serde(default = "yes")]
    pub watch_tasks: bool,
    /// Database, logs and work dirs live here.
    #[serde(default)]
    pub data_dir: Option<PathBuf>,
    #[serde(default)]
    pub socket: Socket,
    #[serde(default)]
    pub logging: Logging,
    #[serde(default)]
    pub metrics: MetricsConf,
    #[serde(default)]
    pub alerts: AlertsConf,
    #[serde(default)]
    pub agent: AgentConf,
    #[serde(default)]
    pub events: EventsConf,
    #[serde(default)]
    pub storage: StorageConf,
    /// The file this was read from, for messages and relative paths.
    #[serde(skip)]
    pub source: Option<PathBuf>,
    /// The installation it belongs to: a system one defaults its tasks, data
    /// and socket to /etc/apollo/tasks, /var/lib/apollo, /run/apollo.
    #[serde(skip)]
    pub install: apollo_shared::paths::Install,
    /// Paths given on the command line, which win over the file's.
    #[serde(skip)]
    pub overrides: Overrides,
}

/// A path or a list of paths.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<PathBuf>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Paths {
        One(PathBuf),
        Many(Vec<PathBuf>),
    }
    let paths = Paths::deserialize(d).map_err(|_| {
        serde::de::Error::custom(
            "plugins_path: expected a directory or a list of directories \
             (`plugins_path: /opt/apollo/plugins` or `plugins_path: [ops/plugins, shared/plugins]`)",
        )
    })?;
    Ok(Some(match paths {
        Paths::One(p) => vec![p],
        Paths::Many(ps) => ps,
    }))
}

/// Paths given on the command line (or `APOLLO_SOCKET`), already absolute,
/// and `--name`.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub tasks: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    pub name: Option<String>,
}

impl Config {
    /// The queues the agent named `me` may not claim from (dedicated to others).
    pub fn queues_excluded(&self, me: &str) -> Vec<String> {
        let q = &self.scheduler.queues;
        q.iter()
            .filter(|(_, c)| !c.agents.is_empty() && !c.agents.iter().any(|a| a == me))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The queues the agent named `me` claims from, as `agents` lists them:
    /// `*` for every shared queue, and the dedicated ones it serves.
    pub fn queues_served(&self, me: &str) -> Vec<String> {
        let mut out = vec!["*".to_string()];
        out.extend(
            self.scheduler.queues.iter().filter(|(_, c)| c.agents.iter().any(|a| a == me)).map(|(n, _)| n.clone()),
        );
        out
    }
}

fn yes() -> bool {
    true
}

/// Where the config comes from, in the order of `apollo_shared::paths`: an
/// explicit file, `APOLLO_CONFIG`, `./apollo.yaml`, `/etc/apollo/apollo.yaml`
/// (outside a project directory); `None` for the built-in defaults.
pub fn resolve_path(flag: Option<&Path>) -> (Option<PathBuf>, apollo_shared::paths::Install) {
    let env = std::env::var_os("APOLLO_CONFIG").filter(|p| !p.is_empty()).map(PathBuf::from);
    apollo_shared::paths::config(flag, env.as_deref(), &|p: &Path| p.exists())
}

impl Default for Config {
    fn default() -> Self {
        serde_json::from_value(serde_json::json!({})).expect("config defaults")
    }
}

impl Config {
    /// Parses a config document; `file` is used in messages. Its every
    /// problem is refused at once, as [`Problems`].
    pub fn parse(src: &str, file: &str) -> anyhow::Result<Config> {
        // A file of nothing but comments (or nothing) means the defaults.
        if src.lines().all(|l| l.trim().is_empty() || l.trim_start().starts_with('#') || l.trim() == "---") {
            let cfg = Config::default();
            cfg.validate(file)?;
            return Ok(cfg);
        }
        let mut cfg: Config = apollo_shared::yaml::from_str(src)
            .map_err(|e| Problems(Self::every_problem(src, file).unwrap_or_else(|| vec![problems::said(file, &e)])))?;
        super::freezes::locate(&mut cfg.scheduler.freezes, src);
        cfg.validate(file)?;
        Ok(cfg)
    }

    /// Every problem of `src`, which does not parse whole: each section's
    /// type error and the checks of the sections that parse.
    fn every_problem(src: &str, file: &str) -> Option<Vec<String>> {
        problems::every_section(src, file, |mut cfg: Config, rest| {
            super::freezes::locate(&mut cfg.scheduler.freezes, rest);
            cfg.problems(file)
        })
    }

    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let src = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read config", path.display()))?;
        let mut cfg = Config::parse(&src, &path.display().to_string())?;
        cfg.source = Some(path.to_path_buf());
        Ok(cfg)
    }

    /// Puts the command line's paths over the file's.
    pub fn with_overrides(mut self, o: Overrides) -> Config {
        if let Some(t) = &o.tasks {
            self.tasks = Some(t.clone());
        }
        if let Some(d) = &o.data_dir {
            self.data_dir = Some(d.clone());
        }
        if let Some(s) = &o.socket {
            self.socket.path = Some(s.clone());
        }
        if let Some(n) = &o.name {
            self.agent.name = Some(n.clone());
        }
        self.overrides = o;
        self
    }

    /// The config file read again (for SIGHUP), with the same command-line
    /// paths over it; the built-in defaults when the agent has no file.
    pub fn reread(&self) -> anyhow::Result<Config> {
        let mut fresh = match &self.source {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        fresh.install = self.install;
        Ok(fresh.with_overrides(self.overrides.clone()))
    }

    /// The agent's name: `agent.name` (or `--name`), else the host name.
    pub fn agent_name(&self) -> String {
        self.agent.name.clone().unwrap_or_else(|| {
            nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "localhost".into())
        })
    }

    /// Checks `agent.name`; `origin` is where it came from, for the message.
    pub fn validate_name(&self, origin: &str) -> anyhow::Result<()> {
        if let Some(n) = &self.agent.name {
            let ok = (1..=64).contains(&n.len())
                && n.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
            if !ok {
                bail!("{origin}: {n:?} is not a valid agent name (expected 1 to 64 letters, digits, '.', '_' or '-')");
            }
        }
        Ok(())
    }

    /// Every problem of the file, not just the first: `check` lists them all.
    fn validate(&self, file: &str) -> Result<(), Problems> {
        let problems = self.problems(file);
        if problems.is_empty() {
            return Ok(());
        }
        Err(Problems(problems))
    }

    pub(super) fn problems(&self, file: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if let Err(e) = self.validate_name(&format!("{file}: agent.name")) {
            problems.push(format!("{e:#}"));
        }
        problems.extend(self.events.problems(file));
        problems.extend(self.storage.problems(file));
        problems.extend(self.database.problems(file));
        problems.extend(self.socket.problems(file));
        let s = &self.scheduler;
        if let Some(n) = s.concurrency.filter(|n| *n == 0 || *n > 10_000) {
            problems.push(format!(
                "{file}: scheduler.concurrency: {n} is out of range (expected 1 to 10000, or leave it out for twice the cores)"
            ));
        }
        for (i, f) in s.freezes.iter().enumerate() {
            problems.extend(f.problems(file, i));
            if let Some(j) = s.freezes[..i].iter().position(|g| g.name == f.name) {
                let m = format!("freezes[{j}] is named {:?} too (a window's name is its id: one each)", f.name);
                problems.push(f.said(file, i, "name", &m));
            }
        }
        if let Some(a) = s.archive_retention.filter(|a| *a < s.retention) {
            problems.push(format!(
                "{file}: scheduler.archive_retention: {} is shorter than scheduler.retention ({}): an instance is \
                 archived after retention and deleted after archive_retention, both counted from its end",
                humantime(a),
                humantime(s.retention)
            ));
        }
        if s.zombie_factor.is_nan() || s.zombie_factor < 1.0 {
            problems.push(format!(
                "{file}: scheduler.zombie_factor: {} is out of range (expected 1 or more)",
                s.zombie_factor
            ));
        }
        let schema = &self.database.schema;
        if schema.is_empty()
            || schema.len() > 63
            || !schema.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            problems.push(format!(
                "{file}: database.schema: {schema:?} is not valid (expected 1 to 63 lower-case letters, digits or '_')"
            ));
        }
        if !(1..=64).contains(&self.database.pool_size) {
            problems.push(format!(
                "{file}: database.pool_size: {} is out of range (expected 1 to 64)",
                self.database.pool_size
            ));
        }
        if self.database.read_url.is_some() && !self.database.is_postgres() {
            problems
                .push(format!("{file}: database.read_url: a read replica needs database.url to be a postgres:// URL"));
        }
        if !["pretty", "json"].contains(&self.logging.format.as_str()) {
            problems.push(format!(
                "{file}: logging.format: {:?} is not valid (expected pretty or json)",
                self.logging.format
            ));
        }
        let level = self.logging.level.as_str();
        let named = ["error", "warn", "info", "debug", "trace", "off"].contains(&level);
        if !(named || level.contains('=')) || tracing_subscriber::EnvFilter::try_new(level).is_err() {
            problems.push(format!(
                "{file}: logging.level: {:?} is not valid (expected error, warn, info, debug, trace, or directives like \"info,apollo_agent=debug\")",
                self.logging.level
            ));
        }
        for (i, h) in self.alerts.hooks.iter().enumerate() {
            match (&h.command, &h.webhook) {
                (Some(c), None) if !c.is_empty() => {}
                (None, Some(u)) if u.starts_with("http://") || u.starts_with("https://") => {}
                (None, Some(u)) => {
                    problems.push(format!("{file}: alerts.hooks[{i}].webhook: {u:?} is not an http:// or https:// URL"))
                }
                _ => problems.push(format!(
                    "{file}: alerts.hooks[{i}]: expected exactly one of command: [argv…] or webhook: URL"
                )),
            }
        }
        for (i, p) in self.plugins.iter().enumerate() {
            match (&p.class, &p.command) {
                (Some(_), Some(_)) | (None, None) => {
                    problems.push(format!("{file}: plugins[{i}] ({}): give exactly one of class or command", p.name))
                }
                _ => {}
            }
            if let Some(w) = &p.workers {
                if p.command.is_none() {
                    problems
                        .push(format!("{file}: plugins[{i}] ({}).workers: only a command plugin has workers", p.name));
                }
                if let Err(e) = w.check() {
                    problems.push(format!("{file}: plugins[{i}] ({}).workers.{e}", p.name));
                }
            }
        }
        problems
    }

    fn base_dir(&self) -> PathBuf {
        self.source.as_ref().and_then(|p| p.parent()).map(Path::to_path_buf).unwrap_or_default()
    }

    /// A path the file gives, relative to the file.
    pub fn rel(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir().join(p)
        }
    }

    fn system(&self) -> bool {
        self.install == apollo_shared::paths::Install::System
    }

    pub fn data_dir(&self) -> PathBuf {
        use apollo_shared::paths::{PROJECT_DATA, SYSTEM_DATA};
        let default = if self.system() { SYSTEM_DATA } else { PROJECT_DATA };
        self.rel(self.data_dir.as_deref().unwrap_or(Path::new(default)))
    }

    /// The directories plugins are registered from, in order: `plugins_path`
    /// (relative to the config's directory), else `<tasks>/plugins`.
    pub fn plugin_dirs(&self) -> Vec<PathBuf> {
        match &self.plugins_path {
            // Absolute, as the watcher reports paths.
            Some(dirs) => {
                dirs.iter().map(|d| std::path::absolute(self.rel(d)).unwrap_or_else(|_| self.rel(d))).collect()
            }
            None => vec![self.tasks_dir().join("plugins")],
        }
    }

    pub fn tasks_dir(&self) -> PathBuf {
        use apollo_shared::paths::{PROJECT_TASKS, SYSTEM_TASKS};
        let default = if self.system() { SYSTEM_TASKS } else { PROJECT_TASKS };
        self.rel(self.tasks.as_deref().unwrap_or(Path::new(default)))
    }

    pub fn socket_path(&self) -> PathBuf {
        match self.socket.path.as_deref() {
            Some(p) => self.rel(p),
            None if self.system() && self.data_dir.is_none() => PathBuf::from(apollo_shared::paths::SYSTEM_SOCKET),
            None => self.data_dir().join("agent.sock"),
        }
    }

    /// The rolling log directory, relative to the config file.
    pub fn log_dir(&self) -> Option<PathBuf> {
        self.logging.dir.as_deref().map(|d| self.rel(d))
    }

    /// An external plugin's executable, relative to the config file.
    pub fn command_path(&self, command: &str) -> PathBuf {
        self.rel(Path::new(command))
    }

    pub fn db_path(&self) -> PathBuf {
        match &self.database.url {
            Some(u) => {
                let p = u.strip_prefix("sqlite://").or_else(|| u.strip_prefix("sqlite:")).unwrap_or(u);
                self.rel(Path::new(p))
            }
            None => self.data_dir().join("apollo.db"),
        }
    }
}

#[cfg(test)]
mod tests;

/// A duration as a person writes it: `30d`, `12h`, `90s`.
fn humantime(d: std::time::Duration) -> String {
    let s = d.as_secs_f64();
    match s {
        s if s >= 86_400.0 && s % 86_400.0 == 0.0 => format!("{}d", s / 86_400.0),
        s if s >= 3_600.0 && s % 3_600.0 == 0.0 => format!("{}h", s / 3_600.0),
        s if s >= 60.0 && s % 60.0 == 0.0 => format!("{}m", s / 60.0),
        s => format!("{s}s"),
    }
}
