//! A definition's `locks:`: names (templates over the instance's params,
//! task and event, rendered when it is created) that no two instances under
//! way hold at once, across tasks and agents.

use super::lines::Lines;
use super::{kind, show, ParamSpec};
use crate::template;
use serde_json::Value;
use std::collections::BTreeMap;

/// The names a lock may use: what is known when the instance is created.
const KNOWN: &[&str] = &["params", "task", "event", "task_id", "trace_id"];

/// The line a problem of `field` (`locks[N]`) is said on: its item of the
/// list, else the line of `locks:` (a list written on one line).
pub(super) fn line(lines: &Lines, field: &str) -> Option<usize> {
    let item = field.strip_prefix("locks[").and_then(|r| r.strip_suffix(']')).and_then(|i| i.parse::<usize>().ok());
    item.and_then(|i| lines.list_items("locks").get(i).copied()).or_else(|| lines.key("locks", 0, usize::MAX))
}

/// `locks:` as written, checked; problems go to `at(field, message)`.
pub(super) fn parse(
    v: Option<&Value>,
    params: &BTreeMap<String, ParamSpec>,
    on_event: bool,
    at: &mut impl FnMut(&str, String),
) -> Vec<String> {
    let items = match v {
        None | Some(Value::Null) => return Vec::new(),
        Some(Value::Array(items)) => items,
        Some(v) => {
            at(
                "locks",
                format!("expected a list of lock names (e.g. [\"db:{{{{ params.cluster }}}}\"]), found {}", kind(v)),
            );
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let field = format!("locks[{i}]");
        let Value::String(s) = item else {
            at(&field, format!("expected a lock name, found {}", show(item)));
            continue;
        };
        if s.trim().is_empty() {
            at(&field, "is empty (a lock needs a name)".into());
            continue;
        }
        if s.contains("{{") || s.contains("{%") {
            if let Err(e) = template::compile_check(s) {
                at(&field, e);
                continue;
            }
            let Ok(r) = template::refs(s) else { continue };
            for m in template::unknown_callables(&r) {
                at(&field, m);
            }
            for var in &r.vars {
                let parts: Vec<&str> = var.split('.').collect();
                let head = parts[0];
                let bad = match head {
                    "params" => parts.get(1).filter(|p| !params.is_empty() && !params.contains_key(**p)).map(|p| {
                        let declared: Vec<&str> = params.keys().map(String::as_str).collect();
                        format!(
                            "params.{p}: the definition declares no param {p:?} (declared: {})",
                            declared.join(", ")
                        )
                    }),
                    "event" if !on_event => Some("event: this definition has no on_event:".to_string()),
                    h if KNOWN.contains(&h) => None,
                    h => Some(format!(
                        "{h}: a lock is rendered when the instance is created, before any step runs: it may use {}",
                        KNOWN.join(", ")
                    )),
                };
                if let Some(m) = bad {
                    at(&field, m);
                }
            }
        }
        out.push(s.clone());
    }
    out
}
