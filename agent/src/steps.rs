//! A step's call made ready: its plugin resolved, its params and env
//! rendered over the context and validated. The scheduler starts steps made
//! here; a trigger makes its instance's first step ready while the instance
//! is created.

use crate::catalog::Catalog;
use crate::plugins::{PluginError, Plugins, Registration, Registry};
use crate::secrets::Secrets;
use crate::store::Claimed;
use apollo_shared::context::Context;
use apollo_shared::def::Masker;
use apollo_shared::def::TaskDef;
use serde_json::{Map, Value};
use std::sync::RwLock;

/// A step's call: its plugin, params and env.
pub type Prepared = (Registration, Map<String, Value>, Vec<(String, String)>);

/// A step made ready to start: its plugin, and its params and env rendered
/// over the context (or why they cannot be).
pub struct Ready {
    pub rendered: Result<Prepared, PluginError>,
    pub version: String,
    pub params_json: Value,
    /// The secrets' values read for it, to mask what the step leaves behind.
    pub masker: Masker,
    /// A fan-out step: its params are rendered and validated per item.
    pub fanout: bool,
}

/// A step whose start is committed: its attempt, and its call validated (or
/// why it cannot run).
pub struct Started {
    pub attempt: u32,
    pub prepared: Result<Prepared, PluginError>,
    pub masker: Masker,
    /// The step's outcome known before it starts (a sub-runbook's child's):
    /// no plugin is called.
    pub given: Option<Result<Value, PluginError>>,
}

/// Step `seq` made ready, its plugin resolved in `plugins` (the registry as
/// the instance's rollout arms see it: `Plugins::view`).
/// Its secrets are read now; the params it records have their values
/// masked (the plugin gets them whole).
pub fn ready(plugins: &Registry, def: &TaskDef, seq: u32, ctx: &Context) -> Ready {
    let d = &def.steps[seq as usize];
    let reg = registration(plugins, def, seq);
    let version = reg.as_ref().map(|r| r.version_text().to_string()).unwrap_or_default();
    let mut masker = Masker::default();
    let fanout = d.foreach.is_some();
    let rendered = reg.and_then(|r| {
        let secrets = crate::secrets::resolve(def).map_err(PluginError::permanent)?;
        masker = secrets.masker.clone();
        if fanout {
            // Rendered per item, over the context and the item.
            return Ok((r, Map::new(), Vec::new()));
        }
        let params = render(&d.params, ctx, &secrets)?;
        Ok((r, params, step_env(&d.env, ctx, &secrets)?))
    });
    let params_json = match (&rendered, &d.foreach) {
        (Ok(_), Some(f)) => serde_json::json!({"foreach": f.foreach, "as": f.name}),
        (Ok((_, p, _)), None) => masker.value(&Value::Object(p.clone())),
        (Err(_), _) => Value::Null,
    };
    Ready { rendered, version, params_json, masker, fanout }
}

/// The plugin's validate of a ready step (side-effect free by contract): it
/// runs while the step's start is committed, so an external plugin's round
/// trip is hidden behind the commit instead of added to it.
pub async fn check(ready: &Ready) -> Result<(), PluginError> {
    match &ready.rendered {
        Ok(_) if ready.fanout => Ok(()),
        Ok((r, params, _)) => validate(r, params).await,
        Err(_) => Ok(()),
    }
}

/// A step started with its instance's claim (its first): validated already
/// (a trigger's, while its write committed) or not yet (the scheduler's).
pub struct FirstStart {
    pub ready: Ready,
    pub attempt: u32,
    pub checked: Option<Result<(), PluginError>>,
}

impl FirstStart {
    /// The started step, validated.
    pub async fn started(self: Box<Self>) -> Started {
        let checked = match &self.checked {
            Some(c) => c.clone(),
            None => check(&self.ready).await,
        };
        let FirstStart { ready, attempt, .. } = *self;
        ready.started(attempt, checked)
    }
}

