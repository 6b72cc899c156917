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
mod tests {
    use super::*;

    #[test]
    fn a_type_error_in_one_section_hides_neither_another_nor_the_checks_of_the_rest() {
        let src = "scheduler:\n  concurrency: four\nmetrics:\n  listen: nope\nlogging:\n  format: xml\n";
        let e = Config::every_problem(src, "apollo.yaml").unwrap();
        assert_eq!(e.len(), 3, "{e:#?}");
        assert!(e[0].starts_with("apollo.yaml: line 2: scheduler.concurrency:"), "{e:#?}");
        assert!(e[1].starts_with("apollo.yaml: line 4: metrics.listen:"), "{e:#?}");
        assert!(e[2].contains("logging.format: \"xml\""), "{e:#?}");
    }

    #[test]
    fn a_file_whose_shape_is_wrong_is_left_to_its_first_error() {
        assert_eq!(Config::every_problem("- a\n- b\n", "a"), None);
    }

    #[test]
    fn empty_config_has_the_documented_defaults() {
        let c = Config::parse("{}", "apollo.yaml").unwrap();
        assert_eq!(c.scheduler.concurrency, None);
        assert_eq!(c.scheduler.concurrency(), 2 * crate::config::cores());
        assert_eq!(c.scheduler.default_timeout, std::time::Duration::from_secs(300));
        assert_eq!(c.database.synchronous, crate::config::Synchronous::Full);
        assert_eq!(c.socket_path(), PathBuf::from(".apollo/agent.sock"));
    }

    #[test]
    fn errors_name_the_file_line_and_field() {
        let e = Config::parse("scheduler:\n  concurency: 4\n", "apollo.yaml").unwrap_err().to_string();
        assert!(e.starts_with("apollo.yaml: line 2: scheduler: unknown field `concurency`"), "{e}");
        let e = Config::parse("scheduler:\n  lease: forever\n", "apollo.yaml").unwrap_err().to_string();
        assert!(e.contains("scheduler.lease") && e.contains("duration like"), "{e}");
        let e = Config::parse("plugins:\n  - name: x\n    class: nope\n", "a.yaml").unwrap_err().to_string();
        assert!(e.contains("unknown class \"nope\""), "{e}");
    }

    #[test]
    fn the_config_is_checked_as_strictly_as_definitions_and_every_problem_is_listed() {
        let err = |src: &str| format!("{:#}", Config::parse(src, "apollo.yaml").unwrap_err());
        let e = err("database:\n  url: mysql://x\n");
        assert!(e.contains("database.url: \"mysql://x\" is not valid: mysql: is not a store this agent knows (expected sqlite:PATH"), "{e}");
        assert!(e.contains("postgres://user@host:port/db (postgresql:// too)"), "{e}");
        let e = err("database:\n  url: postgres://apollo:hunter2@db:5432/ops\n");
        assert!(e.contains("the URL holds a password") && e.contains("database.password_env"), "{e}");
        assert!(!e.contains("hunter2"), "the password is not repeated: {e}");
        let e = err("database:\n  url: postgres://apollo@db/ops?password=x\n");
        assert!(e.contains("the URL holds a password"), "{e}");
        let e = err("socket:\n  operators: [nosuchuser, \"@nosuchgroup\", 4242, \"@4343\", root, \"@root\"]\n");
        assert!(e.contains("socket.operators[0]: there is no user \"nosuchuser\" on this host"), "{e}");
        assert!(e.contains("socket.operators[1]: there is no group \"nosuchgroup\" on this host"), "{e}");
        assert_eq!(e.lines().count(), 2, "numbers and existing names pass: {e}");
        let e = err("metrics:\n  listen: localhost:9464\n");
        assert!(e.contains("metrics.listen: invalid socket address syntax (expected an IP address and a port, for example 127.0.0.1:9464)"), "{e}");
        // Every problem, not the first one only.
        let e = err("scheduler:\n  concurrency: 0\ndatabase:\n  url: mysql://x\nlogging:\n  format: xml\n");
        assert_eq!(e.lines().count(), 3, "{e}");
        // Nothing but comments: the defaults.
        let c = Config::parse("# nothing set here yet\n\n", "apollo.yaml").unwrap();
        assert_eq!(c.scheduler.concurrency(), Config::default().scheduler.concurrency());
        assert!(Config::parse("", "apollo.yaml").is_ok());
        // What passes: sqlite:, a plain path, postgres:// and postgresql://.
        for url in ["sqlite:data/a.db", "data/a.db", "postgres://apollo@db:5432/ops", "postgresql://db/ops"] {
            assert!(Config::parse(&format!("database:\n  url: {url}\n"), "a").is_ok(), "{url}");
        }
    }

    #[test]
    fn a_system_config_defaults_to_the_system_paths() {
        let mut c = Config::parse("scheduler:\n  concurrency: 2\n", "x").unwrap();
        c.source = Some(PathBuf::from("/etc/apollo/apollo.yaml"));
        c.install = apollo_shared::paths::Install::System;
        assert_eq!(c.tasks_dir(), PathBuf::from("/etc/apollo/tasks"));
        assert_eq!(c.data_dir(), PathBuf::from("/var/lib/apollo"));
        assert_eq!(c.socket_path(), PathBuf::from("/run/apollo/agent.sock"));
        assert_eq!(c.db_path(), PathBuf::from("/var/lib/apollo/apollo.db"));
    }

    #[test]
    fn paths_are_relative_to_the_config_file() {
        let mut c = Config::parse("tasks: defs\ndata_dir: /var/lib/apollo\n", "x").unwrap();
        c.source = Some(PathBuf::from("/etc/apollo/apollo.yaml"));
        assert_eq!(c.tasks_dir(), PathBuf::from("/etc/apollo/defs"));
        assert_eq!(c.db_path(), PathBuf::from("/var/lib/apollo/apollo.db"));
    }
}
