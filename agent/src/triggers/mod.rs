//! Triggers: the three ways work starts — manual (the protocol), scheduled
//! (`cron`), event (`events`) — all end here, as one PENDING instance of the
//! task's current definition.
//!
//! Layout:
//! - `clock`: the wall clock, injectable for tests.
//! - `cron`: schedules, catch-up after downtime, dedup per fire.
//! - `events`: received events and the definitions listening to them.

pub mod clock;
pub mod cron;
pub mod events;

use crate::catalog::Loaded;
use crate::handles::Handles;
use crate::store::{Followed, NewInstance, StoreError, Then};
use apollo_shared::context::Context;
use apollo_shared::def::TaskDef;
use apollo_shared::protocol::{code, RpcError, TriggerResult};
use serde_json::{Map, Value};

pub struct Triggers {
    /// The store, catalog, plugins and settings; the scheduler's control.
    pub h: Handles,
    /// Definition versions known to be in the store, so a trigger writes a
    /// version once rather than on every instance.
    pub stored: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Ids increase even within one millisecond, so "newest first" and list
    /// cursors follow creation order.
    ids: std::sync::Mutex<ulid::Generator>,
}

impl Triggers {
    pub fn new(h: Handles) -> Triggers {
        Triggers { h, stored: Default::default(), ids: std::sync::Mutex::new(ulid::Generator::new()) }
    }

    /// A new time-ordered id.
    pub fn new_id(&self) -> String {
        let mut g = self.ids.lock().expect("ids");
        // Generation fails only when one millisecond's random space overflows.
        g.generate().unwrap_or_else(|_| ulid::Ulid::new()).to_string()
    }
}

/// What a trigger asks for.
pub struct Request {
    pub task: String,
    pub params: Map<String, Value>,
    pub dedup_key: Option<String>,
    /// `manual`, `cron`, `event <name>`.
    pub trigger: String,
    pub actor: String,
    pub event: Option<Value>,
    /// The trace it joins (a sub-runbook's child: its parent's); else a new one.
    pub trace_id: Option<String>,
}

pub fn store_error(e: StoreError) -> RpcError {
    e.into_rpc()
}

impl Triggers {
    /// Why `task` cannot be triggered: unknown, removed, or its file broken.
    pub fn unknown_task(&self, task: &str) -> RpcError {
        let cat = self.h.catalog.read().expect("catalog");
        if let Some(file) = cat.removed.get(task) {
            return RpcError::new(
                code::NOT_FOUND,
                format!("task {task:?} is disabled: its file {} was deleted", file.display()),
            )
            .with_hint("restore the file to enable it again; instances already created keep running");
        }
        let known: Vec<&str> = cat.defs.keys().map(String::as_str).collect();
        let broken = cat.errors.iter().find(|(_, errs)| errs.iter().any(|e| e.file.contains(task)));
        let mut e =
            RpcError::new(code::NOT_FOUND, format!("no task {task:?} is defined (defined: {})", known.join(", ")));
        if let Some((file, errs)) = broken {
            e = e.with_hint(format!("{} did not load: {}", file.display(), errs[0]));
        }
        e
    }

    /// The definition in force for `task`.
    pub fn current(&self, task: &str) -> Result<Loaded, RpcError> {
        self.h.catalog.read().expect("catalog").defs.get(task).cloned().ok_or_else(|| self.unknown_task(task))
    }

    /// The instance's params: given ones over declared defaults; required ones must be given.
    pub fn fill_params(def: &TaskDef, given: Map<String, Value>) -> Result<Map<String, Value>, RpcError> {
        let invalid = |m: String| RpcError::new(code::VALIDATION_FAILED, m);
        if !def.params.is_empty() {
            if let Some(k) = given.keys().find(|k| !def.params.contains_key(*k)) {
                let known: Vec<&str> = def.params.keys().map(String::as_str).collect();
                let near = apollo_shared::text::closest(k, &known)
                    .map(|n| format!("did you mean {n:?}? "))
                    .unwrap_or_default();
                return Err(invalid(format!(
                    "task {:?} has no parameter {k:?} ({near}declared: {})",
                    def.task,
                    known.join(", ")
                )));
            }
        }
        let mut out = Map::new();
        for (k, spec) in &def.params {
            match (given.get(k), &spec.default) {
                (Some(v), _) => out.insert(k.clone(), v.clone()),
                (None, Some(d)) => out.insert(k.clone(), d.clone()),
                (None, None) if spec.required => {
                    return Err(invalid(format!("task {:?} needs parameter {k:?} (pass -p {k}=VALUE)", def.task)))
                }
                (None, None) => None,
            };
        }
        for (k, v) in given {
            out.entry(k).or_insert(v);
        }
        Ok(out)
    }

