//! The agent's configuration (`apollo.yaml`).
//!
//! Every section is optional; an agent with no config file runs the bundled
//! tasks from `./tasks` with its data in `./.apollo`. Paths in the file are
//! relative to the file's directory; paths given on the command line are
//! relative to the working directory.

mod events;

pub use events::{EventsConf, HttpEventsConf, S3Conf, SourceConf, StorageConf};

use anyhow::{bail, Context as _};
use apollo_shared::def::parse_duration;
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// Paths given on the command line (or `APOLLO_SOCKET`), already absolute,
/// and `--name`.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub tasks: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    pub name: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AgentConf {
    /// This agent's name in leases, history, alerts and the console
    /// (default: the host name). Letters, digits, `.`, `_` and `-`.
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Database {
    /// `sqlite:PATH` or a plain path (default `<data_dir>/apollo.db`), or
    /// `postgres://user@host:port/db` for a database several agents share.
    #[serde(default)]
    pub url: Option<String>,
    /// PostgreSQL: the schema this installation's tables live in, so several
    /// installations (and the tests) can share one server.
    #[serde(default = "default_schema")]
    pub schema: String,
    /// PostgreSQL: an optional replica for the console's and the CLI's reads.
    #[serde(default)]
    pub read_url: Option<String>,
    /// PostgreSQL with `sslmode=require`: a PEM file of certificate
    /// authorities to trust besides the web's (a private CA).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Reader connections kept open (the writer has its own).
    #[serde(default = "default_pool")]
    pub pool_size: usize,
    /// `full` (default: an acknowledged write survives power loss) or `normal`
    /// (survives an agent crash, may lose the last commits on power loss).
    #[serde(default = "default_sync")]
    pub synchronous: String,
    /// The environment variable that holds the database password, when the
    /// database needs one. The password itself is never read from the file.
    #[serde(default)]
    pub password_env: Option<String>,
}

impl Database {
    /// The URL's problems: a scheme other than sqlite: and postgres://
    /// (a `mysql://x` was taken for a file path), and a password in it (a
    /// password comes only from the environment).
    fn problems(&self, file: &str) -> Vec<String> {
        let mut out = Vec::new();
        for (field, url) in [("url", &self.url), ("read_url", &self.read_url)] {
            let Some(url) = url else { continue };
            let scheme = url.split_once(':').map(|(s, _)| s).filter(|s| {
                s.len() > 1 && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            });
            match scheme {
                Some("sqlite") if field == "url" => {}
                Some("postgres" | "postgresql") => {
                    if !url.contains("://") {
                        out.push(format!(
                            "{file}: database.{field}: {url:?} is not valid (expected postgres://user@host:port/db)"
                        ));
                    }
                    let userinfo =
                        url.split_once("://").map(|(_, r)| r.split(['/', '?']).next().unwrap_or("")).unwrap_or("");
                    let in_query =
                        url.split_once('?').is_some_and(|(_, q)| q.split('&').any(|kv| kv.starts_with("password=")));
                    if userinfo.rsplit_once('@').is_some_and(|(u, _)| u.contains(':')) || in_query {
                        out.push(format!(
                            "{file}: database.{field}: the URL holds a password, and passwords are never read from the \
                             config file: remove it from the URL and set database.password_env: APOLLO_DB_PASSWORD \
                             (the environment variable that holds it)"
                        ));
                    }
                }
                Some(other) => out.push(format!(
                    "{file}: database.{field}: {url:?} is not valid: {other}: is not a store this agent knows (expected {})",
                    if field == "url" {
                        "sqlite:PATH for the embedded store, or postgres://user@host:port/db (postgresql:// too)"
                    } else {
                        "postgres://user@host:port/db (postgresql:// too)"
                    }
                )),
                None => {}
            }
        }
        out
    }
}

