//! Task definitions: the YAML model, its validation, and error messages that
//! name the file, line and field.
//!
//! Parsing takes the text and a file name for messages; reading the file is
//! the agent's job. Checks that need the plugin registry (does the plugin
//! exist, does a version pin match) are the agent's too: they use the line
//! numbers recorded here on every step.

use crate::yaml;
use lines::Lines;
pub use steps::parse_duration;
use steps::parse_steps;

mod errors;
mod fanout;
mod lines;
mod locks;
mod secrets;
mod steps;
mod templates;
pub use errors::{DefError, DefErrors};
pub use fanout::{BatchGate, Fanout, Size, MAX_ITEMS};
pub use secrets::{Masker, SecretSource, MASK};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
pub use templates::step_refs;

mod policy;
pub use policy::{Catchup, OnFailure, OnInterrupt};

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

/// A step's timeout as written.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Timeout {
    /// Seconds.
    Secs(f64),
    /// `timeout: auto`: the p99 of the plugin version's recent successful
    /// runs × 1.5 (the original design's §3.2), once there are enough.
    Auto,
}

/// One step of a definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepDef {
    pub name: String,
    pub plugin: String,
    /// A semver requirement such as `^1`; `None` takes the highest registered version.
    pub version: Option<String>,
    /// `None` takes the plugin registration's timeout.
    pub timeout: Option<Timeout>,
    /// Retries after the first attempt; `None` takes the registration's.
    pub retry: Option<u32>,
    /// What its failure after its retries does; `None` takes the task's.
    #[serde(default)]
    pub on_failure: Option<OnFailure>,
    /// What its interruption does; `None` takes the task's.
    #[serde(default)]
    pub on_interrupt: Option<OnInterrupt>,
    pub params: Map<String, Value>,
    /// Environment variables for an external plugin's process (templates allowed).
    #[serde(default)]
    pub env: Map<String, Value>,
    /// `when:` a condition (a template, or `true`/`false`): false records the
    /// step SKIPPED, with the condition as rendered, and the instance goes on.
    #[serde(default)]
    pub when: Option<String>,
    /// `foreach:` and its fields: the plugin runs once per item.
    #[serde(default)]
    pub foreach: Option<Fanout>,
    /// `task:` another definition this step runs as a child instance (its
    /// params are the child's); the step's outcome is the child's.
    #[serde(default)]
    pub task: Option<String>,
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
    /// For every step that sets none.
    #[serde(default)]
    pub on_interrupt: OnInterrupt,
    pub params: BTreeMap<String, ParamSpec>,
    /// Lock names (templates over params, task and event): no two
    /// instances under way hold one at once.
    #[serde(default)]
    pub locks: Vec<String>,
    /// Named secrets (`{{ secrets.NAME }}`): where each value comes from.
    #[serde(default)]
    pub secrets: BTreeMap<String, SecretSource>,
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
    "on_interrupt",
    "params",
    "locks",
    "secrets",
    "steps",
];
pub(crate) const STEP_FIELDS: &[&str] = &[
    "name",
    "plugin",
    "version",
    "timeout",
    "retry",
    "on_failure",
    "on_interrupt",
    "env",
    "params",
    "when",
    "foreach",
    "as",
    "batches",
    "max_parallel",
    "max_failures",
    "approve_after_batch",
    "task",
];

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
        Some(v) => OnFailure::parse(v).unwrap_or_else(|| {
            at("on_failure", format!("expected rollback, stop or continue, found {}", show(v)));
            OnFailure::Rollback
        }),
    };
    let on_interrupt = match top.get("on_interrupt") {
        None | Some(Value::Null) => OnInterrupt::Rerun,
        Some(v) => OnInterrupt::parse(v).unwrap_or_else(|| {
            at("on_interrupt", format!("expected rerun or hold, found {}", show(v)));
            OnInterrupt::Rerun
        }),
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

    let secrets = secrets::parse(top.get("secrets"), &mut at);
    let mut at_lock = |field: &str, message: String| errors.push(err(locks::line(&lines, field), field, message));
    let locks = locks::parse(top.get("locks"), &params, on_event.is_some(), &mut at_lock);
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
    // Every name under `secrets:` is declared, a malformed source's too (its
    // uses are not refused besides); a malformed `secrets:` leaves them unchecked.
    let declared: Option<Vec<&str>> = match top.get("secrets") {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::Object(m)) => Some(m.keys().map(String::as_str).collect()),
        Some(_) => None,
    };
    let scope = templates::Scope { params: &params, secrets: declared.as_deref(), on_event: on_event.is_some() };
    templates::check(&steps, &scope, &lines, file, &mut errors);
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
        on_interrupt,
        params,
        locks,
        secrets,
        steps,
    })
}

pub(crate) fn opt_string(m: &Map<String, Value>, key: &str, at: &mut impl FnMut(&str, String)) -> Option<String> {
    match m.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => {
            at(key, format!("expected a string, found {}", show(v)));
            None
        }
    }
}

pub(crate) fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
}

pub(crate) fn unknown_field(key: &str, known: &[&str]) -> String {
    match crate::text::closest(key, known) {
        Some(k) => format!("unknown field {key:?} (did you mean {k:?}? expected one of: {})", known.join(", ")),
        None => format!("unknown field {key:?} (expected one of: {})", known.join(", ")),
    }
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

pub(crate) fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => kind(other).to_string(),
    }
}

#[cfg(test)]
mod tests;