/// A claimed instance's first step made ready in the claim's write, when
/// the instance is new (attempt 1, nothing run) and its definition version
/// is the one in force: its version and params for the start.
pub fn ready_first(plugins: &Plugins, catalog: &RwLock<Catalog>, i: &Claimed) -> Option<(Ready, String, String)> {
    let fresh =
        i.attempt == 1 && i.steps.as_ref().and_then(|s| s.first()).is_some_and(|s| s.seq == 0 && s.attempts == 0);
    if !fresh {
        return None;
    }
    let def = catalog.read().ok()?.defs.get(&i.task).filter(|l| l.hash == i.def_hash)?.def.clone();
    // An approval step's decision, a condition, is looked at before it starts.
    if def.steps.is_empty() || starts_alone(&def, 0) {
        return None;
    }
    let mut ctx = Context::of(i);
    ctx.attempt = i.attempt;
    let r = ready(&plugins.view(i.pins.as_ref()), &def, 0, &ctx);
    let (version, params) = (r.version.clone(), r.params_json.to_string());
    Some((r, version, params))
}

/// Whether step `seq` is an approval step: it never starts in the write of
/// the step before it, a claim's or a trigger's, since its decision is
/// looked up first (`scheduler::approvals`).
pub fn is_approval(def: &TaskDef, seq: u32) -> bool {
    def.steps.get(seq as usize).is_some_and(|d| d.plugin == "approval")
}

/// Whether step `seq` is started only by the executor, never in another
/// write (the claim's, the trigger's, the step before's SUCCESS): an
/// approval step (its decision is looked up first) and a step with `when:`
/// (its condition is rendered first, over the context as it is then).
pub fn starts_alone(def: &TaskDef, seq: u32) -> bool {
    is_approval(def, seq)
        || def.steps.get(seq as usize).is_some_and(|d| d.when.is_some() || d.foreach.is_some() || d.task.is_some())
}

/// A fan-out step's items: its `foreach:` rendered over the context (and
/// the secrets' values), which must give a list.
pub fn items(def: &TaskDef, seq: u32, ctx: &Context, secrets: &Secrets) -> Result<Vec<Value>, PluginError> {
    let Some(f) = def.steps.get(seq as usize).and_then(|d| d.foreach.as_ref()) else { return Ok(Vec::new()) };
    let mut map = Map::new();
    map.insert("foreach".into(), f.foreach.clone());
    let rendered = render_field(&map, ctx, "step", secrets)?.remove("foreach").unwrap_or(Value::Null);
    match rendered {
        Value::Array(items) => Ok(items),
        other => {
            let kind = apollo_shared::def::kind(&other);
            let shown = secrets.masker.text(&apollo_shared::text::one_line(&other.to_string(), 60));
            Err(PluginError::permanent(format!("foreach: rendered {kind}, not a list: {shown}")))
        }
    }
}

/// An item's call: its params and env.
pub type ItemCall = (Map<String, Value>, Vec<(String, String)>);

/// A fan-out item's params and env: the step's, rendered over `over` (the
/// context as a value, with the item under its name) and the secrets.
pub fn item_call(d: &apollo_shared::def::StepDef, over: &Value, secrets: &Secrets) -> Result<ItemCall, PluginError> {
    let render_over = |map: &Map<String, Value>, field: &str| -> Result<Map<String, Value>, PluginError> {
        if !apollo_shared::template::has_templates(map) {
            return Ok(map.clone());
        }
        let mut over = over.clone();
        if let (Some(values), Value::Object(o)) = (&secrets.values, &mut over) {
            o.insert("secrets".into(), Value::Object(values.clone()));
        }
        let (rendered, _) = apollo_shared::template::render(map, &over, true)
            .map_err(|e| PluginError::permanent(secrets.masker.text(&format!("{field}.{e}"))))?;
        Ok(rendered)
    };
    let params = render_over(&d.params, "params")?;
    let env = render_over(&d.env, "env")?
        .into_iter()
        .map(|(k, v)| (k, v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())))
        .collect();
    Ok((params, env))
}

/// The plugin's check of an item's rendered params.
pub async fn validate_item(reg: &Registration, params: &Map<String, Value>) -> Result<(), PluginError> {
    validate(reg, params).await
}

/// A step's `when:` rendered over `ctx`: `Ok(None)` when it holds (or the
/// step has none), `Ok(Some(reason))` when it is false (the reason the
/// step is skipped, naming the condition as rendered), `Err` when it
/// cannot be rendered or is neither true nor false.
pub fn condition(def: &TaskDef, seq: u32, ctx: &Context) -> Result<Option<String>, String> {
    let Some(when) = def.steps.get(seq as usize).and_then(|d| d.when.as_ref()) else { return Ok(None) };
    let mut map = Map::new();
    map.insert("when".into(), Value::String(when.clone()));
    let (rendered, _) = apollo_shared::template::render(&map, &ctx.to_value(), true)?;
    let value = rendered.get("when").cloned().unwrap_or(Value::Null);
    let holds = match &value {
        Value::Bool(b) => *b,
        Value::String(s) if s.trim().eq_ignore_ascii_case("true") => true,
        Value::String(s) if s.trim().eq_ignore_ascii_case("false") => false,
        other => {
            let shown = apollo_shared::text::one_line(&other.to_string(), 80);
            return Err(format!("when: {when:?} rendered {shown}, expected true or false"));
        }
    };
    Ok((!holds).then(|| format!("when: {when} was false")))
}

