//! The `steps:` list of a definition, and durations.

use super::lines::Lines;
use super::{
    kind, opt_string, show, unknown_field, valid_name, DefError, OnFailure, OnInterrupt, StepDef, Timeout, STEP_FIELDS,
};
use crate::template;
use serde_json::{Map, Value};

pub(super) fn parse_steps(items: &[Value], lines: &Lines, file: &str, errors: &mut Vec<DefError>) -> Vec<StepDef> {
    let starts = lines.list_items("steps");
    let mut steps: Vec<StepDef> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let start = starts.get(i).copied().or_else(|| lines.key("steps", 0, usize::MAX));
        let end = starts.get(i + 1).copied().unwrap_or(usize::MAX);
        let mut at = |field: &str, message: String| {
            let line = lines.key(field, start.unwrap_or(1).saturating_sub(1), end).or(start);
            let field = if field.is_empty() { format!("steps[{i}]") } else { format!("steps[{i}].{field}") };
            errors.push(DefError { file: file.into(), line, field, message });
        };
        let Value::Object(m) = item else {
            at("", format!("expected a mapping with `plugin:` and `params:`, found {}", kind(item)));
            continue;
        };
        for key in m.keys() {
            if !STEP_FIELDS.contains(&key.as_str()) {
                at(key, unknown_field(key, STEP_FIELDS));
            }
        }
        // `task: NAME` runs another definition as a child instance (a
        // sub-runbook); its step has the built-in plugin `task`.
        let task = match m.get("task") {
            None | Some(Value::Null) => None,
            Some(Value::String(t)) if valid_name(t) => Some(t.clone()),
            Some(v) => {
                at("task", format!("expected the name of the task to run as a child instance, found {}", show(v)));
                continue;
            }
        };
        let plugin = match (m.get("plugin"), &task) {
            (Some(_), Some(_)) => {
                at("task", "a step runs a plugin or a task, not both: drop `plugin:` or `task:`".into());
                continue;
            }
            (None, Some(_)) => "task".to_string(),
            (Some(Value::String(s)), None) if !s.trim().is_empty() => s.clone(),
            (Some(v), None) => {
                at("plugin", format!("expected a plugin name, found {}", show(v)));
                continue;
            }
            (None, None) => {
                at("", "missing field `plugin` (e.g. plugin: shell), or `task:` to run another task".into());
                continue;
            }
        };
        if task.is_some() && m.contains_key("foreach") {
            at("foreach", "a fan-out over sub-runbooks is not supported yet: foreach: goes with plugin:".into());
        }
        let mut name = match opt_string(m, "name", &mut at) {
            Some(n) => {
                if !valid_name(&n) {
                    at("name", format!("{n:?} is not a valid step name (letters, digits, '_', '-', '.')"));
                }
                if steps.iter().any(|s| s.name == n) {
                    at("name", format!("duplicate step name {n:?} (step names must be unique)"));
                }
                n
            }
            None => plugin.clone(),
        };
        if !m.contains_key("name") {
            // An unnamed step is named after its plugin, numbered when the plugin repeats.
            let mut n = 2;
            while steps.iter().any(|s| s.name == name) {
                name = format!("{plugin}_{n}");
                n += 1;
            }
        }
        let version = opt_string(m, "version", &mut at);
        if let Some(v) = &version {
            if let Err(e) = semver::VersionReq::parse(v) {
                at("version", format!("{v:?} is not a semver requirement ({e}); e.g. \"^1\" or \">=1.2, <2\""));
            }
        }
        let timeout = match m.get("timeout") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s == "auto" => Some(Timeout::Auto),
            Some(v) => match parse_duration(v) {
                Ok(secs) if secs <= 7.0 * 86400.0 => Some(Timeout::Secs(secs)),
                Ok(secs) => {
                    at("timeout", format!("{secs} seconds is out of range (at most a week)"));
                    None
                }
                Err(e) => {
                    at("timeout", e.replacen("expected ", "expected auto, ", 1));
                    None
                }
            },
        };
        let retry = match m.get("retry") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) if n.as_u64().is_some_and(|r| r <= 100) => n.as_u64().map(|r| r as u32),
            Some(v) => {
                at("retry", format!("expected a whole number of retries from 0 to 100, found {}", show(v)));
                None
            }
        };
        let on_failure = match m.get("on_failure") {
            None | Some(Value::Null) => None,
            Some(v) => OnFailure::parse(v).or_else(|| {
                at("on_failure", format!("expected rollback, stop or continue, found {}", show(v)));
                None
            }),
        };
        let on_interrupt = match m.get("on_interrupt") {
            None | Some(Value::Null) => None,
            Some(v) => OnInterrupt::parse(v).or_else(|| {
                at("on_interrupt", format!("expected rerun or hold, found {}", show(v)));
                None
            }),
        };
        let params = match m.get("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(p)) => p.clone(),
            Some(v) => {
                at("params", format!("expected a mapping of parameters, found {}", kind(v)));
                Map::new()
            }
        };
        let env = match m.get("env") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(e))
                if e.values().all(|v| matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_))) =>
            {
                e.clone()
            }
            Some(v) => {
                at("env", format!("expected a mapping of variable names to text, found {}", kind(v)));
                Map::new()
            }
        };
        let when = match m.get("when") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(b.to_string()),
            Some(Value::String(s)) if !s.trim().is_empty() => {
                if let Err(e) = template::compile_check(s) {
                    at("when", format!("bad template: {e}"));
                }
                Some(s.clone())
            }
            Some(v) => {
                at(
                    "when",
                    format!(
                        "expected a condition: a template such as \"{{{{ steps.check.exit_code == 0 }}}}\", or true \
                         or false; found {}",
                        show(v)
                    ),
                );
                None
            }
        };
        let foreach = super::fanout::parse(m, &mut at);
        if foreach.is_some() && timeout == Some(Timeout::Auto) {
            at(
                "timeout",
                "timeout: auto is not learned for a fan-out step yet; give each item's timeout (e.g. 5m)".into(),
            );
        }
        for (path, text) in template::strings(&Value::Object(params.clone()), "params") {
            if let Err(e) = template::compile_check(text) {
                at(&path, format!("bad template: {e}"));
            }
        }
        steps.push(StepDef {
            name,
            plugin,
            version,
            timeout,
            retry,
            on_failure,
            on_interrupt,
            params,
            env,
            when,
            foreach,
            task,
            line: start,
        });
    }
    steps
}

/// Reads a duration: a number of seconds, or a string like `90s`, `5m`, `1h`, `2d`, `250ms`.
pub fn parse_duration(v: &Value) -> Result<f64, String> {
    let bad = || {
        format!("expected seconds (a positive number) or a duration like \"30s\", \"5m\", \"1h\", found {}", show(v))
    };
    let secs = match v {
        Value::Number(n) => n.as_f64().ok_or_else(bad)?,
        Value::String(s) => {
            let s = s.trim();
            let (num, unit) = s.split_at(s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len()));
            let n: f64 = num.parse().map_err(|_| bad())?;
            match unit.trim() {
                "" | "s" => n,
                "ms" => n / 1000.0,
                "m" => n * 60.0,
                "h" => n * 3600.0,
                "d" => n * 86400.0,
                _ => return Err(bad()),
            }
        }
        _ => return Err(bad()),
    };
    if !(secs > 0.0 && secs.is_finite()) {
        return Err(format!("{secs} seconds is out of range (expected more than 0)"));
    }
    Ok(secs)
}
