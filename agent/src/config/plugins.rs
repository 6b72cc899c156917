//! `plugins:`: registrations of built-in classes and external commands,
//! and a worker plugin's process pool.

use super::duration::{duration, opt_timeout, TimeoutConf};
use serde::{Deserialize, Deserializer};
use serde_json::json;
use std::time::Duration;

/// The built-in plugin classes a config may register under a name of its
/// own, as the original design names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BuiltinClass {
    FileDownloader,
    DataParser,
    ReportGenerator,
    Shell,
    HttpRequest,
    Sleep,
    Approval,
    Task,
}

impl BuiltinClass {
    pub const ALL: [BuiltinClass; 8] = [
        BuiltinClass::FileDownloader,
        BuiltinClass::DataParser,
        BuiltinClass::ReportGenerator,
        BuiltinClass::Shell,
        BuiltinClass::HttpRequest,
        BuiltinClass::Sleep,
        BuiltinClass::Approval,
        BuiltinClass::Task,
    ];

    /// The class name, as a config writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            BuiltinClass::FileDownloader => "apollo.plugins.downloader.FileDownloader",
            BuiltinClass::DataParser => "apollo.plugins.parser.DataParser",
            BuiltinClass::ReportGenerator => "apollo.plugins.report.ReportGenerator",
            BuiltinClass::Shell => "apollo.plugins.shell.Shell",
            BuiltinClass::HttpRequest => "apollo.plugins.http.HttpRequest",
            BuiltinClass::Sleep => "apollo.plugins.sleep.Sleep",
            BuiltinClass::Approval => "apollo.plugins.approval.Approval",
            BuiltinClass::Task => "apollo.plugins.task.Task",
        }
    }

    pub fn parse(name: &str) -> Option<BuiltinClass> {
        BuiltinClass::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl<'de> Deserialize<'de> for BuiltinClass {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<BuiltinClass, D::Error> {
        let name = String::deserialize(d)?;
        BuiltinClass::parse(&name).ok_or_else(|| {
            let known: Vec<&str> = BuiltinClass::ALL.iter().map(|c| c.as_str()).collect();
            serde::de::Error::custom(format!("unknown class {name:?} (expected one of: {})", known.join(", ")))
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginReg {
    pub name: String,
    /// A built-in class such as `apollo.plugins.shell.Shell`.
    #[serde(default)]
    pub class: Option<BuiltinClass>,
    /// An external executable (see PLUGINS.md); relative to the config file.
    #[serde(default)]
    pub command: Option<String>,
    /// For a command: variables passed through from the agent's environment
    /// (besides PATH, HOME, LANG, LC_*, TZ, USER, LOGNAME, TMPDIR).
    #[serde(default)]
    pub env: Vec<String>,
    /// A duration, or `auto` (see `scheduler.auto_timeout`).
    #[serde(default, deserialize_with = "opt_timeout")]
    pub timeout: Option<TimeoutConf>,
    #[serde(default)]
    pub retry: Option<u32>,
    /// For a command whose describe says `"mode": "worker"`: its process
    /// pool (see PLUGINS.md).
    #[serde(default)]
    pub workers: Option<PoolConf>,
}

/// A plugin's pool bounds and limits (`plugins[].workers` in apollo.yaml).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConf {
    /// Workers kept even when idle (started with the registration).
    #[serde(default = "one")]
    pub min: usize,
    #[serde(default = "four")]
    pub max: usize,
    /// A call that waits this long for a worker starts another one.
    #[serde(default = "grow_after", deserialize_with = "duration")]
    pub grow_after: Duration,
    /// A worker idle this long is stopped (while more than `min` are alive).
    #[serde(default = "idle", deserialize_with = "duration")]
    pub idle: Duration,
    /// Calls one worker serves before it is replaced.
    #[serde(default = "max_calls")]
    pub max_calls: u64,
    /// Resident memory (MiB) past which a worker is replaced after its call.
    #[serde(default = "max_memory_mb")]
    pub max_memory_mb: u64,
}

fn one() -> usize {
    1
}
fn four() -> usize {
    4
}
fn grow_after() -> Duration {
    Duration::from_millis(100)
}
fn idle() -> Duration {
    Duration::from_secs(60)
}
fn max_calls() -> u64 {
    10_000
}
fn max_memory_mb() -> u64 {
    512
}

impl Default for PoolConf {
    fn default() -> Self {
        serde_json::from_value(json!({})).expect("pool defaults")
    }
}

impl PoolConf {
    /// The bounds make sense; the message names the field and what is valid.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=256).contains(&self.max) {
            return Err(format!("max: {} is out of range (expected 1 to 256)", self.max));
        }
        if self.min > self.max {
            return Err(format!("min: {} is more than max ({})", self.min, self.max));
        }
        if self.max_calls == 0 {
            return Err("max_calls: 0 is out of range (expected 1 or more)".into());
        }
        if self.max_memory_mb == 0 {
            return Err("max_memory_mb: 0 is out of range (expected 1 or more)".into());
        }
        Ok(())
    }
}