impl Socket {
    /// Users and groups that do not exist on this host (numbers are taken
    /// as they are: a uid or gid need not have a name).
    fn problems(&self, file: &str) -> Vec<String> {
        let mut out = Vec::new();
        for (field, names) in [("operators", &self.operators), ("observers", &self.observers)] {
            for (i, n) in names.iter().enumerate() {
                match n.strip_prefix('@') {
                    Some(g) if g.parse::<u32>().is_ok() => {}
                    Some(g) => {
                        if nix::unistd::Group::from_name(g).ok().flatten().is_none() {
                            out.push(format!(
                                "{file}: socket.{field}[{i}]: there is no group {g:?} on this host (a group is @name or @gid)"
                            ));
                        }
                    }
                    None if n.parse::<u32>().is_ok() => {}
                    None => {
                        if nix::unistd::User::from_name(n).ok().flatten().is_none() {
                            out.push(format!(
                                "{file}: socket.{field}[{i}]: there is no user {n:?} on this host (a user name or uid; a group is @name)"
                            ));
                        }
                    }
                }
            }
        }
        out
    }
}

fn default_sync() -> String {
    "full".into()
}
fn default_schema() -> String {
    "apollo".into()
}
fn default_pool() -> usize {
    4
}

impl Default for Database {
    fn default() -> Self {
        serde_json::from_value(serde_json::json!({})).expect("database defaults")
    }
}

impl Database {
    pub fn is_postgres(&self) -> bool {
        self.url.as_deref().is_some_and(|u| u.starts_with("postgres://") || u.starts_with("postgresql://"))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scheduler {
    /// Instances running at once, across all queues.
    #[serde(default = "default_concurrency")]
    pub concurrency: u32,
    /// Step timeout when neither the step nor its plugin registration sets one.
    #[serde(default = "secs::<300>", deserialize_with = "duration")]
    pub default_timeout: Duration,
    /// How long a claim holds an instance without renewal.
    #[serde(default = "secs::<30>", deserialize_with = "duration")]
    pub lease: Duration,
    /// An instance RUNNING longer than this factor times its expected time
    /// (the sum of its steps' timeouts) is reaped as a zombie.
    #[serde(default = "default_zombie")]
    pub zombie_factor: f64,
    /// Finished instances older than this move to the archive.
    #[serde(default = "secs::<2592000>", deserialize_with = "duration")]
    pub retention: Duration,
    /// First retry delay; doubles each retry, with jitter.
    #[serde(default = "secs::<1>", deserialize_with = "duration")]
    pub backoff_base: Duration,
    #[serde(default = "secs::<300>", deserialize_with = "duration")]
    pub backoff_max: Duration,
    /// On SIGTERM, how long running steps may take to finish.
    #[serde(default = "secs::<30>", deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// Between SIGTERM and SIGKILL for a timed-out subprocess.
    #[serde(default = "secs::<5>", deserialize_with = "duration")]
    pub kill_grace: Duration,
    #[serde(default = "default_output_bytes")]
    pub step_output_bytes: usize,
    #[serde(default = "default_context_bytes")]
    pub context_bytes: usize,
    /// Most missed fires a `catchup: all` schedule runs after downtime.
    #[serde(default = "default_catchup_max")]
    pub catchup_max: usize,
    /// Per-queue limits on running instances.
    #[serde(default)]
    pub queues: BTreeMap<String, QueueConf>,
}

fn yes() -> bool {
    true
}
fn default_concurrency() -> u32 {
    8
}
fn default_catchup_max() -> usize {
    100
}
fn default_zombie() -> f64 {
    3.0
}
fn default_output_bytes() -> usize {
    apollo_shared::context::MAX_STEP_OUTPUT_BYTES
}
fn default_context_bytes() -> usize {
    apollo_shared::context::MAX_CONTEXT_BYTES
}
fn secs<const N: u64>() -> Duration {
    Duration::from_secs(N)
}

impl Default for Scheduler {
    fn default() -> Self {
        // Deserializing an empty mapping applies every field default once.
        serde_json::from_value(serde_json::json!({})).expect("scheduler defaults")
    }
}

/// Where alerts go besides the store and the bus.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AlertsConf {
    #[serde(default)]
    pub hooks: Vec<HookConf>,
}

/// One alert hook: a command (the alert as JSON on its stdin) or a webhook
/// (POSTed as JSON), for the alerts its filters let through.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConf {
    /// argv of a command, relative to the config file.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// An http(s) URL.
    #[serde(default)]
    pub webhook: Option<String>,
    /// Header name → the environment variable holding its value.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// Alert kinds to deliver (default: all).
    #[serde(default)]
    pub kinds: Vec<String>,
    /// Tasks whose instances' alerts to deliver (default: all).
    #[serde(default)]
    pub tasks: Vec<String>,
}

