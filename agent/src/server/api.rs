//! What each protocol method does. Errors are JSON-RPC errors with a message
//! a person can act on.

use crate::bus::Bus;
use crate::handles::Handles;
use crate::scheduler::StopReason;
use crate::store::ListFilter;
use crate::triggers::store_error as store_err;
use apollo_shared::context::Context;
use apollo_shared::protocol::*;
use apollo_shared::state::TaskState;
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;

/// The methods' state: the store, catalog and plugins are the scheduler's.
pub struct Api {
    pub triggers: Arc<crate::triggers::Triggers>,
    /// The store, catalog, plugins and settings; the scheduler's control.
    pub h: Handles,
    pub name: String,
    pub started: Instant,
    pub socket: String,
    /// The store for what clients list (the replica, with `database.read_url`).
    pub listing: crate::store::Store,
}

type Reply = Result<Value, RpcError>;

/// The params of the methods that list recent records.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitParams {
    limit: Option<u32>,
}

fn params<T: DeserializeOwned>(method: &str, v: Value, expected: &str) -> Result<T, RpcError> {
    let v = if v.is_null() { json!({}) } else { v };
    serde_json::from_value(v)
        .map_err(|e| RpcError::new(code::INVALID_PARAMS, format!("{method}: {e} (expected {expected})")))
}

fn to_value<T: serde::Serialize>(v: T) -> Reply {
    serde_json::to_value(v).map_err(|e| RpcError::new(code::INTERNAL, e.to_string()))
}

impl Api {
    pub fn bus(&self) -> &Bus {
        self.h.store.bus()
    }

