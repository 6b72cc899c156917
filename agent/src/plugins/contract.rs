//! The plugin contract: the four calls every step goes through, what a
//! call receives, what a failure says, and a panic turned into a failure.

use crate::logs::StepLog;
use futures::future::BoxFuture;
use serde_json::{json, Map, Value};
use std::path::Path;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A failed call. `permanent` errors are not retried.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginError {
    pub message: String,
    pub permanent: bool,
    /// The call panicked: a bug in the plugin (or a library it uses), not a
    /// transient fault. Permanent, and raised as a `plugin_panicked` alert.
    pub panicked: bool,
}

impl PluginError {
    pub fn retryable(message: impl Into<String>) -> Self {
        PluginError { message: message.into(), permanent: false, panicked: false }
    }
    pub fn permanent(message: impl Into<String>) -> Self {
        PluginError { message: message.into(), permanent: true, panicked: false }
    }
    /// `plugin NAME panicked: MESSAGE`, from a panic's payload.
    pub fn panicked(plugin: &str, payload: &(dyn std::any::Any + Send)) -> Self {
        let message = format!("plugin {plugin} panicked: {}", panic_message(payload));
        PluginError { message, permanent: true, panicked: true }
    }
}

/// What a panic said (its payload is a `&str` or a `String` when it was
/// made by `panic!` or an `unwrap`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Runs one call of plugin `name`, turning a panic anywhere inside it (the
/// plugin's code, or a library's) into a failed call that says so: the
/// step fails and its instance follows its failure policy, instead of the
/// executor dying with the instance left RUNNING.
pub async fn unwinding<T>(
    name: &str,
    call: impl std::future::Future<Output = Result<T, PluginError>>,
) -> Result<T, PluginError> {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(call).catch_unwind().await {
        Ok(r) => r,
        Err(payload) => Err(PluginError::panicked(name, payload.as_ref())),
    }
}

impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The instance's context as a call receives it: made into JSON only when
/// the plugin reads it (most in-process plugins never do; making it on
/// every step was 6,000 instructions a step in the instruction guard).
pub struct CallContext<'a> {
    of: Of<'a>,
    made: std::sync::OnceLock<Value>,
}

enum Of<'a> {
    Context(&'a apollo_shared::context::Context),
    Value(&'a Value),
}

impl<'a> CallContext<'a> {
    /// The context of a running instance, made when first read.
    pub fn of(ctx: &'a apollo_shared::context::Context) -> Self {
        CallContext { of: Of::Context(ctx), made: std::sync::OnceLock::new() }
    }

    /// A context already made (an item's, a rollback's, a plugin test's).
    pub fn made(value: &'a Value) -> Self {
        CallContext { of: Of::Value(value), made: std::sync::OnceLock::new() }
    }
}

impl std::ops::Deref for CallContext<'_> {
    type Target = Value;
    fn deref(&self) -> &Value {
        match self.of {
            Of::Value(v) => v,
            Of::Context(c) => self.made.get_or_init(|| c.to_value()),
        }
    }
}

/// What one execute or rollback receives.
pub struct Call<'a> {
    pub params: &'a Map<String, Value>,
    pub context: &'a CallContext<'a>,
    /// `<instance id>:<step seq>`: the same for every attempt of the step.
    pub idempotency_key: &'a str,
    pub work_dir: &'a Path,
    /// The definitions directory, for templates and data files the tasks ship.
    pub tasks_dir: &'a Path,
    /// The output of the step before this one, if any.
    pub previous: Option<&'a Value>,
    pub step: &'a str,
    pub attempt: u32,
    /// Variables the step declares (`env:`), for external plugins.
    pub env: &'a [(String, String)],
    pub log: &'a StepLog,
    /// Fired when the step times out or is cancelled; a plugin with a
    /// subprocess stops it (SIGTERM to the group, SIGKILL after `kill_grace`).
    pub cancel: CancellationToken,
    pub kill_grace: Duration,
}

/// A plugin parameter, for describe() and the console's run form.
pub struct ParamDoc {
    pub name: &'static str,
    pub kind: &'static str,
    pub required: bool,
    pub description: &'static str,
}

/// The four calls of the plugin contract.
pub trait Plugin: Send + Sync {
    fn name(&self) -> &str;
    fn version(&self) -> semver::Version;
    fn description(&self) -> &str;
    fn params(&self) -> Vec<ParamDoc> {
        Vec::new()
    }
    fn idempotent(&self) -> bool {
        true
    }
    /// The fields of its output, when the plugin says (the built-ins do; an
    /// external plugin may, as `outputs` in its describe): a template that
    /// reads `steps.X.F` is refused at load when F is not among them.
    fn outputs(&self) -> Option<Vec<String>> {
        None
    }
    /// Whether a step of this plugin may use the instance's work dir (its
    /// files, or as the current directory): the executor creates the dir
    /// before the first such step. Every plugin is taken to, unless it says
    /// otherwise.
    fn uses_work_dir(&self) -> bool {
        true
    }
    /// What a rollback of a step with these params undoes: `None` when it
    /// undoes its effects (or it had none to undo), else what it lacks
    /// (`rollback_command`). An operator's rollback of a SUCCESS instance
    /// is refused while a step's plugin says it cannot undo it.
    fn cannot_undo(&self, _params: &Map<String, Value>) -> Option<String> {
        None
    }
    /// The synchronous parameter check of a built-in.
    fn check_params(&self, _params: &Map<String, Value>) -> Result<(), String> {
        Ok(())
    }
    /// Checks parameters before anything runs; the message names the field.
    /// A refusal is permanent; a check that could not be made (a plugin that
    /// timed out or asked to be retried) is retryable, like an execute.
    fn validate<'a>(&'a self, params: &'a Map<String, Value>) -> BoxFuture<'a, Result<(), PluginError>> {
        Box::pin(std::future::ready(self.check_params(params).map_err(PluginError::permanent)))
    }
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, PluginError>>;
    fn rollback<'a>(&'a self, call: Call<'a>, output: Option<&'a Value>) -> BoxFuture<'a, Result<(), PluginError>>;

    /// The worker pool of a worker-mode external plugin.
    fn pool(&self) -> Option<apollo_shared::protocol::PoolStats> {
        None
    }

    fn describe(&self) -> Value {
        let params: Vec<Value> = self
            .params()
            .iter()
            .map(|p| json!({"name": p.name, "type": p.kind, "required": p.required, "description": p.description}))
            .collect();
        json!({
            "name": self.name(),
            "version": self.version().to_string(),
            "description": self.description(),
            "idempotent": self.idempotent(),
            "params": params,
            "outputs": self.outputs(),
        })
    }
}
