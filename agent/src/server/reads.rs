//! The methods that describe what the agent holds and how it fares: the
//! definitions and plugins it loaded, the queues, its status.

use super::api::Api;
use crate::triggers::store_error as store_err;
use apollo_shared::protocol::*;
use serde_json::{json, Value};

impl Api {
    /// The agents on the store, each with the tasks of `affinity: task`
    /// queues it serves now: the owner each claim computes, from the same
    /// live agents (not stopped, heartbeat younger than half a lease).
    pub(super) async fn agents(&self) -> Result<Vec<AgentInfo>, RpcError> {
        use crate::store::affinity::owner;
        let mut agents = self.listing.agents().await.map_err(store_err)?;
        let live: Vec<String> = agents.iter().filter(|a| !a.stopped && !a.late).map(|a| a.name.clone()).collect();
        let config = self.h.settings.get();
        let cat = self.h.catalog.read().expect("catalog");
        for l in cat.defs.values() {
            let Some(q) = config.scheduler.queues.get(&l.def.queue).filter(|q| q.affinity.is_some()) else { continue };
            let serving: Vec<String> =
                live.iter().filter(|a| q.agents.is_empty() || q.agents.contains(a)).cloned().collect();
            if let Some(o) = owner(&l.def.task, &serving) {
                if let Some(a) = agents.iter_mut().find(|a| a.name == o) {
                    a.tasks.push(l.def.task.clone());
                }
            }
        }
        for a in &mut agents {
            a.tasks.sort();
        }
        Ok(agents)
    }

    pub fn defs(&self) -> Vec<DefInfo> {
        let cat = self.h.catalog.read().expect("catalog");
        let now = chrono::Utc::now();
        let errors_of = |file: &std::path::Path| -> Vec<String> {
            cat.errors.get(file).map(|errs| errs.iter().map(|e| e.to_string()).collect()).unwrap_or_default()
        };
        let mut out: Vec<DefInfo> = cat
            .defs
            .values()
            .map(|l| DefInfo {
                task: l.def.task.clone(),
                file: l.file.display().to_string(),
                hash: Some(l.hash.clone()),
                queue: Some(l.def.queue.clone()),
                priority: Some(l.def.priority),
                schedule: l.def.schedule.clone(),
                next_fire: crate::triggers::cron::next_fire(l, now),
                on_event: l.def.on_event.clone(),
                steps: l.def.steps.iter().map(|s| s.name.clone()).collect(),
                params: serde_json::to_value(&l.def.params).unwrap_or_default(),
                // A version in force whose file now fails shows the file's errors.
                errors: errors_of(&l.file),
            })
            .collect();
        for file in cat.errors.keys().filter(|f| !cat.defs.values().any(|l| &l.file == *f)) {
            out.push(DefInfo {
                task: file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
                file: file.display().to_string(),
                hash: None,
                queue: None,
                priority: None,
                schedule: None,
                next_fire: None,
                on_event: None,
                steps: Vec::new(),
                params: Value::Null,
                errors: errors_of(file),
            });
        }
        out
    }

    /// Statistics of one plugin version's latest runs.
    pub(super) async fn plugin_stats(&self, name: &str, version: &str) -> Option<PluginStats> {
        PluginStats::from_runs(&self.listing.plugin_runs(name, version, 1000, None).await.ok()?)
    }

    pub(super) async fn plugins(&self) -> Vec<PluginInfo> {
        let mut out = self.plugins_registered();
        for p in out.iter_mut().filter(|p| p.error.is_none()) {
            p.stats = self.plugin_stats(&p.name, &p.version).await;
        }
        // Which live agents have each registration (on a shared store).
        let agents = match self.listing.shared() {
            true => self.listing.agents().await.ok(),
            false => None,
        };
        if let Some(agents) = agents {
            let registry = self.h.plugins.get();
            for p in out.iter_mut().filter(|p| p.error.is_none()) {
                let here = registry_digest(&registry, &p.name, &p.version);
                for a in agents.iter().filter(|a| !a.stopped && !a.late) {
                    if let Some(cap) = a.plugins.iter().find(|c| c.name == p.name && c.version == p.version) {
                        let other = here.as_deref().is_some_and(|d| d != cap.digest);
                        p.agents.push(if other { format!("{} (other build)", a.name) } else { a.name.clone() });
                    }
                }
            }
        }
        // What `timeout: auto` applies now, for the registrations that ask for it.
        let registry = self.h.plugins.get();
        let conf = self.h.settings.get().scheduler.auto_timeout.clone();
        for reg in registry.all().filter(|r| r.auto_timeout) {
            let applied = crate::timeouts::auto(&self.listing, &conf, crate::timeouts::registered(reg), reg).await;
            let version = reg.version().to_string();
            if let Some(p) = out.iter_mut().find(|p| p.name == reg.name && p.version == version) {
                p.auto_timeout = Some(applied.wire());
            }
        }
        out
    }