    pub async fn call(&self, method: &str, p: Value, role: Role, actor: &str) -> Reply {
        if MUTATING.contains(&method) && role != Role::Operator {
            return Err(RpcError::new(
                code::FORBIDDEN,
                format!("{method} needs the operator role; {actor} is an observer"),
            )
            .with_hint("ask for the user to be listed in socket.operators"));
        }
        if MUTATING.contains(&method) && self.h.control.is_shutting_down() {
            return Err(RpcError::new(code::BUSY, "the agent is shutting down; try again when it is back"));
        }
        match method {
            "hello" => {
                let h: Hello = params(method, p, "client, protocol")?;
                if let Some(v) = h.protocol.filter(|v| *v != PROTOCOL_VERSION) {
                    return Err(RpcError::new(
                        code::INVALID_PARAMS,
                        format!("protocol {v} is not supported (this agent speaks {PROTOCOL_VERSION})"),
                    ));
                }
                to_value(HelloResult {
                    agent: self.name.clone(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    protocol: PROTOCOL_VERSION,
                    role,
                })
            }
            "agent.status" => self.status().await,
            "agent.metrics" => Ok(json!({ "text": crate::metrics::scrape(&self.h).await })),
            "tasks.trigger" => {
                let p: TriggerParams = params(method, p, "task, params?, dedup_key?, reason?")?;
                let trigger = match p.reason.as_deref().map(str::trim).filter(|r| !r.is_empty()) {
                    Some(reason) => format!("manual ({reason})"),
                    None => "manual".into(),
                };
                let r = crate::triggers::Request {
                    task: p.task,
                    params: p.params,
                    dedup_key: p.dedup_key,
                    trigger,
                    actor: actor.into(),
                    event: None,
                };
                to_value(self.triggers.create(r).await?)
            }
            "tasks.dry_run" => self.dry_run(params(method, p, "task, params?")?).await,
            "tasks.get" => {
                let p: IdParams = params(method, p, "id")?;
                to_value(self.h.store.get(&p.id).await.map_err(store_err)?)
            }
            "tasks.list" => self.list(params(method, p, "state?, task?, queue?, limit?, cursor?, archived?")?).await,
            "tasks.retry" => {
                let p: IdParams = params(method, p, "id, reason?")?;
                let reason = p.reason.unwrap_or_else(|| "retry requested".into());
                self.h
                    .store
                    .manual_retry(&p.id, &format!("retry by {actor}: {reason}"), actor)
                    .await
                    .map_err(store_err)?;
                self.h.control.wake();
                to_value(self.h.store.get(&p.id).await.map_err(store_err)?)
            }
            "tasks.rollback" => {
                let p: IdParams = params(method, p, "id, reason?")?;
                let reason = p.reason.unwrap_or_else(|| "rollback requested".into());
                let lease = self.h.config().scheduler.lease;
                self.h
                    .store
                    .manual_rollback(&p.id, lease, &format!("by {actor}: {reason}"), actor)
                    .await
                    .map_err(store_err)?;
                let inst = self.h.store.get(&p.id).await.map_err(store_err)?;
                self.h.control.adopt(inst);
                to_value(self.h.store.get(&p.id).await.map_err(store_err)?)
            }
            "tasks.cancel" => self.cancel(params(method, p, "id, reason?")?, actor).await,
            "steps.logs" => self.logs(params(method, p, "id, step, offset?")?).await,
            "defs.list" => to_value(self.defs()),
            "defs.get" => {
                #[derive(serde::Deserialize)]
                struct P {
                    task: String,
                }
                let p: P = params(method, p, "task")?;
                let d = self
                    .defs()
                    .into_iter()
                    .find(|d| d.task == p.task)
                    .ok_or_else(|| self.triggers.unknown_task(&p.task))?;
                let source = self.h.catalog.read().expect("catalog").defs.get(&p.task).map(|l| l.source.to_string());
                let mut v = to_value(d)?;
                v["source"] = json!(source);
                Ok(v)
            }
            "plugins.list" => to_value(self.plugins().await),
            "queues.stats" => self.queues().await,
            "events.publish" => self.triggers.publish(params(method, p, "name, data?, dedup_key?")?, actor).await,
            "events.list" => {
                let p: LimitParams = params(method, p, "limit?")?;
                to_value(self.listing.events(p.limit.unwrap_or(100).min(1000)).await.map_err(store_err)?)
            }
            "audit.list" => {
                let p: LimitParams = params(method, p, "limit?")?;
                to_value(self.listing.audit(p.limit.unwrap_or(100).min(1000)).await.map_err(store_err)?)
            }
            "agents.list" => to_value(self.listing.agents().await.map_err(store_err)?),
            "agent.stats" => {
                let p: apollo_shared::protocol::StatsParams = params(method, p, "minutes?")?;
                let minutes = p.minutes.unwrap_or(60).clamp(1, 1440);
                let now = chrono::Utc::now();
                let since = now - chrono::TimeDelta::minutes(i64::from(minutes));
                let rows = self.listing.ended_since(since).await.map_err(store_err)?;
                to_value(super::stats::fold(&rows, minutes, now))
            }
            "alerts.list" => {
                let p: LimitParams = params(method, p, "limit?")?;
                to_value(self.listing.alerts(p.limit.unwrap_or(100).min(1000)).await.map_err(store_err)?)
            }
            _ => Err(RpcError::new(
                code::METHOD_NOT_FOUND,
                format!("unknown method {method:?} (known: {})", METHODS.join(", ")),
            )),
        }
    }

    async fn dry_run(&self, p: TriggerParams) -> Reply {
        let loaded = self.triggers.current(&p.task)?;
        let def = &loaded.def;
        let params = crate::triggers::Triggers::fill_params(def, p.params)?;
        let ctx = Context {
            task: def.task.clone(),
            task_id: "dry-run".into(),
            trace_id: "dry-run".into(),
            params,
            work_dir: self.h.data_dir.join("work").join("dry-run").display().to_string(),
            event: None,
            attempt: 1,
            steps: Map::new(),
        };
        let mut steps = Vec::new();
        for (seq, s) in def.steps.iter().enumerate() {
            let registry = self.h.plugins.get();
            let reg = registry.resolve(&s.plugin, s.version.as_deref());
            let (rendered, unresolved) = apollo_shared::template::render(&s.params, &ctx.to_value(), false)
                .unwrap_or_else(|_| (s.params.clone(), Vec::new()));
            let (version, describe, error) = match reg {
                Ok(r) => {
                    let err = r.plugin.validate(&rendered).await.err().map(|e| e.message);
                    (Some(r.version().to_string()), Some(r.plugin.describe()), err)
                }
                Err(e) => (None, None, Some(e)),
            };
            steps.push(DryRunStep {
                seq: seq as u32,
                name: s.name.clone(),
                plugin: s.plugin.clone(),
                version,
                params: Value::Object(rendered),
                unresolved,
                valid: error.is_none(),
                error,
                describe,
            });
        }
        to_value(DryRunResult { task: def.task.clone(), valid: steps.iter().all(|s| s.valid), steps })
    }

    async fn list(&self, p: ListParams) -> Reply {
        let limit = p.limit.unwrap_or(50);
        if !(1..=MAX_LIST_LIMIT).contains(&limit) {
            return Err(RpcError::new(
                code::INVALID_PARAMS,
                format!("tasks.list: limit {limit} is out of range (expected 1 to {MAX_LIST_LIMIT})"),
            ));
        }
        if let Some(c) = p.cursor.as_deref().filter(|c| ulid::Ulid::from_string(c).is_err()) {
            return Err(RpcError::new(
                code::INVALID_PARAMS,
                format!("tasks.list: cursor {c:?} is not an instance id (pass the next_cursor of the previous page)"),
            ));
        }
        let filter = ListFilter { state: p.state, task: p.task, queue: p.queue, limit, before: p.cursor };
        let store = &self.listing;
        let items =
            if p.archived { store.list_archived(filter).await } else { store.list(filter).await }.map_err(store_err)?;
        let next_cursor = (items.len() as u32 == limit).then(|| items.last().map(|i| i.id.clone())).flatten();
        to_value(ListResult { items, next_cursor })
    }

    async fn cancel(&self, p: IdParams, actor: &str) -> Reply {
        let reason = format!("by {actor}: {}", p.reason.unwrap_or_else(|| "cancel requested".into()));
        // A claim commits before the scheduler starts the executor; an
        // instance seen RUNNING but not yet held is waited for briefly.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            if let Some(mut done) = self.h.control.cancel(&p.id, StopReason::Cancel(reason.clone())) {
                let grace = self.h.config().scheduler.kill_grace + std::time::Duration::from_secs(5);
                let _ = tokio::time::timeout(grace, done.wait_for(|d| *d)).await;
                break;
            }
            let inst = self.h.store.get(&p.id).await.map_err(store_err)?;
            let expired = inst.lease_expires_at.is_none_or(|t| t < chrono::Utc::now());
            let store = &self.h.store;
            let elsewhere = inst.lease_owner.as_deref().filter(|o| *o != store.agent());
            if let (TaskState::Running, false, Some(owner)) = (inst.state, expired, elsewhere) {
                // Another agent on the shared database runs it: it is asked to stop it.
                let mut changes = store.bus().subscribe();
                store.announce("control", "cancel", json!({ "id": p.id, "reason": reason, "to": owner }));
                let grace = self.h.config().scheduler.kill_grace + std::time::Duration::from_secs(10);
                let until = tokio::time::Instant::now() + grace;
                while store.get(&p.id).await.map_err(store_err)?.state == TaskState::Running {
                    tokio::select! {
                        _ = changes.recv() => {}
                        _ = tokio::time::sleep_until(until) => return Err(RpcError::new(
                            code::BUSY,
                            format!("instance {} runs on agent {owner}, which did not stop it within {}s", p.id, grace.as_secs()),
                        )),
                    }
                }
                break;
            }
            if inst.state == TaskState::Running && expired {
                // Nobody works on it: its holder died or stopped on a store error.
                self.h.store.cancel_orphan(&p.id, &format!("cancelled {reason}"), actor).await.map_err(store_err)?;
                break;
            }
            if inst.state != TaskState::Running {
                self.h.store.cancel_waiting(&p.id, &format!("cancelled {reason}"), actor).await.map_err(store_err)?;
                break;
            }
            if std::time::Instant::now() > deadline {
                return Err(RpcError::new(
                    code::BUSY,
                    format!("instance {} is RUNNING but not held by this agent; try again", p.id),
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        to_value(self.h.store.get(&p.id).await.map_err(store_err)?)
    }

    async fn logs(&self, p: LogsParams) -> Reply {
        let inst = self.h.store.get(&p.id).await.map_err(store_err)?;
        let steps = inst.steps.unwrap_or_default();
        let step = match &p.step {
            Value::Number(n) => n.as_u64().and_then(|n| steps.iter().find(|s| s.seq as u64 == n)),
            Value::String(s) => steps.iter().find(|st| st.name == *s || st.seq.to_string() == *s),
            _ => None,
        };
        let names: Vec<String> = steps.iter().map(|s| format!("{} ({})", s.name, s.seq)).collect();
        let step = step.ok_or_else(|| {
            RpcError::new(
                code::NOT_FOUND,
                format!("instance {} has no step {} (steps: {})", p.id, p.step, names.join(", ")),
            )
        })?;
        let path = crate::logs::StepLog::path_for(&self.h.data_dir, &p.id, step.seq);
        let (text, next_offset, eof) = crate::logs::read(&path, p.offset.unwrap_or(0), 256 * 1024)
            .map_err(|e| RpcError::new(code::INTERNAL, format!("reading {}: {e}", path.display())))?;
        to_value(LogsResult { text, next_offset, eof })
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
    async fn plugin_stats(&self, name: &str, version: &str) -> Option<PluginStats> {
        let mut runs = self.listing.plugin_runs(name, version, 1000).await.ok()?;
        if runs.is_empty() {
            return None;
        }
        let n = runs.len();
        let failed = runs.iter().filter(|(f, _)| *f).count();
        runs.sort_by(|a, b| a.1.total_cmp(&b.1));
        let at = |p: f64| runs[(((n - 1) as f64) * p).round() as usize].1;
        let p99 = at(0.99);
        Some(PluginStats {
            runs: n as u64,
            failure_rate: failed as f64 / n as f64,
            p50_secs: at(0.5),
            p99_secs: p99,
            suggested_timeout_secs: (p99 * 1.5).max(1.0),
        })
    }

    async fn plugins(&self) -> Vec<PluginInfo> {
        let mut out = self.plugins_registered();
        for p in out.iter_mut().filter(|p| p.error.is_none()) {
            p.stats = self.plugin_stats(&p.name, &p.version).await;
        }
        out
    }

    fn plugins_registered(&self) -> Vec<PluginInfo> {
        let registry = self.h.plugins.get();
        let broken = registry.broken.iter().map(|b| PluginInfo {
            name: b.name.clone(),
            class: None,
            command: Some(b.command.display().to_string()),
            version: String::new(),
            timeout_secs: 0.0,
            retry: 0,
            idempotent: false,
            describe: Value::Null,
            error: Some(b.error.clone()),
            stats: None,
        });
        registry
            .all()
            .map(|r| PluginInfo {
                name: r.name.clone(),
                class: r.class.map(str::to_string),
                command: r.command.as_ref().map(|c| c.display().to_string()),
                version: r.version().to_string(),
                timeout_secs: r.timeout.as_secs_f64(),
                retry: r.retry,
                idempotent: r.plugin.idempotent(),
                describe: r.plugin.describe(),
                error: None,
                stats: None,
            })
            .chain(broken)
            .collect()
    }

    async fn queues(&self) -> Reply {
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
                });
            }
        }
        for s in &mut stats {
            s.limit = limits.get(&s.queue).and_then(|l| l.limit).map(u64::from);
        }
        stats.sort_by(|a, b| a.queue.cmp(&b.queue));
        to_value(stats)
    }

    async fn status(&self) -> Reply {
        // The status answers even when the store cannot be read: it says so.
        let (counts, unread) = match self.h.store.counts().await {
            Ok(c) => (c, None),
            Err(e) => (Default::default(), Some(format!("the store cannot be read: {e}"))),
        };
        let cat = self.h.catalog.read().expect("catalog");
        let cfg = self.h.config();
        to_value(AgentStatus {
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
            concurrency: cfg.scheduler.concurrency,
            shutting_down: self.h.control.is_shutting_down(),
            store_error: self.h.store.unwritable().or(unread),
        })
    }
}
