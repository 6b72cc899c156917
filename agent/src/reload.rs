//! Live definitions: the tasks directory is watched (debounced) and re-read
//! on any change, and on SIGHUP. A new or changed valid file becomes the
//! definition for new instances (a new version hash); an invalid one leaves
//! the previous version in force and its error is logged, raised as an alert
//! and shown in `defs.list`; a deleted file disables its task for new
//! instances. Running and queued instances keep the version they were created
//! with. Editors that save through a temp file and a rename work, because
//! the whole directory is re-read.
//!
//! SIGHUP also reads the config file again and applies it (see
//! [`crate::settings`]): what changed live is logged, and each setting that
//! needs a restart is logged and raised as a `restart_needed` alert. A file
//! that no longer parses changes nothing and is raised as a `config_error`.

use crate::catalog::{self, Catalog};
use crate::plugins::Plugins;
use crate::server::Access;
use crate::settings::Settings;
use crate::store::Store;
use apollo_shared::protocol::{EventData, Topic};
use notify_debouncer_full::notify::RecursiveMode;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

pub struct Reloader {
    pub dir: PathBuf,
    pub catalog: Arc<RwLock<Catalog>>,
    pub plugins: Arc<Plugins>,
    /// The settings in force; SIGHUP reads the config file again into them.
    pub settings: Arc<Settings>,
    /// The socket's roles, set anew from `socket.operators`/`observers`.
    pub access: Arc<Access>,
    pub store: Store,
    /// Woken after each reload (the cron runner re-plans).
    pub reloaded: Arc<Notify>,
    /// Watch the directory (else only SIGHUP reloads).
    pub watch: bool,
    /// SIGHUP, registered before the socket answers (an unhandled SIGHUP
    /// would end the agent), or `None` when it cannot be.
    pub hangup: Option<tokio::signal::unix::Signal>,
}

/// What a reload changed.
#[derive(Debug, Default, PartialEq)]
pub struct Summary {
    pub loaded: usize,
    pub changed: Vec<String>,
    pub failed: Vec<String>,
    pub removed: Vec<String>,
}

impl Reloader {
    /// Re-reads the directory and swaps the catalog.
    pub async fn reload(&self) -> Summary {
        self.reload_and(true).await
    }

    /// As [`Reloader::reload`]; with `always` false, announced (and
    /// swapped) only when something changed.
    async fn reload_and(&self, always: bool) -> Summary {
        let fresh = catalog::load_dir(&self.dir, &self.plugins.get());
        let (merged, summary, new_errors) = {
            let old = self.catalog.read().expect("catalog");
            let merged = Catalog::merge(&old, fresh);
            let changed: Vec<String> = merged
                .defs
                .iter()
                .filter(|(t, l)| old.defs.get(*t).is_none_or(|o| o.hash != l.hash))
                .map(|(t, _)| t.clone())
                .collect();
            let new_errors: Vec<String> = merged
                .errors
                .iter()
                .filter(|(f, e)| old.errors.get(*f) != Some(e))
                .flat_map(|(_, e)| e.iter().map(|x| x.to_string()))
                .collect();
            let removed: Vec<String> =
                merged.removed.keys().filter(|t| !old.removed.contains_key(*t)).cloned().collect();
            let failed = merged.errors.keys().map(|f| f.display().to_string()).collect();
            let summary = Summary { loaded: merged.defs.len(), changed, failed, removed };
            (merged, summary, new_errors)
        };
        let moved = !summary.changed.is_empty() || !new_errors.is_empty() || !summary.removed.is_empty();
        if !always && !moved {
            return summary;
        }
        for task in &summary.changed {
            if let Some(l) = merged.defs.get(task) {
                let _ = self.store.put_def(&l.hash, task, &l.file.display().to_string(), &l.source).await;
            }
        }
        *self.catalog.write().expect("catalog") = merged;
        for e in &new_errors {
            tracing::warn!("definition not loaded (the previous version, if any, stays in force): {e}");
            let _ = self.store.alert(apollo_shared::protocol::AlertKind::DefinitionError, e, None).await;
        }
        for task in &summary.removed {
            tracing::warn!(task = %task, "definition file deleted; the task is disabled for new instances");
        }
        if moved {
            tracing::info!(loaded = summary.loaded, changed = ?summary.changed, removed = ?summary.removed, errors = new_errors.len(), "definitions reloaded");
        }
        self.store.bus().publish(
            Topic::Defs,
            EventData::DefsReloaded {
                changed: summary.changed.clone(),
                removed: summary.removed.clone(),
                errors: new_errors.clone(),
            },
        );
        self.reloaded.notify_waiters();
        summary
    }

