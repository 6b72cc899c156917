//! What each protocol method does. Errors are JSON-RPC errors with a message
//! a person can act on.

use crate::bus::Bus;
use crate::handles::Handles;
use crate::handles::StopReason;
use crate::rollouts;
use crate::store::ListFilter;
use crate::triggers::store_error as store_err;
use apollo_shared::context::Context;
use apollo_shared::protocol::methods as m;
use apollo_shared::protocol::*;
use apollo_shared::state::{StepState, TaskState};
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Instant;

mod logs;
mod timeline;
mod undo;

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

/// A method's typed result, as the answer's JSON.
fn answer<M: Method>(r: Result<M::Result, RpcError>) -> Reply {
    serde_json::to_value(r?).map_err(|e| RpcError::new(code::INTERNAL, e.to_string()))
}

/// An operator's request as its history row says it: `retry requested: WHY`
/// (the row's actor says who).
fn requested(what: &str, reason: Option<&str>) -> String {
    match reason.map(str::trim).filter(|r| !r.is_empty()) {
        Some(r) => format!("{what} requested: {r}"),
        None => format!("{what} requested"),
    }
}

/// The most a `steps.logs` answer carries.
const LOGS_READ_BYTES: usize = 256 * 1024;

/// How many recent records a list method returns.
fn limit(p: LimitParams) -> u32 {
    p.limit.unwrap_or(100).min(1000)
}

impl Api {
    pub fn bus(&self) -> &Bus {
        self.h.store.bus()
    }

    pub async fn call(&self, method: &str, p: Value, role: Role, actor: &str) -> Reply {
        if is_mutating(method) && role != Role::Operator {
            return Err(RpcError::new(
                code::FORBIDDEN,
                format!("{method} needs the operator role; {actor} is an observer"),
            )
            .with_hint("ask for the user to be listed in socket.operators"));
        }
        if is_mutating(method) && self.h.control.is_shutting_down() {
            return Err(RpcError::new(code::BUSY, "the agent is shutting down; try again when it is back"));
        }
        // Each arm answers with its method's result type.
        match Call::parse(method, p)? {
            Call::Hello(h) => answer::<m::Hello>(self.hello(h, role)),
            Call::AgentStatus(_) => answer::<m::AgentStatus>(Ok(self.status().await)),
            Call::AgentMetrics(_) => {
                let text = crate::metrics::classic(&super::metrics::scrape(&self.h).await);
                answer::<m::AgentMetrics>(Ok(MetricsText { text }))
            }
            Call::AgentStats(p) => answer::<m::AgentStats>(self.stats(p).await),
            Call::TasksTrigger(p) => answer::<m::TasksTrigger>(self.trigger(p, actor).await),
            Call::TasksDryRun(p) => answer::<m::TasksDryRun>(self.dry_run(p).await),
            Call::TasksGet(p) => answer::<m::TasksGet>(match self.h.store.get(&p.id).await {
                Ok(mut i) => {
                    self.mark_waiting(std::slice::from_mut(&mut i)).await;
                    Ok(i)
                }
                Err(e) => Err(store_err(e)),
            }),
            Call::TasksTimeline(p) => answer::<m::TasksTimeline>(self.timeline(p).await),
            Call::TasksList(p) => answer::<m::TasksList>(self.list(p).await),
            Call::TasksRetry(p) => answer::<m::TasksRetry>(self.retry(p, actor).await),
            Call::StepsSkip(p) => answer::<m::StepsSkip>(self.skip(p, actor).await),
            Call::TasksRollback(p) => answer::<m::TasksRollback>(self.rollback(p, actor).await),
            Call::TasksCancel(p) => answer::<m::TasksCancel>(self.cancel(p, actor).await),
            Call::StepsLogs(p) => answer::<m::StepsLogs>(self.logs(p).await),
            Call::StepsItems(p) => answer::<m::StepsItems>(self.items(p).await),
            Call::DefsList(_) => answer::<m::DefsList>(Ok(self.defs())),
            Call::DefsGet(p) => answer::<m::DefsGet>(self.def(&p.task)),
            Call::PluginsList(_) => answer::<m::PluginsList>(Ok(self.plugins().await)),
            Call::QueuesStats(_) => answer::<m::QueuesStats>(self.queues().await),
            Call::EventsPublish(p) => answer::<m::EventsPublish>(self.triggers.publish(p, actor).await),
            Call::EventsList(p) => answer::<m::EventsList>(self.listing.events(limit(p)).await.map_err(store_err)),
            Call::AuditList(p) => answer::<m::AuditList>(self.listing.audit(limit(p)).await.map_err(store_err)),
            Call::ArchiveExport(p) => answer::<m::ArchiveExport>(self.export(p).await),
            Call::AlertsList(p) => answer::<m::AlertsList>(self.listing.alerts(limit(p)).await.map_err(store_err)),
            Call::AgentsList(_) => answer::<m::AgentsList>(self.agents().await),
            Call::RolloutsList(_) => answer::<m::RolloutsList>(rollouts::list(&self.listing).await.map_err(store_err)),
            Call::RolloutsStart(p) => {
                let id = format!("rollout-{}", self.triggers.new_id());
                let config = self.h.settings.get();
                answer::<m::RolloutsStart>(rollouts::start(&self.h.store, &self.h.plugins, &config, p, id, actor).await)
            }
            Call::RolloutsPromote(p) => answer::<m::RolloutsPromote>(
                rollouts::end(&self.h.store, &self.h.plugins, &p.plugin, RolloutState::Promoted, &p.reason, actor)
                    .await,
            ),
            Call::RolloutsAbort(p) => answer::<m::RolloutsAbort>(
                rollouts::end(&self.h.store, &self.h.plugins, &p.plugin, RolloutState::Aborted, &p.reason, actor).await,
            ),
            Call::PausesList(_) => answer::<m::PausesList>(self.pauses().await),
            Call::ApprovalsList(_) => answer::<m::ApprovalsList>(self.approvals().await),
            Call::ApprovalsDecide(p) => answer::<m::ApprovalsDecide>(self.decide(p, actor).await),
            Call::LocksList(_) => answer::<m::LocksList>(self.listing.locks().await.map_err(store_err)),
            Call::SchedulerPause(p) => answer::<m::SchedulerPause>(self.pause(p, actor).await),
            Call::SchedulerResume(p) => answer::<m::SchedulerResume>(self.resume(p, actor).await),
            // The connection handles it: a subscription is the connection's.
            Call::Subscribe(_) => Err(RpcError::new(code::INVALID_REQUEST, "subscribe is answered by the connection")),
        }
    }

