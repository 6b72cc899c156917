//! Task definitions: the YAML model, its validation, and error messages that
//! name the file, line and field.
//!
//! Parsing takes the text and a file name for messages; reading the file is
//! the agent's job. Checks that need the plugin registry (does the plugin
//! exist, does a version pin match) are the agent's too: they use the line
//! numbers recorded here on every step.

use crate::template;
use crate::yaml;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt;

/// One problem in a definition or config file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefError {
    pub file: String,
    pub line: Option<usize>,
    /// Dotted path of the field, e.g. `steps[1].timeout`; empty for the whole document.
    pub field: String,
    pub message: String,
}

impl fmt::Display for DefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ": line {line}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Every problem found in one file (never empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DefErrors(pub Vec<DefError>);

impl fmt::Display for DefErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.0.iter().map(|e| e.to_string()).collect();
        f.write_str(&lines.join("\n"))
    }
}

/// What happens when a step has used up its retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// Roll back the failed step, then every succeeded step in reverse order.
    #[default]
    Rollback,
    /// Leave the instance FAILED for an operator to retry or roll back.
    Stop,
}

/// What a schedule does about fires missed while the agent was down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Catchup {
    /// Never run missed fires.
    Skip,
    /// Run the most recent missed fire once.
    #[default]
    Latest,
    /// Run every missed fire, up to the agent's `scheduler.catchup_max`.
    All,
}

/// A parameter the task declares, with its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ParamSpec {
    #[serde(default)]
    pub default: Option<Value>,
    #[serde(default)]
    pub required: bool,
    #[serde(default)]
    pub description: Option<String>,
}

/// One step of a definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepDef {
    pub name: String,
    pub plugin: String,
    /// A semver requirement such as `^1`; `None` takes the highest registered version.
    pub version: Option<String>,
    /// Seconds; `None` takes the plugin registration's timeout.
    pub timeout: Option<f64>,
    /// Retries after the first attempt; `None` takes the registration's.
    pub retry: Option<u32>,
    pub params: Map<String, Value>,
    /// Environment variables for an external plugin's process (templates allowed).
    #[serde(default)]
    pub env: Map<String, Value>,
    /// Line of the step in its file, for messages about it.
    pub line: Option<usize>,
}

/// A validated task definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskDef {
    pub task: String,
    pub description: Option<String>,
    /// 0..=100, higher runs first.
    pub priority: u8,
    pub queue: String,
    pub schedule: Option<String>,
    pub timezone: Option<String>,
    pub catchup: Catchup,
    pub on_event: Option<String>,
    /// Equalities on the event's payload (dotted paths) that must all hold.
    pub filter: Map<String, Value>,
    pub max_active: Option<u32>,
    pub on_failure: OnFailure,
    pub params: BTreeMap<String, ParamSpec>,
    pub steps: Vec<StepDef>,
}

pub const PRIORITY_HIGH: u8 = 75;
pub const PRIORITY_NORMAL: u8 = 50;
pub const PRIORITY_LOW: u8 = 25;

/// The fields a definition may have, in the order messages list them.
const TOP_FIELDS: &[&str] = &[
    "task",
    "description",
    "priority",
    "queue",
    "schedule",
    "timezone",
    "catchup",
    "on_event",
    "filter",
    "max_active",
    "on_failure",
    "params",
    "steps",
];
const STEP_FIELDS: &[&str] = &["name", "plugin", "version", "timeout", "retry", "env", "params"];

