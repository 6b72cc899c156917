//! The agent's configuration (`apollo.yaml`).
//!
//! Every section is optional; an agent with no config file runs the bundled
//! tasks from `./tasks` with its data in `./.apollo`. Paths in the file are
//! relative to the file's directory; paths given on the command line are
//! relative to the working directory.

mod database;
mod duration;
mod events;
mod file;
mod freezes;
mod plugins;
mod problems;
mod scheduler;
mod sections;

pub use database::{Database, Synchronous};
pub use duration::TimeoutConf;
pub use events::{EventsConf, HttpEventsConf, S3Conf, SourceConf, StorageConf};
pub use file::{resolve_path, Config, Overrides};
pub use freezes::{unknown_targets, Freeze};
pub use plugins::{BuiltinClass, PluginReg, PoolConf};
pub use problems::Problems;
pub use scheduler::{cores, Affinity, AutoTimeout, QueueConf, Scheduler};
pub use sections::{AgentConf, AlertsConf, HookConf, Logging, MetricsConf, Socket};
