//! `agent:`, `socket:`, `logging:`, `alerts:` and `metrics:`.

use serde::Deserialize;
use std::path::PathBuf;

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AgentConf {
    /// This agent's name in leases, history, alerts and the console
    /// (default: the host name). Letters, digits, `.`, `_` and `-`.
    #[serde(default)]
    pub name: Option<String>,
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

impl Socket {
    /// Users and groups that do not exist on this host (numbers are taken
    /// as they are: a uid or gid need not have a name).
    pub(super) fn problems(&self, file: &str) -> Vec<String> {
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
