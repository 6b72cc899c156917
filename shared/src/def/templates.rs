//! A definition's templates, checked when it is loaded: every name each
//! step's params and env use must resolve when the step runs. `steps.X` is
//! an earlier step; `params.P` a declared param (when the definition
//! declares any); `event` only where the definition starts on an event;
//! the other names the fixed ones; filters, tests and functions ones that
//! exist. (Whether `steps.X.F` is an output the plugin says it gives needs
//! the registry: the agent checks that with [`step_refs`].)

use super::lines::Lines;
use super::{DefError, StepDef};
use crate::template::{self, FIXED_NAMES};
use crate::text::closest;
use serde_json::Value;
use std::collections::BTreeMap;

/// What the checks need of the definition besides its steps.
pub(super) struct Scope<'a> {
    pub params: &'a BTreeMap<String, super::ParamSpec>,
    /// The secrets declared; `None` when `secrets:` is malformed (said once
    /// there: their uses are not checked).
    pub secrets: Option<&'a [&'a str]>,
    pub on_event: bool,
}

/// Every template string of a step, with its field (`params.command`).
fn templates(step: &StepDef) -> Vec<(String, String)> {
    let (params, env) = (Value::Object(step.params.clone()), Value::Object(step.env.clone()));
    let gate = step.foreach.as_ref().and_then(|f| f.gate.as_ref()).map(|g| Value::Object(g.params.clone()));
    let mut out = template::strings(&params, "params");
    out.extend(template::strings(&env, "env"));
    if let Some(w) = &step.when {
        out.push(("when".to_string(), w.as_str()));
    }
    if let Some(f) = &step.foreach {
        out.extend(template::strings(&f.foreach, "foreach"));
    }
    if let Some(g) = &gate {
        out.extend(template::strings(g, "approve_after_batch"));
    }
    out.into_iter().filter(|(_, t)| t.contains("{{") || t.contains("{%")).map(|(f, t)| (f, t.to_string())).collect()
}

/// Each step's reads of earlier steps' outputs: (step index, field, the
/// step read, the output read), for the agent's check of plugin outputs.
pub fn step_refs(steps: &[StepDef]) -> Vec<(usize, String, String, String)> {
    let mut out = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        for (field, text) in templates(s) {
            let Ok(r) = template::refs(&text) else { continue };
            for v in r.vars {
                let parts: Vec<&str> = v.split('.').collect();
                if let ["steps", step, output, ..] = parts[..] {
                    out.push((i, field.clone(), step.to_string(), output.to_string()));
                }
            }
        }
    }
    out
}

pub(super) fn check(steps: &[StepDef], scope: &Scope, lines: &Lines, file: &str, errors: &mut Vec<DefError>) {
    for (i, s) in steps.iter().enumerate() {
        let start = s.line.unwrap_or(1).saturating_sub(1);
        let end = steps.get(i + 1).and_then(|n| n.line).unwrap_or(usize::MAX);
        for (field, text) in templates(s) {
            // A template that does not parse is reported by the step's parse.
            let Ok(r) = template::refs(&text) else { continue };
            let mut at = |message: String| {
                errors.push(DefError {
                    file: file.into(),
                    line: lines.key(&field, start, end).or(s.line),
                    field: format!("steps[{i}].{field}"),
                    message,
                })
            };
            for m in template::unknown_callables(&r) {
                at(m);
            }
            // A fan-out step's params and env read its item by name.
            let item = s.foreach.as_ref().filter(|_| field.starts_with("params") || field.starts_with("env"));
            for v in &r.vars {
                if item.is_some_and(|f| v.split('.').next() == Some(f.name.as_str())) {
                    continue;
                }
                if let Err(m) = resolve(v, i, steps, scope) {
                    at(m);
                }
            }
        }
    }
}

/// Why a name read by step `i` cannot resolve when it runs, if it cannot.
fn resolve(var: &str, i: usize, steps: &[StepDef], scope: &Scope) -> Result<(), String> {
    let parts: Vec<&str> = var.split('.').collect();
    let head = parts[0];
    let mean =
        |name: &str, known: &[&str]| closest(name, known).map(|k| format!("; did you mean {k:?}?")).unwrap_or_default();
    match head {
        "steps" => {
            let Some(x) = parts.get(1) else { return Ok(()) };
            let earlier: Vec<&str> = steps[..i].iter().map(|s| s.name.as_str()).collect();
            if earlier.contains(x) {
                return Ok(());
            }
            if steps[i].name == *x {
                return Err(format!("steps.{x}: a step cannot read its own output (steps.{x} is set once it has run)"));
            }
            if steps[i + 1..].iter().any(|s| s.name == *x) {
                return Err(format!(
                    "steps.{x}: step {x:?} runs after this one: its output is not there yet when this step runs"
                ));
            }
            let listed =
                if earlier.is_empty() { "none: this is the first step".to_string() } else { earlier.join(", ") };
            Err(format!("steps.{x}: no step {x:?} runs before this one (earlier steps: {listed}{})", mean(x, &earlier)))
        }
        "params" => {
            let Some(p) = parts.get(1) else { return Ok(()) };
            if scope.params.is_empty() || scope.params.contains_key(*p) {
                return Ok(());
            }
            let declared: Vec<&str> = scope.params.keys().map(String::as_str).collect();
            Err(format!(
                "params.{p}: the definition declares no param {p:?} (declared: {}{}); a trigger may only pass declared params",
                declared.join(", "),
                mean(p, &declared)
            ))
        }
        "secrets" => {
            let Some(s) = parts.get(1) else {
                return Err("secrets: name one (secrets.NAME); the whole map is never rendered".into());
            };
            let Some(declared) = scope.secrets else { return Ok(()) };
            if declared.contains(s) {
                return Ok(());
            }
            let listed = if declared.is_empty() { "none".to_string() } else { declared.join(", ") };
            Err(format!(
                "secrets.{s}: the definition declares no secret {s:?} (declared: {listed}{}); add it under secrets: \
                 with env: VAR or file: PATH",
                mean(s, declared)
            ))
        }
        "event" if !scope.on_event => {
            Err(format!("{var}: event is set only for an instance an event started: this definition has no on_event:"))
        }
        name if FIXED_NAMES.contains(&name) => Ok(()),
        name => Err(format!(
            "{name}: not a name a template can use (names: params, steps.<step>.<field>, secrets.<name>, work_dir, task_id, trace_id, \
             task, attempt, event{})",
            mean(name, FIXED_NAMES)
        )),
    }
}