    fn hello(&self, h: Hello, role: Role) -> Result<HelloResult, RpcError> {
        if let Some(v) = h.protocol.filter(|v| *v != PROTOCOL_VERSION) {
            return Err(RpcError::new(
                code::INVALID_PARAMS,
                format!("protocol {v} is not supported (this agent speaks {PROTOCOL_VERSION})"),
            ));
        }
        Ok(HelloResult {
            agent: self.name.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            protocol: PROTOCOL_VERSION,
            role,
        })
    }

    async fn trigger(&self, p: TriggerParams, actor: &str) -> Result<TriggerResult, RpcError> {
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
            trace_id: None,
        };
        self.triggers.create(r).await
    }

    async fn retry(&self, p: IdParams, actor: &str) -> Result<Instance, RpcError> {
        let reason = requested("retry", p.reason.as_deref());
        self.h.store.manual_retry(&p.id, &reason, actor).await.map_err(store_err)?;
        self.h.control.wake();
        self.h.store.get(&p.id).await.map_err(store_err)
    }

    async fn skip(&self, p: SkipParams, actor: &str) -> Result<Instance, RpcError> {
        let reason = p.reason.trim();
        if reason.is_empty() {
            return Err(RpcError::new(
                code::INVALID_PARAMS,
                "steps.skip: a reason is required (it goes to the history and the audit)",
            ));
        }
        let inst = self.h.store.get(&p.id).await.map_err(store_err)?;
        let steps = inst.steps.unwrap_or_default();
        let step = steps.iter().find(|s| s.name == p.step || p.step.parse::<u32>().is_ok_and(|n| n == s.seq));
        let Some(step) = step else {
            let names: Vec<String> = steps.iter().map(|s| format!("{} (#{})", s.name, s.seq)).collect();
            let msg = format!("instance {} has no step {:?} (its steps: {})", p.id, p.step, names.join(", "));
            return Err(RpcError::new(code::INVALID_PARAMS, msg));
        };
        if let Some(item) = &p.item {
            let (idx, ..) = self.item_named(&p.id, step.seq, &serde_json::Value::String(item.clone())).await?;
            self.h.store.skip_item(&p.id, step.seq, idx, reason, actor).await.map_err(store_err)?;
            return self.h.store.get(&p.id).await.map_err(store_err);
        }
        self.h.store.skip_step(&p.id, step.seq, reason, actor).await.map_err(store_err)?;
        self.h.control.wake();
        self.h.store.get(&p.id).await.map_err(store_err)
    }

    fn def(&self, task: &str) -> Result<DefDetail, RpcError> {
        let info = self.defs().into_iter().find(|d| d.task == task).ok_or_else(|| self.triggers.unknown_task(task))?;
        let source = self.h.catalog.read().expect("catalog").defs.get(task).map(|l| l.source.to_string());
        Ok(DefDetail { info, source })
    }

    async fn stats(&self, p: StatsParams) -> Result<StatsResult, RpcError> {
        let minutes = p.minutes.unwrap_or(60).clamp(1, 1440);
        let now = chrono::Utc::now();
        let since = now - chrono::TimeDelta::minutes(i64::from(minutes));
        let rows = self.listing.ended_since(since).await.map_err(store_err)?;
        Ok(super::stats::fold(&rows, minutes, now))
    }

    async fn dry_run(&self, p: TriggerParams) -> Result<DryRunResult, RpcError> {
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
        // Secrets show masked; one that cannot be read fails the steps that use it.
        let missing = crate::secrets::missing(def);
        let mut over = ctx.to_value();
        if !def.secrets.is_empty() {
            let masked: Map<String, Value> =
                def.secrets.keys().map(|k| (k.clone(), Value::String(apollo_shared::def::MASK.into()))).collect();
            over["secrets"] = Value::Object(masked);
        }
        let mut steps = Vec::new();
        for (seq, s) in def.steps.iter().enumerate() {
            let registry = self.h.plugins.get();
            let reg = registry.resolve(&s.plugin, s.version.as_deref());
            // A fan-out step: its items and batches, and its first item's params.
            let (fanout, over) = match &s.foreach {
                Some(f) => {
                    let (fan, first) = dry_fanout(f, &over, self.h.config().scheduler.max_items);
                    let mut with = over.clone();
                    with[f.name.as_str()] = first;
                    (Some(fan), with)
                }
                None => (None, over.clone()),
            };
            let (rendered, unresolved) = apollo_shared::template::render(&s.params, &over, false)
                .unwrap_or_else(|_| (s.params.clone(), Vec::new()));
            let uses = |name: &str| {
                let text = format!("{} {}", Value::Object(s.params.clone()), Value::Object(s.env.clone()));
                text.contains(&format!("secrets.{name}"))
            };
            let unreadable: Vec<&String> = missing
                .iter()
                .filter(|m| def.secrets.keys().any(|k| m.starts_with(&format!("secret {k}:")) && uses(k)))
                .collect();
            let (version, describe, error, timeout) = match reg {
                Ok(r) => {
                    let check = crate::plugins::unwinding(&r.name, r.plugin.validate(&rendered));
                    let err = check.await.err().map(|e| e.message);
                    let conf = &self.h.settings.get().scheduler.auto_timeout;
                    let timeout = match crate::plugins::approval::waits(&rendered) {
                        // An approval step's time is its request's wait, not the call's.
                        Some(waits) => waits,
                        None => crate::timeouts::applied(&self.listing, conf, &def.task, s, r).await.wire(),
                    };
                    (Some(r.version().to_string()), Some(r.plugin.describe()), err, Some(timeout))
                }
                Err(e) => (None, None, Some(e), None),
            };
            let error = match unreadable.is_empty() {
                true => error,
                false => Some(unreadable.iter().map(|m| m.as_str()).collect::<Vec<_>>().join("; ")),
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
                timeout,
                fanout,
            });
        }
        Ok(DryRunResult { task: def.task.clone(), valid: steps.iter().all(|s| s.valid), steps })
    }

    async fn list(&self, p: ListParams) -> Result<ListResult, RpcError> {
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
        let filter =
            ListFilter { state: p.state, task: p.task, queue: p.queue, limit, before: p.cursor, since: p.since };
        let store = &self.listing;
        let mut items =
            if p.archived { store.list_archived(filter).await } else { store.list(filter).await }.map_err(store_err)?;
        self.mark_waiting(&mut items).await;
        let next_cursor = (items.len() as u32 == limit).then(|| items.last().map(|i| i.id.clone())).flatten();
        Ok(ListResult { items, next_cursor })
    }

    async fn cancel(&self, p: IdParams, actor: &str) -> Result<Instance, RpcError> {
        let reason =
            p.reason.as_deref().map(str::trim).filter(|r| !r.is_empty()).unwrap_or("no reason given").to_string();
        let stop = || StopReason::Cancel { actor: actor.to_string(), reason: reason.clone() };
        // A claim commits before the scheduler starts the executor; an
        // instance seen RUNNING but not yet held is waited for briefly.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            if let Some(mut done) = self.h.control.cancel(&p.id, stop()) {
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
                let ask = EventData::Cancel {
                    id: p.id.clone(),
                    to: owner.to_string(),
                    actor: actor.to_string(),
                    reason: reason.to_string(),
                };
                store.announce(Topic::Control, ask);
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
                self.h.store.cancel_orphan(&p.id, &format!("cancelled: {reason}"), actor).await.map_err(store_err)?;
                break;
            }
            if inst.state != TaskState::Running {
                self.h.store.cancel_waiting(&p.id, &format!("cancelled: {reason}"), actor).await.map_err(store_err)?;
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
        // A child cancelled while it waited lets its parent go.
        let inst = self.h.store.get(&p.id).await.map_err(store_err)?;
        if let Some((parent, _)) = crate::store::parent_of(inst.dedup_key.as_deref()) {
            if self.h.store.unpark(&parent).await.map_err(store_err)? {
                self.h.control.wake();
            }
        }
        // A sub-runbook's children go with it (after it: a child's end
        // would otherwise let the parent run on).
        for child in self.h.store.children_under_way(&p.id).await.map_err(store_err)? {
            let why = Some(format!("its parent {} was cancelled: {reason}", p.id));
            if let Err(e) = Box::pin(self.cancel(IdParams { id: child.clone(), reason: why }, actor)).await {
                tracing::warn!(child = %child, error = %e.message, "cannot cancel a cancelled instance's child");
            }
        }
        self.h.store.get(&p.id).await.map_err(store_err)
    }
}