/// Prometheus metrics over HTTP; off unless `listen` is set.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct MetricsConf {
    /// `host:port` to serve `/metrics` on, e.g. `127.0.0.1:9464`.
    #[serde(default)]
    pub listen: Option<std::net::SocketAddr>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConf {
    /// Instances of the queue running at once, across every agent.
    #[serde(default)]
    pub limit: Option<u32>,
    /// Only these agents (by `agent.name`) claim from the queue; empty: every
    /// agent does (a shared queue). Every agent's config must say the same.
    #[serde(default)]
    pub agents: Vec<String>,
    /// The instances of each task in the queue run one at a time, in the
    /// order they were created, across every agent.
    #[serde(default)]
    pub ordered: bool,
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginReg {
    pub name: String,
    /// A built-in class such as `apollo.plugins.shell.Shell`.
    #[serde(default)]
    pub class: Option<String>,
    /// An external executable (see PLUGINS.md); relative to the config file.
    #[serde(default)]
    pub command: Option<String>,
    /// For a command: variables passed through from the agent's environment
    /// (besides PATH, HOME, LANG, LC_*, TZ, USER, LOGNAME, TMPDIR).
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default, deserialize_with = "opt_duration")]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub retry: Option<u32>,
    /// For a command whose describe says `"mode": "worker"`: its process
    /// pool (see PLUGINS.md).
    #[serde(default)]
    pub workers: Option<crate::plugins::worker::PoolConf>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Socket {
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Users (names or uids) and groups (`@name` or `@gid`) with the
    /// operator role besides the agent's own user and root.
    #[serde(default)]
    pub operators: Vec<String>,
    /// Users and groups allowed to read.
    #[serde(default)]
    pub observers: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Logging {
    #[serde(default = "default_level")]
    pub level: String,
    /// `pretty` or `json`.
    #[serde(default = "default_format")]
    pub format: String,
    /// When set, logs also go to a daily rolling file in this directory.
    #[serde(default)]
    pub dir: Option<PathBuf>,
    /// Cap on one step's log file; what comes after is dropped with a note.
    #[serde(default = "default_step_log")]
    pub step_log_bytes: u64,
}

fn default_level() -> String {
    "info".into()
}
fn default_format() -> String {
    "pretty".into()
}
fn default_step_log() -> u64 {
    10 * 1024 * 1024
}

impl Default for Logging {
    fn default() -> Self {
        Logging { level: default_level(), format: default_format(), dir: None, step_log_bytes: default_step_log() }
    }
}

/// Reads a duration inside the value's own deserializer, so an error carries
/// the field's path (`scheduler.lease`) and line.
struct DurationVisitor;

impl<'de> serde::de::Visitor<'de> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("seconds or a duration like \"30s\", \"5m\", \"1h\"")
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Duration, E> {
        self.visit_f64(v as f64)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Duration, E> {
        self.visit_f64(v as f64)
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Duration, E> {
        let n = serde_json::Number::from_f64(v).map(serde_json::Value::Number).unwrap_or_default();
        parse_duration(&n).map(Duration::from_secs_f64).map_err(E::custom)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
        parse_duration(&serde_json::Value::String(v.into())).map(Duration::from_secs_f64).map_err(E::custom)
    }
}

pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_any(DurationVisitor)
}

fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
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
    /// Parses a config document; `file` is used in messages.
    pub fn parse(src: &str, file: &str) -> anyhow::Result<Config> {
        // A file of nothing but comments (or nothing) means the defaults.
        if src.lines().all(|l| l.trim().is_empty() || l.trim_start().starts_with('#') || l.trim() == "---") {
            let cfg = Config::default();
            cfg.validate(file)?;
            return Ok(cfg);
        }
        let cfg: Config = apollo_shared::yaml::from_str(src).map_err(|e| match e.line {
            Some(line) => anyhow::anyhow!("{file}: line {line}: {}", e.message),
            None => anyhow::anyhow!("{file}: {}", e.message),
        })?;
        cfg.validate(file)?;
        Ok(cfg)
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
    fn validate(&self, file: &str) -> anyhow::Result<()> {
        let problems = self.problems(file);
        if problems.is_empty() {
            return Ok(());
        }
        bail!("{}", problems.join("\n"))
    }

    fn problems(&self, file: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if let Err(e) = self.validate_name(&format!("{file}: agent.name")) {
            problems.push(format!("{e:#}"));
        }
        problems.extend(self.events.problems(file));
        problems.extend(self.storage.problems(file));
        problems.extend(self.database.problems(file));
        problems.extend(self.socket.problems(file));
        let s = &self.scheduler;
        if s.concurrency == 0 || s.concurrency > 10_000 {
            problems.push(format!(
                "{file}: scheduler.concurrency: {} is out of range (expected 1 to 10000)",
                s.concurrency
            ));
        }
        if s.zombie_factor.is_nan() || s.zombie_factor < 1.0 {
            problems.push(format!(
                "{file}: scheduler.zombie_factor: {} is out of range (expected 1 or more)",
                s.zombie_factor
            ));
        }
        if !["full", "normal"].contains(&self.database.synchronous.as_str()) {
            problems.push(format!(
                "{file}: database.synchronous: {:?} is not valid (expected full or normal)",
                self.database.synchronous
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
                (Some(c), None) if !crate::plugins::CLASSES.contains(&c.as_str()) => problems.push(format!(
                    "{file}: plugins[{i}] ({}): unknown class {c:?} (expected one of: {})",
                    p.name,
                    crate::plugins::CLASSES.join(", ")
                )),
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

    fn rel(&self, p: &Path) -> PathBuf {
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

    /// Where the store is: the SQLite file, or the PostgreSQL database with
    /// its password from `database.password_env` (else `PGPASSWORD`).
    pub fn store_location(&self) -> anyhow::Result<crate::store::Location> {
        use crate::store::{postgres::Target, Location};
        let db = &self.database;
        if !db.is_postgres() {
            return Ok(Location::Sqlite { path: self.db_path(), synchronous_full: db.synchronous == "full" });
        }
        let password = match &db.password_env {
            Some(var) => Some(std::env::var(var).map_err(|_| {
                anyhow::anyhow!("database.password_env: the variable {var} is not set (it holds the database password)")
            })?),
            None => std::env::var("PGPASSWORD").ok(),
        };
        let url = db.url.as_deref().unwrap_or_default();
        let ca = db.ca_file.as_deref().map(|p| self.rel(p));
        let target = Box::new(Target::with_ca(url, &db.schema, password.clone(), ca.as_deref())?);
        let read = db
            .read_url
            .as_deref()
            .map(|u| Target::with_ca(u, &db.schema, password, ca.as_deref()).map(Box::new))
            .transpose()?;
        Ok(Location::Postgres { target, read, pool: db.pool_size })
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
    fn empty_config_has_the_documented_defaults() {
        let c = Config::parse("{}", "apollo.yaml").unwrap();
        assert_eq!(c.scheduler.concurrency, 8);
        assert_eq!(c.scheduler.default_timeout, Duration::from_secs(300));
        assert_eq!(c.database.synchronous, "full");
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
        assert_eq!(c.scheduler.concurrency, Config::default().scheduler.concurrency);
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
