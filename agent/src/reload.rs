//! Live definitions: the tasks directory is watched (debounced) and re-read
//! on any change, and on SIGHUP. A new or changed valid file becomes the
//! definition for new instances (a new version hash); an invalid one leaves
//! the previous version in force and its error is logged, raised as an alert
//! and shown in `defs.list`; a deleted file disables its task for new
//! instances. Running and queued instances keep the version they were created
//! with. Editors that save through a temp file and a rename work, because
//! the whole directory is re-read.

use crate::catalog::{self, Catalog};
use crate::config::Config;
use crate::plugins::Plugins;
use crate::store::Store;
use notify_debouncer_full::notify::RecursiveMode;
use serde_json::json;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

pub struct Reloader {
    pub dir: PathBuf,
    pub catalog: Arc<RwLock<Catalog>>,
    pub plugins: Arc<Plugins>,
    /// The agent's config; on SIGHUP its file's `plugins:` section is read again.
    pub config: Arc<Config>,
    pub store: Store,
    /// Woken after each reload (the cron runner re-plans).
    pub reloaded: Arc<Notify>,
    /// Watch the directory (else only SIGHUP reloads).
    pub watch: bool,
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
        for task in &summary.changed {
            if let Some(l) = merged.defs.get(task) {
                let _ = self.store.put_def(&l.hash, task, &l.file.display().to_string(), &l.source).await;
            }
        }
        *self.catalog.write().expect("catalog") = merged;
        for e in &new_errors {
            tracing::warn!("definition not loaded (the previous version, if any, stays in force): {e}");
            let _ = self.store.alert("definition_error", e, None).await;
        }
        for task in &summary.removed {
            tracing::warn!(task = %task, "definition file deleted; the task is disabled for new instances");
        }
        if !summary.changed.is_empty() || !new_errors.is_empty() || !summary.removed.is_empty() {
            tracing::info!(loaded = summary.loaded, changed = ?summary.changed, removed = ?summary.removed, errors = new_errors.len(), "definitions reloaded");
        }
        self.store.bus().publish(
            "defs",
            "defs.reloaded",
            json!({"changed": summary.changed, "removed": summary.removed, "errors": new_errors}),
        );
        self.reloaded.notify_waiters();
        summary
    }

    /// Registers the plugins again: the config file's `plugins:` section and
    /// the executables in `<tasks dir>/plugins/`, each described anew. A
    /// config file that no longer parses keeps the registrations in force.
    pub async fn reload_plugins(&self) {
        let mut config = (*self.config).clone();
        if let Some(path) = &self.config.source {
            match Config::load(path) {
                Ok(fresh) => config.plugins = fresh.plugins,
                Err(e) => {
                    let msg = format!("{e:#}; the plugin registrations in force are kept");
                    tracing::warn!("{msg}");
                    let _ = self.store.alert("config_error", &msg, None).await;
                    return;
                }
            }
        }
        let registry = crate::plugins::load(&config).await;
        for b in &registry.broken {
            let msg = format!("plugin {:?} ({}) is not usable: {}", b.name, b.command.display(), b.error);
            let _ = self.store.alert("plugin_error", &msg, None).await;
        }
        tracing::info!(plugins = registry.all().count(), broken = registry.broken.len(), "plugins registered again");
        self.plugins.set(registry);
    }

    /// Watches the directory and listens for SIGHUP until shutdown.
    pub async fn run(self, shutdown: CancellationToken) {
        let (tx, mut rx) = mpsc::unbounded_channel::<()>();
        let watcher = {
            let tx = tx.clone();
            notify_debouncer_full::new_debouncer(Duration::from_millis(200), None, move |res| {
                if let Ok(events) = res {
                    let relevant = |e: &notify_debouncer_full::DebouncedEvent| {
                        e.paths.iter().any(|p| matches!(p.extension().and_then(|x| x.to_str()), Some("yaml" | "yml")))
                    };
                    let events: Vec<notify_debouncer_full::DebouncedEvent> = events;
                    if events.iter().any(relevant) {
                        let _ = tx.send(());
                    }
                }
            })
        };
        let _watcher = match watcher {
            _ if !self.watch => None,
            Ok(mut w) => match w.watch(&self.dir, RecursiveMode::NonRecursive) {
                Ok(()) => Some(w),
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
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            let hangup = async {
                match hup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some(()) = rx.recv() => {
                    // Coalesce a burst of changes into one reload.
                    while rx.try_recv().is_ok() {}
                    self.reload().await;
                }
                _ = hangup => {
                    tracing::info!("SIGHUP: reloading plugins and definitions");
                    self.reload_plugins().await;
                    self.reload().await;
                }
                _ = shutdown.cancelled() => return,
            }
        }
    }
}