/// A dry-run's look at a fan-out: its items rendered over `over` (an
/// earlier step's output is not there yet), the batches, the budget; and
/// the first item (null when none is known).
fn dry_fanout(f: &apollo_shared::def::Fanout, over: &Value, max: usize) -> (DryRunFanout, Value) {
    let mut map = Map::new();
    map.insert("foreach".into(), f.foreach.clone());
    let rendered = apollo_shared::template::render(&map, over, true).map(|(m, _)| m.get("foreach").cloned());
    let mut out = DryRunFanout {
        items: Vec::new(),
        count: 0,
        batches: Vec::new(),
        budget: 0,
        parallel: 0,
        problem: None,
        approve_after: f.gate.as_ref().map(|g| g.after),
    };
    let items = match rendered {
        Ok(Some(Value::Array(items))) => items,
        Ok(other) => {
            let shown = other.map(|v| apollo_shared::text::one_line(&v.to_string(), 60)).unwrap_or_default();
            out.problem = Some(format!("foreach renders {shown}, not a list"));
            return (out, Value::Null);
        }
        Err(_) => {
            out.problem = Some("known when the step starts (foreach reads what earlier steps give)".into());
            return (out, Value::Null);
        }
    };
    out.count = items.len() as u32;
    out.items = items.iter().map(|v| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())).collect();
    out.budget = f.max_failures.of_budget(items.len()) as u32;
    match f.plan(items.len()) {
        Ok(sizes) => {
            out.parallel = sizes.iter().map(|b| f.parallel(*b) as u32).max().unwrap_or(0);
            out.batches = sizes.into_iter().map(|b| b as u32).collect();
        }
        Err(e) => out.problem = Some(e),
    }
    if items.len() > max {
        out.problem = Some(format!("{} items is more than scheduler.max_items ({max}) allows", items.len()));
    }
    (out, items.first().cloned().unwrap_or(Value::Null))
}