/// Parses and validates a definition. `file` is only used in messages.
pub fn parse(src: &str, file: &str) -> Result<TaskDef, DefErrors> {
    let err = |line, field: &str, message: String| DefError { file: file.into(), line, field: field.into(), message };
    let doc: Value = yaml::from_str(src).map_err(|e| DefErrors(vec![err(e.line, "", e.message)]))?;
    let Value::Object(top) = doc else {
        return Err(DefErrors(vec![err(
            Some(1),
            "",
            format!("expected a mapping with `task:` and `steps:`, found {}", kind(&doc)),
        )]));
    };
    let lines = Lines::new(src);
    let mut errors = Vec::new();
    for key in top.keys() {
        if !TOP_FIELDS.contains(&key.as_str()) {
            errors.push(err(lines.key(key, 0, usize::MAX), key, unknown_field(key, TOP_FIELDS)));
        }
    }
    let mut at = |field: &str, message: String| errors.push(err(lines.key(field, 0, usize::MAX), field, message));

    let task = match top.get("task") {
        Some(Value::String(s)) if valid_name(s) => s.clone(),
        Some(Value::String(s)) => {
            at(
                "task",
                format!("{s:?} is not a valid name (use letters, digits, '_', '-' and '.', up to 64 characters)"),
            );
            String::new()
        }
        Some(v) => {
            at("task", format!("expected a string, found {}", kind(v)));
            String::new()
        }
        None => {
            errors.push(err(Some(1), "task", "missing field (the task's name, e.g. `task: daily_report`)".into()));
            String::new()
        }
    };
    let mut at = |field: &str, message: String| errors.push(err(lines.key(field, 0, usize::MAX), field, message));
    let description = opt_string(&top, "description", &mut at);
    let priority = match top.get("priority") {
        None | Some(Value::Null) => PRIORITY_NORMAL,
        Some(Value::String(s)) => match s.as_str() {
            "high" => PRIORITY_HIGH,
            "normal" => PRIORITY_NORMAL,
            "low" => PRIORITY_LOW,
            _ => {
                at(
                    "priority",
                    format!("unknown priority {s:?} (expected high, normal, low, or a number from 0 to 100)"),
                );
                PRIORITY_NORMAL
            }
        },
        Some(Value::Number(n)) => match n.as_u64() {
            Some(p) if p <= 100 => p as u8,
            _ => {
                at("priority", format!("{n} is out of range (expected high, normal, low, or a number from 0 to 100)"));
                PRIORITY_NORMAL
            }
        },
        Some(v) => {
            at("priority", format!("expected high, normal, low, or a number from 0 to 100, found {}", kind(v)));
            PRIORITY_NORMAL
        }
    };
    let queue = opt_string(&top, "queue", &mut at).unwrap_or_else(|| "default".into());
    if !valid_name(&queue) {
        at("queue", format!("{queue:?} is not a valid queue name (letters, digits, '_', '-', '.')"));
    }
    let schedule = opt_string(&top, "schedule", &mut at);
    if let Some(expr) = &schedule {
        if let Err(e) = crate::cron::parse(expr) {
            at("schedule", e);
        }
    }
    let timezone = opt_string(&top, "timezone", &mut at);
    if let Some(tz) = &timezone {
        if tz.parse::<chrono_tz::Tz>().is_err() {
            at("timezone", format!("unknown time zone {tz:?} (expected an IANA name such as Europe/Berlin or UTC)"));
        }
    }
    let catchup = match top.get("catchup") {
        None | Some(Value::Null) => Catchup::Latest,
        Some(Value::String(c)) if c == "skip" => Catchup::Skip,
        Some(Value::String(c)) if c == "latest" => Catchup::Latest,
        Some(Value::String(c)) if c == "all" => Catchup::All,
        Some(v) => {
            at("catchup", format!("expected skip, latest or all, found {}", show(v)));
            Catchup::Latest
        }
    };
    if top.contains_key("catchup") && schedule.is_none() {
        at("catchup", "only applies with a schedule (add schedule: or remove catchup:)".into());
    }
    let on_event = opt_string(&top, "on_event", &mut at);
    let filter = match top.get("filter") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(f)) => {
            if let Some((k, _)) = f.iter().find(|(_, v)| matches!(v, Value::Array(_) | Value::Object(_))) {
                at("filter", format!("filter.{k}: expected a plain value to compare the payload field with"));
            }
            f.clone()
        }
        Some(v) => {
            at("filter", format!("expected a mapping of payload fields to values, found {}", kind(v)));
            Map::new()
        }
    };
    if !filter.is_empty() && on_event.is_none() {
        at("filter", "only applies with on_event (add on_event: or remove filter:)".into());
    }
    let max_active = match top.get("max_active") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) if n.as_u64().is_some_and(|v| (1..=100_000).contains(&v)) => {
            n.as_u64().map(|v| v as u32)
        }
        Some(v) => {
            at("max_active", format!("expected a whole number from 1 to 100000, found {}", show(v)));
            None
        }
    };
    let on_failure = match top.get("on_failure") {
        None | Some(Value::Null) => OnFailure::Rollback,
        Some(Value::String(s)) if s == "rollback" => OnFailure::Rollback,
        Some(Value::String(s)) if s == "stop" => OnFailure::Stop,
        Some(v) => {
            at("on_failure", format!("expected rollback or stop, found {}", show(v)));
            OnFailure::Rollback
        }
    };
    let params = match top.get("params") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                let spec = match v {
                    Value::Object(o)
                        if o.keys().all(|k| ["default", "required", "description"].contains(&k.as_str())) =>
                    {
                        serde_json::from_value(v.clone()).unwrap_or_else(|e| {
                            at(
                                &format!("params.{k}"),
                                format!("{e} (expected default, required: true|false, description)"),
                            );
                            ParamSpec::default()
                        })
                    }
                    other => ParamSpec { default: Some(other.clone()), ..Default::default() },
                };
                (k.clone(), spec)
            })
            .collect(),
        Some(v) => {
            at("params", format!("expected a mapping of parameter names to defaults, found {}", kind(v)));
            BTreeMap::new()
        }
    };

    let steps = match top.get("steps") {
        Some(Value::Array(items)) if !items.is_empty() => parse_steps(items, &lines, file, &mut errors),
        Some(Value::Array(_)) => {
            errors.push(err(
                lines.key("steps", 0, usize::MAX),
                "steps",
                "is empty (a task needs at least one step)".into(),
            ));
            Vec::new()
        }
        Some(v) => {
            errors.push(err(
                lines.key("steps", 0, usize::MAX),
                "steps",
                format!("expected a list of steps, found {}", kind(v)),
            ));
            Vec::new()
        }
        None => {
            errors.push(err(
                Some(1),
                "steps",
                "missing field (a list of steps, each with `plugin:` and `params:`)".into(),
            ));
            Vec::new()
        }
    };
    if !errors.is_empty() {
        return Err(DefErrors(errors));
    }
    Ok(TaskDef {
        task,
        description,
        priority,
        queue,
        schedule,
        timezone,
        catchup,
        on_event,
        filter,
        max_active,
        on_failure,
        params,
        steps,
    })
}