    /// The definition's locks rendered over the new instance's context
    /// (params, task, event), each once, in order.
    fn locks(def: &TaskDef, ctx: &Context) -> Result<Vec<String>, RpcError> {
        if def.locks.is_empty() {
            return Ok(Vec::new());
        }
        let map: Map<String, Value> =
            def.locks.iter().enumerate().map(|(i, l)| (format!("locks[{i}]"), Value::String(l.clone()))).collect();
        let (rendered, _) = apollo_shared::template::render(&map, &ctx.to_value(), true)
            .map_err(|e| RpcError::new(code::INVALID_PARAMS, format!("task {:?}: {e}", def.task)))?;
        let mut out: Vec<String> = Vec::new();
        for (field, v) in rendered {
            let name = v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
            if name.trim().is_empty() {
                let msg = format!("task {:?}: {field} renders empty with these params (a lock needs a name)", def.task);
                return Err(RpcError::new(code::INVALID_PARAMS, msg));
            }
            if !out.contains(&name) {
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Creates a PENDING instance of the task's current definition.
    pub async fn create(&self, r: Request) -> Result<TriggerResult, RpcError> {
        let loaded = self.current(&r.task)?;
        let def = &loaded.def;
        let params = Self::fill_params(def, r.params)?;
        // A secret the steps could not read fails the request, not a step.
        let missing = crate::secrets::missing(def);
        if !missing.is_empty() {
            return Err(RpcError::new(
                code::INVALID_PARAMS,
                format!("task {:?} cannot run: {} (nothing was created)", def.task, missing.join("; ")),
            )
            .with_hint(
                "set it in the agent's environment (e.g. the unit's EnvironmentFile) or fix secrets: in the definition",
            ));
        }
        let id = self.new_id();
        let trace_id = r.trace_id.unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()));
        let work_dir = self.h.data_dir.join("work").join(&id);
        let work_dir = std::path::absolute(&work_dir).unwrap_or(work_dir);
        let ctx = Context {
            task: def.task.clone(),
            task_id: id.clone(),
            trace_id: trace_id.clone(),
            params: params.clone(),
            work_dir: work_dir.display().to_string(),
            event: r.event,
            attempt: 1,
            steps: Map::new(),
        };
        let locks = Self::locks(def, &ctx)?;
        let store = &self.h.store;
        if !self.stored.lock().expect("stored").contains(&loaded.hash) {
            store
                .put_def(&loaded.hash, &def.task, &loaded.file.display().to_string(), &loaded.source)
                .await
                .map_err(store_error)?;
            self.stored.lock().expect("stored").insert(loaded.hash.clone());
        }
        let n = NewInstance {
            id,
            task: def.task.clone(),
            def_hash: loaded.hash.clone(),
            queue: def.queue.clone(),
            priority: def.priority,
            max_active: def.max_active,
            params,
            context: ctx.stored(),
            trace_id,
            trigger: format!("{} by {}", r.trigger, r.actor),
            dedup_key: r.dedup_key,
            steps: def.steps.iter().map(|s| (s.name.clone(), s.plugin.clone())).collect(),
            expected_secs: self.h.control.expected_secs(def),
            // A running rollout of a plugin its steps use sends it to the
            // new version with the rollout's share.
            pins: crate::plugins::rollout::arms(&self.h.plugins.rollouts(), def, &mut || rand::random::<f64>()),
            locks,
        };
        let plugins = self.h.plugins.view(Some(&n.pins));
        // With a free slot here, the same write claims (the new instance,
        // unless something comes before it) and starts its first step: one
        // commit to the first step's start instead of three. The step's
        // validate runs while that write commits, as it does for every start.
        // A queue dedicated to other agents is theirs: the write only
        // creates, without this agent's claim turn (which would keep them
        // waiting for its commit), and this agent's scheduler is not woken.
        let elsewhere = !self.h.control.serves(&def.queue);
        let (slot, terms) = if elsewhere { None } else { self.h.reserve_soon().await }.unzip();
        // (An approval step's decision is looked up before it starts.) Nor
        // does an instance on a rollout's new arm start in the write: the
        // claim in it may learn that the rollout, running as this agent
        // knew it, has ended, and the arm of an ended rollout is not acted
        // on; the executor resolves its step after the claim. A first step
        // that does not resolve here is left to the executor too, which
        // fails it, if it still does not, after the claim.
        let on_new_arm = n.pins.values().any(|p| p.new);
        let startable = !def.steps.is_empty() && !crate::steps::starts_alone(def, 0) && !on_new_arm;
        let first = (slot.is_some() && startable)
            .then(|| crate::steps::ready(&plugins, def, 0, &ctx))
            .filter(|r| r.rendered.is_ok());
        let then = first.as_ref().map_or(Then::Nothing, |r| Then::Start {
            seq: 0,
            version: &r.version,
            params: &r.params_json,
        });
        let checked = async {
            match &first {
                Some(r) => crate::steps::check(r).await,
                None => Ok(()),
            }
        };
        let (checked, done) = tokio::join!(checked, store.create_claiming(n, &r.actor, terms, then));
        let done = done.map_err(store_error)?;
        let (id, created) = (done.id, done.created);
        let claimed_it = done.claimed.iter().any(|i| i.id == id);
        if let Some(slot) = slot {
            let started = match (done.followed, first) {
                (Followed::Started(attempt), Some(ready)) => {
                    Some((id.clone(), Box::new(crate::steps::FirstStart { ready, attempt, checked: Some(checked) })))
                }
                _ => None,
            };
            slot.fill(done.claimed, started);
        }
        if created {
            crate::metrics::get().created.get_or_create(&crate::metrics::label("task", &def.task)).inc();
            tracing::info!(task_id = %id, task = %def.task, trigger = %r.trigger, "instance created");
            if !claimed_it && !elsewhere {
                self.h.control.wake();
            }
        }
        Ok(TriggerResult { id, created })
    }
}

/// The triggers as the scheduler's maker of sub-runbooks' children.
pub struct ChildMaker(pub std::sync::Arc<Triggers>);

impl crate::handles::Children for ChildMaker {
    fn create<'a>(
        &'a self,
        task: &'a str,
        params: Map<String, Value>,
        key: String,
        by: String,
        trace_id: String,
    ) -> futures::future::BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let trigger = match crate::store::parent_of(Some(&key)) {
                Some((parent, seq)) => format!("step {seq} of {parent}"),
                None => "a parent step".to_string(),
            };
            let r = Request {
                task: task.to_string(),
                params,
                dedup_key: Some(key),
                trigger,
                actor: by,
                event: None,
                // The child joins its parent's trace, so one trace id finds both.
                trace_id: Some(trace_id),
            };
            self.0.create(r).await.map(|t| t.id).map_err(|e| e.message)
        })
    }
}
