//! `sleep`: waits `seconds` (0 and fractions allowed). Useful as a no-op step
//! and in tests of timeouts and concurrency.

use super::contract::{Call, ParamDoc, Plugin, PluginError};
use super::params::check_known;
use futures::future::BoxFuture;
use serde_json::{json, Map, Value};
use std::time::Duration;

pub struct Sleep;

fn seconds(p: &Map<String, Value>) -> Result<f64, String> {
    match p.get("seconds") {
        None | Some(Value::Null) => Ok(0.0),
        Some(v) => v
            .as_f64()
            .filter(|s| (0.0..=86400.0).contains(s))
            .ok_or_else(|| format!("seconds: expected a number from 0 to 86400, found {v}")),
    }
}

impl Plugin for Sleep {
    fn uses_work_dir(&self) -> bool {
        false
    }
    fn name(&self) -> &str {
        "sleep"
    }
    fn version(&self) -> semver::Version {
        semver::Version::new(1, 0, 0)
    }
    fn description(&self) -> &str {
        "Waits the given number of seconds"
    }
    fn outputs(&self) -> Option<Vec<String>> {
        Some(["slept"].map(String::from).to_vec())
    }
    fn params(&self) -> Vec<ParamDoc> {
        vec![ParamDoc { name: "seconds", kind: "number", required: false, description: "how long (default 0)" }]
    }
    fn check_params(&self, p: &Map<String, Value>) -> Result<(), String> {
        check_known(p, &["seconds"])?;
        seconds(p).map(|_| ())
    }
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, PluginError>> {
        Box::pin(async move {
            let secs = seconds(call.params).map_err(PluginError::permanent)?;
            if secs > 0.0 {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs_f64(secs)) => {}
                    _ = call.cancel.cancelled() => return Err(PluginError::retryable("sleep interrupted")),
                }
            }
            Ok(json!({ "slept": secs }))
        })
    }
    fn rollback<'a>(&'a self, _call: Call<'a>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), PluginError>> {
        Box::pin(async { Ok(()) })
    }
}