    /// Reads the config file again and puts the live settings in force:
    /// scheduler and queue limits, roles, alert hooks, metrics, and the
    /// plugins (the file's `plugins:` and the executables in
    /// `<tasks dir>/plugins/`, each described anew). A file that no longer
    /// parses changes nothing.
    pub async fn reload_config(&self) {
        let fresh = match self.settings.get().reread() {
            Ok(fresh) => fresh,
            Err(e) => {
                let msg = format!("{e:#}; the settings in force are kept");
                tracing::warn!("{msg}");
                let _ = self.store.alert(apollo_shared::protocol::AlertKind::ConfigError, &msg, None).await;
                return;
            }
        };
        // A freeze window naming a queue or task nobody knows would freeze
        // nothing: the config is refused as a bad one is, the windows in
        // force are kept.
        let unknown = catalog::freeze_targets(&fresh, &self.catalog.read().expect("catalog"));
        if !unknown.is_empty() {
            let msg = format!("{}; the settings in force are kept", unknown.join("; "));
            tracing::warn!("{msg}");
            let _ = self.store.alert(apollo_shared::protocol::AlertKind::ConfigError, &msg, None).await;
            return;
        }
        let applied = self.settings.apply(fresh);
        let config = self.settings.get();
        for name in &applied.need_restart {
            let msg = format!(
                "config: {name} changed in {}; it takes effect when the agent restarts (the value in force is kept)",
                config.source.as_deref().map(|p| p.display().to_string()).unwrap_or_else(|| "the config".into())
            );
            tracing::warn!("{msg}");
            let _ = self.store.alert(apollo_shared::protocol::AlertKind::RestartNeeded, &msg, None).await;
        }
        self.access.set(&config.socket);
        tracing::info!(applied = ?applied.changed, need_restart = ?applied.need_restart, "SIGHUP: config read again");
        self.reload_plugins().await;
        self.store.bus().publish(
            Topic::Agent,
            EventData::ConfigReloaded {
                applied: applied.changed.iter().map(|s| s.to_string()).collect(),
                need_restart: applied.need_restart.iter().map(|s| s.to_string()).collect(),
            },
        );
    }

    /// Registers the plugins anew, as at start: the config's registrations
    /// and the executables in `<tasks>/plugins/`, each described; one that
    /// cannot be is raised as a `plugin_error` naming its file and why.
    pub async fn reload_plugins(&self) {
        let config = self.settings.get();
        let registry = crate::plugins::load(&config).await;
        for b in &registry.broken {
            let msg = format!("plugin {:?} ({}) is not usable: {}", b.name, b.command.display(), b.error);
            tracing::warn!("{msg}");
            let _ = self.store.alert(apollo_shared::protocol::AlertKind::PluginError, &msg, None).await;
        }
        tracing::info!(plugins = registry.all().count(), broken = registry.broken.len(), "plugins registered");
        self.plugins.set(registry);
    }

    /// Watches the directory and listens for SIGHUP until shutdown.
    pub async fn run(mut self, shutdown: CancellationToken) {
        // true: a plugin file changed (the plugins are registered anew,
        // then the definitions read again); false: a definition changed.
        // The tests hold the watch's start back here (`sleep(ms)`).
        fail::fail_point!("reload.before_watch");
        let (tx, mut rx) = mpsc::unbounded_channel::<bool>();
        // The plugin path is read at the start (a changed `plugins_path`
        // waits for a restart, as `tasks` does).
        // Every path watched is made absolute once, here: the watcher reports
        // absolute paths, and a relative `tasks` (an agent started in a
        // project directory) would never equal one.
        let absolute = |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let tasks_dir = absolute(&self.dir);
        let plugin_dirs: Vec<PathBuf> = self.settings.get().plugin_dirs().iter().map(|d| absolute(d)).collect();
        let watcher = {
            let (tx, tasks_dir, plugin_dirs) = (tx.clone(), tasks_dir.clone(), plugin_dirs.clone());
            notify_debouncer_full::new_debouncer(Duration::from_millis(200), None, move |res| {
                if let Ok(events) = res {
                    let events: Vec<notify_debouncer_full::DebouncedEvent> = events;
                    // Reading a file (the agent running a plugin opens it) changes nothing.
                    let paths = || events.iter().filter(|e| !e.kind.is_access()).flat_map(|e| e.paths.iter());
                    let in_plugins =
                        |p: &std::path::PathBuf| plugin_dirs.iter().any(|d| p.parent() == Some(d.as_path()) || p == d);
                    if paths().any(in_plugins) {
                        let _ = tx.send(true);
                    } else if paths().any(|p| {
                        p.parent() == Some(tasks_dir.as_path())
                            && matches!(p.extension().and_then(|x| x.to_str()), Some("yaml" | "yml"))
                    }) {
                        let _ = tx.send(false);
                    }
                }
            })
        };
        let _watcher = match watcher {
            _ if !self.watch => None,
            // Recursive: `plugins/` is watched too, made before or after.
            Ok(mut w) => match w.watch(&tasks_dir, RecursiveMode::Recursive) {
                Ok(()) => {
                    // A plugin directory outside the tasks directory is
                    // watched on its own.
                    for d in plugin_dirs.iter().filter(|d| !d.starts_with(&tasks_dir)) {
                        if let Err(e) = w.watch(d, RecursiveMode::NonRecursive) {
                            tracing::warn!(dir = %d.display(), error = %e, "cannot watch the plugin directory; register with SIGHUP");
                        }
                    }
                    Some(w)
                }
                Err(e) => {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "cannot watch the tasks directory; reload with SIGHUP");
                    None
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the file watcher; reload with SIGHUP");
                None
            }
        };
        // What was written between the load at start and the watch's start
        // is read now: from here on the watcher sees every change.
        if _watcher.is_some() {
            self.reload_and(false).await;
        }
        let mut hup = self.hangup.take();
        loop {
            let hangup = async {
                match hup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some(plugins) = rx.recv() => {
                    // Coalesce a burst of changes into one reload.
                    let mut plugins = plugins;
                    while let Ok(p) = rx.try_recv() {
                        plugins |= p;
                    }
                    if plugins {
                        self.reload_plugins().await;
                    }
                    self.reload().await;
                }
                _ = hangup => {
                    tracing::info!("SIGHUP: reloading the config, plugins and definitions");
                    self.reload_config().await;
                    self.reload().await;
                }
                _ = shutdown.cancelled() => return,
            }
        }
    }
}