impl Ready {
    pub fn started(self, attempt: u32, checked: Result<(), PluginError>) -> Started {
        Started { attempt, prepared: self.rendered.and_then(|p| checked.map(|()| p)), masker: self.masker, given: None }
    }
}

pub fn registration(plugins: &Registry, def: &TaskDef, seq: u32) -> Result<Registration, PluginError> {
    let d = &def.steps[seq as usize];
    plugins.resolve(&d.plugin, d.version.as_deref()).cloned().map_err(PluginError::permanent)
}

/// Whether step `seq`'s plugin may use the work dir (one that cannot be
/// resolved is taken to: its step fails on its own).
pub fn uses_work_dir(plugins: &Registry, def: &TaskDef, seq: u32) -> bool {
    let d = &def.steps[seq as usize];
    plugins.resolve(&d.plugin, d.version.as_deref()).map_or(true, |r| r.plugin.uses_work_dir())
}

/// A step's `params` or `env` (named by `field` in errors), rendered over
/// the context; without a template nothing is rendered and the context is
/// not built.
fn render_field(
    map: &Map<String, Value>,
    ctx: &Context,
    field: &str,
    secrets: &Secrets,
) -> Result<Map<String, Value>, PluginError> {
    if !apollo_shared::template::has_templates(map) {
        return Ok(map.clone());
    }
    let mut over = ctx.to_value();
    if let (Some(values), Value::Object(o)) = (&secrets.values, &mut over) {
        o.insert("secrets".into(), Value::Object(values.clone()));
    }
    let (rendered, _) = apollo_shared::template::render(map, &over, true)
        .map_err(|e| PluginError::permanent(secrets.masker.text(&format!("{field}.{e}"))))?;
    Ok(rendered)
}

/// The params of a step, rendered over the context and its secrets.
fn render(params: &Map<String, Value>, ctx: &Context, secrets: &Secrets) -> Result<Map<String, Value>, PluginError> {
    render_field(params, ctx, "params", secrets)
}

/// A fan-out step's `approve_after_batch` params, rendered over the context
/// and its secrets (`None`: the step has no gate).
pub fn gate_params(
    def: &TaskDef,
    seq: u32,
    ctx: &Context,
    secrets: &Secrets,
) -> Option<Result<Map<String, Value>, PluginError>> {
    let g = def.steps[seq as usize].foreach.as_ref()?.gate.as_ref()?;
    Some(render_field(&g.params, ctx, "approve_after_batch", secrets))
}

/// The plugin's check of rendered params.
async fn validate(reg: &Registration, params: &Map<String, Value>) -> Result<(), PluginError> {
    crate::plugins::unwinding(&reg.name, reg.plugin.validate(params)).await.map_err(|e| PluginError {
        message: if e.permanent && !e.panicked { format!("invalid params: {}", e.message) } else { e.message },
        ..e
    })
}

/// The params of a step, rendered over the context and validated.
pub async fn prepare(
    reg: &Registration,
    params: &Map<String, Value>,
    ctx: &Context,
    secrets: &Secrets,
) -> Result<Map<String, Value>, PluginError> {
    let rendered = render(params, ctx, secrets)?;
    validate(reg, &rendered).await?;
    Ok(rendered)
}

/// The step's declared environment, rendered over the context.
pub fn step_env(
    env: &Map<String, Value>,
    ctx: &Context,
    secrets: &Secrets,
) -> Result<Vec<(String, String)>, PluginError> {
    Ok(render_field(env, ctx, "env", secrets)?
        .into_iter()
        .map(|(k, v)| (k, v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())))
        .collect())
}

/// The idempotency key of an item, its execute's and its rollback's: the
/// step's, its index and its value (as far as it is safe in a file name).
pub fn item_key(id: &str, seq: u32, idx: u32, label: &str) -> String {
    let safe: String =
        label.chars().take(64).map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    format!("{id}:{seq}:{idx}:{safe}")
}