fn parse_steps(items: &[Value], lines: &Lines, file: &str, errors: &mut Vec<DefError>) -> Vec<StepDef> {
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
        let plugin = match m.get("plugin") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            Some(v) => {
                at("plugin", format!("expected a plugin name, found {}", show(v)));
                continue;
            }
            None => {
                at("", "missing field `plugin` (e.g. plugin: shell)".into());
                continue;
            }
        };
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
            Some(v) => match parse_duration(v) {
                Ok(secs) if secs <= 7.0 * 86400.0 => Some(secs),
                Ok(secs) => {
                    at("timeout", format!("{secs} seconds is out of range (at most a week)"));
                    None
                }
                Err(e) => {
                    at("timeout", e);
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
        for (path, text) in template::strings(&Value::Object(params.clone()), "params") {
            if let Err(e) = template::compile_check(text) {
                at(&path, format!("bad template: {e}"));
            }
        }
        steps.push(StepDef { name, plugin, version, timeout, retry, params, env, line: start });
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

fn opt_string(m: &Map<String, Value>, key: &str, at: &mut impl FnMut(&str, String)) -> Option<String> {
    match m.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => {
            at(key, format!("expected a string, found {}", show(v)));
            None
        }
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
}

fn unknown_field(key: &str, known: &[&str]) -> String {
    format!("unknown field {key:?} (expected one of: {})", known.join(", "))
}

/// Names the kind of a JSON value for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => kind(other).to_string(),
    }
}

/// Finds the lines of keys in the source, for messages about semantic errors
/// that serde_yaml cannot place.
struct Lines<'a> {
    lines: Vec<&'a str>,
}

impl<'a> Lines<'a> {
    fn new(src: &'a str) -> Self {
        Lines { lines: src.lines().collect() }
    }

    /// 1-based line of the first `key:` between lines `from` (0-based) and `to`.
    fn key(&self, key: &str, from: usize, to: usize) -> Option<usize> {
        let key = key.rsplit('.').next().unwrap_or(key);
        if key.is_empty() {
            return None;
        }
        let end = to.min(self.lines.len());
        (from.min(end)..end)
            .find(|&i| {
                let t = self.lines[i].trim_start().trim_start_matches("- ").trim_start();
                t.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with(':'))
                    || t.strip_prefix(&format!("\"{key}\"")).is_some_and(|r| r.trim_start().starts_with(':'))
            })
            .map(|i| i + 1)
    }

    /// 1-based lines where the items of the top-level list `key` start.
    fn list_items(&self, key: &str) -> Vec<usize> {
        let Some(at) = self.key(key, 0, usize::MAX) else { return Vec::new() };
        let mut out = Vec::new();
        let mut indent = None;
        for (i, line) in self.lines.iter().enumerate().skip(at) {
            let t = line.trim_start();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            let ind = line.len() - t.len();
            if ind == 0 && !t.starts_with('-') {
                break;
            }
            if t.starts_with("- ") || t == "-" {
                match indent {
                    None => {
                        indent = Some(ind);
                        out.push(i + 1);
                    }
                    Some(x) if x == ind => out.push(i + 1),
                    _ => {}
                }
            }
        }
        out
    }
}

#[cfg(test)]
#[path = "def_tests.rs"]
mod tests;