    pub(super) fn plugins_registered(&self) -> Vec<PluginInfo> {
        let registry = self.h.plugins.get();
        let broken = registry.broken.iter().map(|b| PluginInfo {
            name: b.name.clone(),
            class: None,
            command: Some(b.command.display().to_string()),
            version: String::new(),
            timeout_secs: 0.0,
            auto_timeout: None,
            agents: Vec::new(),
            retry: 0,
            idempotent: false,
            describe: Value::Null,
            error: Some(b.error.clone()),
            stats: None,
            pool: None,
        });
        registry
            .all()
            .map(|r| PluginInfo {
                name: r.name.clone(),
                class: r.class.map(|c| c.as_str().to_string()),
                command: r.command.as_ref().map(|c| c.display().to_string()),
                version: r.version().to_string(),
                timeout_secs: r.timeout.as_secs_f64(),
                auto_timeout: None,
                agents: Vec::new(),
                retry: r.retry,
                idempotent: r.plugin.idempotent(),
                describe: r.plugin.describe(),
                error: None,
                stats: None,
                pool: r.plugin.pool(),
            })
            .chain(broken)
            .collect()
    }

    pub(super) async fn queues(&self) -> Result<Vec<QueueStats>, RpcError> {
        let mut stats = self.listing.queue_stats().await.map_err(store_err)?;
        let config = self.h.config();
        let limits = &config.scheduler.queues;
        let mut names: Vec<String> =
            self.h.catalog.read().expect("catalog").defs.values().map(|l| l.def.queue.clone()).collect();
        names.extend(limits.keys().cloned());
        for q in names {
            if !stats.iter().any(|s| s.queue == q) {
                stats.push(QueueStats {
                    queue: q,
                    running: 0,
                    limit: None,
                    pending: 0,
                    retrying: 0,
                    oldest_pending_secs: None,
                    paused: None,
                });
            }
        }
        let paused = self.pauses().await.unwrap_or_default();
        for s in &mut stats {
            s.limit = limits.get(&s.queue).and_then(|l| l.limit).map(u64::from);
            // Only what covers the whole queue: a paused task is on its own line.
            let covering: Vec<String> = paused
                .iter()
                .filter(|p| p.scope != PauseScope::Task && p.covers(&s.queue, ""))
                .map(Pause::line)
                .collect();
            s.paused = (!covering.is_empty()).then(|| covering.join("; "));
        }
        stats.sort_by(|a, b| a.queue.cmp(&b.queue));
        Ok(stats)
    }

    pub(super) async fn status(&self) -> AgentStatus {
        // The status answers even when the store cannot be read: it says so.
        let (counts, unread) = match self.h.store.counts().await {
            Ok(c) => (c, None),
            Err(e) => (Default::default(), Some(format!("the store cannot be read: {e}"))),
        };
        let paused = self.pauses().await.unwrap_or_default();
        let cat = self.h.catalog.read().expect("catalog");
        let cfg = self.h.config();
        AgentStatus {
            agent: self.name.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            uptime_secs: self.started.elapsed().as_secs_f64(),
            store: self.h.store.location(),
            socket: self.socket.clone(),
            tasks_dir: cfg.tasks_dir().display().to_string(),
            data_dir: cfg.data_dir().display().to_string(),
            counts: counts.into_iter().map(|(k, v)| (k, json!(v))).collect(),
            definitions: cat.defs.len() as u64,
            definition_errors: cat.errors.len() as u64,
            concurrency: cfg.scheduler.concurrency(),
            cores: cfg.scheduler.concurrency.is_none().then(crate::config::cores),
            shutting_down: self.h.control.is_shutting_down(),
            store_error: self.h.store.unwritable().or(unread),
            paused,
        }
    }
}

/// This agent's digest of `name` at `version`, if registered.
fn registry_digest(registry: &crate::plugins::Registry, name: &str, version: &str) -> Option<String> {
    registry.all().find(|r| r.name == name && r.version().to_string() == version).map(|r| r.digest.clone())
}
