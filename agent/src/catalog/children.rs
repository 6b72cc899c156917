//! Sub-runbooks across definitions: a step's `task:` must name a task the
//! catalog holds, pass only the params it declares (and every required
//! one), and no chain of `task:` steps may come back to where it began.
//! A definition that fails these is refused like any bad file (a reload
//! keeps the version in force).

use apollo_shared::def::{DefError, TaskDef};
use apollo_shared::text::closest;
use std::collections::BTreeMap;

/// Every problem of each definition's `task:` steps, by task.
pub(super) fn problems(defs: &BTreeMap<String, (&TaskDef, String)>) -> BTreeMap<String, Vec<DefError>> {
    let mut out: BTreeMap<String, Vec<DefError>> = BTreeMap::new();
    let names: Vec<&str> = defs.keys().map(String::as_str).collect();
    for (task, (d, file)) in defs {
        for (i, s) in d.steps.iter().enumerate() {
            let Some(child) = &s.task else { continue };
            let mut at = |field: &str, message: String| {
                let field = format!("steps[{i}].{field}");
                out.entry(task.clone()).or_default().push(DefError {
                    file: file.clone(),
                    line: s.line,
                    field,
                    message,
                });
            };
            let Some((c, _)) = defs.get(child) else {
                let near = closest(child, &names).map(|n| format!("; did you mean {n:?}?")).unwrap_or_default();
                at("task", format!("no task {child:?} is defined (defined: {}{near})", names.join(", ")));
                continue;
            };
            if !c.params.is_empty() {
                let declared: Vec<&str> = c.params.keys().map(String::as_str).collect();
                for k in s.params.keys().filter(|k| !c.params.contains_key(*k)) {
                    let near = closest(k, &declared).map(|n| format!("did you mean {n:?}? ")).unwrap_or_default();
                    at(
                        &format!("params.{k}"),
                        format!("task {child:?} has no parameter {k:?} ({near}declared: {})", declared.join(", ")),
                    );
                }
            }
            for (k, spec) in &c.params {
                if spec.required && spec.default.is_none() && !s.params.contains_key(k) {
                    at("params", format!("task {child:?} needs parameter {k:?}: give it under params:"));
                }
            }
        }
    }
    // A cycle: each definition's chain of children, depth first.
    for (task, (d, file)) in defs {
        if let Some(path) = cycle(task, defs, &mut vec![task.clone()]) {
            let (i, s) = d
                .steps
                .iter()
                .enumerate()
                .find(|(_, s)| s.task.as_deref() == path.get(1).map(String::as_str))
                .expect("a task step");
            let message = format!(
                "a cycle of tasks running each other: {} (a task may not run itself, even through others)",
                path.join(" → ")
            );
            out.entry(task.clone()).or_default().push(DefError {
                file: file.clone(),
                line: s.line,
                field: format!("steps[{i}].task"),
                message,
            });
        }
    }
    out
}

/// The chain from `path[0]` back to itself, if `task`'s children lead there.
fn cycle(task: &str, defs: &BTreeMap<String, (&TaskDef, String)>, path: &mut Vec<String>) -> Option<Vec<String>> {
    let (d, _) = defs.get(task)?;
    for child in d.steps.iter().filter_map(|s| s.task.as_ref()) {
        if *child == path[0] {
            let mut p = path.clone();
            p.push(child.clone());
            return Some(p);
        }
        if path.contains(child) {
            continue;
        }
        path.push(child.clone());
        if let Some(p) = cycle(child, defs, path) {
            return Some(p);
        }
        path.pop();
    }
    None
}
