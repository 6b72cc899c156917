//! `task`: the plugin of a step written `task: NAME` (a sub-runbook). The
//! executor runs such a step itself — it creates the child instance, parks
//! the parent until the child ends, and takes the child's outcome as the
//! step's (`scheduler::executor::child`) — so this plugin is never called;
//! its params are the child's, checked against the child's definition.

use super::contract::{Call, Plugin, PluginError};
use futures::future::BoxFuture;
use serde_json::{Map, Value};

pub struct Task;

impl Plugin for Task {
    fn uses_work_dir(&self) -> bool {
        false
    }
    fn name(&self) -> &str {
        "task"
    }
    fn version(&self) -> semver::Version {
        semver::Version::new(1, 0, 0)
    }
    fn description(&self) -> &str {
        "Runs another task as a child instance and waits for it (a step written `task: NAME`)"
    }
    fn outputs(&self) -> Option<Vec<String>> {
        Some(["instance", "task", "state", "steps"].map(String::from).to_vec())
    }
    /// No `params` list: the step's params are the child definition's, which
    /// the catalog checks against it.
    fn describe(&self) -> Value {
        serde_json::json!({
            "name": self.name(),
            "version": self.version().to_string(),
            "description": self.description(),
            "idempotent": false,
            "outputs": self.outputs(),
        })
    }
    fn check_params(&self, _p: &Map<String, Value>) -> Result<(), String> {
        Ok(())
    }
    fn execute<'a>(&'a self, _call: Call<'a>) -> BoxFuture<'a, Result<Value, PluginError>> {
        Box::pin(async {
            Err(PluginError::permanent("a `task:` step is run by the scheduler, not called as a plugin"))
        })
    }
    fn cannot_undo(&self, _p: &Map<String, Value>) -> Option<String> {
        None
    }
    fn rollback<'a>(&'a self, _call: Call<'a>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), PluginError>> {
        Box::pin(async { Ok(()) })
    }
}
