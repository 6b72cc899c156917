//! The settings in force. The agent starts with its config; SIGHUP reads the
//! file again and [`Settings::apply`] swaps in what can change while the
//! agent runs — scheduler and queue limits, the socket's roles, alert hooks,
//! metrics, plugin registrations. What cannot (where the data, the tasks and
//! the socket live, the database, logging) keeps its value until a restart,
//! and each such change is named so nobody believes it took effect.
//!
//! Readers take the current value with [`Settings::get`] each time they need
//! it; the parts that hold resources (the hooks, the metrics listener) watch
//! for changes with [`Settings::subscribe`].

use crate::config::Config;
use std::sync::Arc;
use tokio::sync::watch;

pub struct Settings {
    current: watch::Sender<Arc<Config>>,
}

/// What a reload did.
#[derive(Debug, Default, PartialEq)]
pub struct Applied {
    /// The live sections that changed and are now in force.
    pub changed: Vec<&'static str>,
    /// The settings that changed in the file but wait for a restart.
    pub need_restart: Vec<&'static str>,
}

/// A setting's name and how to read it (as text, to compare).
type Named = (&'static str, fn(&Config) -> String);

/// The settings that take effect only at start.
const AT_START: &[Named] = &[
    ("database", |c| format!("{:?}", c.database)),
    ("data_dir", |c| format!("{:?}", c.data_dir)),
    ("tasks", |c| format!("{:?}", c.tasks)),
    ("plugins_path", |c| format!("{:?}", c.plugins_path)),
    ("watch_tasks", |c| format!("{:?}", c.watch_tasks)),
    ("socket.path", |c| format!("{:?}", c.socket.path)),
    ("logging", |c| format!("{:?}", c.logging)),
    ("events", |c| format!("{:?}", c.events)),
    ("agent.name", |c| format!("{:?}", c.agent.name)),
];

/// The settings applied live.
const LIVE: &[Named] = &[
    ("scheduler", |c| format!("{:?}", c.scheduler)),
    ("socket.operators", |c| format!("{:?}", c.socket.operators)),
    ("socket.observers", |c| format!("{:?}", c.socket.observers)),
    ("alerts.hooks", |c| format!("{:?}", c.alerts.hooks)),
    ("metrics", |c| format!("{:?}", c.metrics)),
    ("plugins", |c| format!("{:?}", c.plugins)),
    ("storage", |c| format!("{:?}", c.storage)),
];

impl Settings {
    pub fn new(config: Config) -> Settings {
        Settings { current: watch::Sender::new(Arc::new(config)) }
    }

    /// The settings in force now.
    pub fn get(&self) -> Arc<Config> {
        self.current.borrow().clone()
    }

    /// A receiver that sees each change.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Config>> {
        self.current.subscribe()
    }

    /// Puts `fresh` (the file as read again) in force, except the settings
    /// that need a restart: those keep their values, and are listed.
    pub fn apply(&self, mut fresh: Config) -> Applied {
        let old = self.get();
        let differs = |(_, read): &&Named| read(&old) != read(&fresh);
        let applied = Applied {
            changed: LIVE.iter().filter(differs).map(|(name, _)| *name).collect(),
            need_restart: AT_START.iter().filter(differs).map(|(name, _)| *name).collect(),
        };
        fresh.database = old.database.clone();
        fresh.data_dir = old.data_dir.clone();
        fresh.tasks = old.tasks.clone();
        fresh.plugins_path = old.plugins_path.clone();
        fresh.watch_tasks = old.watch_tasks;
        fresh.socket.path = old.socket.path.clone();
        fresh.logging = old.logging.clone();
        fresh.events = old.events.clone();
        fresh.agent = old.agent.clone();
        fresh.source = old.source.clone();
        fresh.install = old.install;
        if !applied.changed.is_empty() {
            self.current.send_replace(Arc::new(fresh));
        }
        applied
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(src: &str) -> Config {
        Config::parse(src, "apollo.yaml").unwrap()
    }

    #[test]
    fn live_settings_change_and_the_rest_wait_for_a_restart() {
        let s = Settings::new(parse("scheduler:\n  concurrency: 2\ndata_dir: /a\n"));
        let applied = s.apply(parse(
            "scheduler:\n  concurrency: 5\ndata_dir: /b\ndatabase:\n  synchronous: normal\n\
             metrics:\n  listen: 127.0.0.1:9464\n",
        ));
        assert_eq!(applied.changed, ["scheduler", "metrics"]);
        assert_eq!(applied.need_restart, ["database", "data_dir"]);
        let now = s.get();
        assert_eq!(now.scheduler.concurrency(), 5);
        assert!(now.metrics.listen.is_some());
        assert_eq!(now.data_dir.as_deref(), Some(std::path::Path::new("/a")));
        assert_eq!(now.database.synchronous, crate::config::Synchronous::Full);
    }

    #[test]
    fn an_unchanged_file_changes_nothing() {
        let s = Settings::new(parse("scheduler:\n  concurrency: 2\n"));
        let mut rx = s.subscribe();
        rx.mark_unchanged();
        assert_eq!(s.apply(parse("scheduler:\n  concurrency: 2\n")), Applied::default());
        assert!(!rx.has_changed().unwrap());
    }
}
