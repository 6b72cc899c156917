//! What each pane of the step view shows: the model's part, so the view
//! only draws it.

use super::{App, Pane};
use crate::console::json;
use serde_json::{json, Value};

impl App {
    /// The JSON the step view's pane shows, or `None` for the logs pane.
    pub fn pane_value(&self) -> Option<Value> {
        let app = self;
        let i = app.instance.as_ref()?;
        let steps = i.steps.as_ref()?;
        let s = steps.iter().find(|s| s.seq == app.step)?;
        // The context as it was before and after this step: the outputs of the
        // steps up to it.
        let upto = |last: u32| {
            let mut c = i.context.clone();
            if let Some(Value::Object(outs)) = c.get_mut("steps") {
                let keep: Vec<&str> = steps.iter().filter(|x| x.seq <= last).map(|x| x.name.as_str()).collect();
                outs.retain(|k, _| keep.contains(&k.as_str()));
            }
            c
        };
        match app.pane {
            Pane::Params => Some(s.params.clone().unwrap_or(Value::Null)),
            Pane::Before => Some(if app.step == 0 { strip_all(i.context.clone()) } else { upto(app.step - 1) }),
            Pane::After => Some(upto(app.step)),
            Pane::Output => Some(json!({"output": s.output, "error": s.error})),
            Pane::Attempts => Some(attempts(s)),
            Pane::Logs => None,
            Pane::Items => Some(items(s, app.items.get(&app.step), app.filter(super::View::Step))),
        }
    }
}

/// A fan-out step's items, counted, then each under `#index label: STATE`
/// (folded open to its batch, attempts, error, output, params and history)
/// — those whose line holds every word of `filter` (`/failed`, `/web-0`).
fn items(
    s: &apollo_shared::protocol::StepRun,
    items: Option<&Vec<apollo_shared::protocol::ItemRun>>,
    filter: &str,
) -> Value {
    let Some(n) = &s.items else {
        return json!("not a fan-out step (no foreach:), or not started yet");
    };
    let mut out = serde_json::Map::new();
    out.insert("counts".into(), json!(n.line()));
    let words: Vec<String> = filter.split_whitespace().map(str::to_lowercase).collect();
    let kept = |i: &&apollo_shared::protocol::ItemRun| {
        let key = item_key(i).to_lowercase();
        words.iter().all(|w| key.contains(w.as_str()))
    };
    if !words.is_empty() {
        let shown = items.into_iter().flatten().filter(kept).count();
        out.insert("filter".into(), json!(format!("{filter:?}: {shown} shown (Esc clears)")));
    }
    for i in items.into_iter().flatten().filter(kept) {
        out.insert(
            item_key(i),
            json!({"batch": i.batch, "attempts": i.attempts, "error": i.error, "history": i.history,
                   "output": i.output, "params": i.params}),
        );
    }
    Value::Object(out)
}

/// An item's line in the items pane: `#3 web-03: FAILED`.
pub(super) fn item_key(i: &apollo_shared::protocol::ItemRun) -> String {
    let state = if i.not_started() { "NOT STARTED" } else { i.state.as_str() };
    format!("#{} {}: {state}", i.index, i.label)
}

/// The last attempt compared with the one before it: what changed in the
/// params, the error, the output; then every earlier attempt as it ended.
fn attempts(s: &apollo_shared::protocol::StepRun) -> Value {
    let Some(prev) = s.earlier.last() else {
        return json!({"attempts": s.attempts, "compared": "one attempt only: nothing to compare"});
    };
    let params = json::diff(prev.params.as_ref().unwrap_or(&Value::Null), s.params.as_ref().unwrap_or(&Value::Null));
    let mut out = serde_json::Map::new();
    out.insert(
        "compared".into(),
        json!(format!("attempt {} (failed) → attempt {} ({})", prev.attempt, s.attempts, s.state.as_str())),
    );
    out.insert("params".into(), if params.is_empty() { json!("unchanged") } else { Value::Object(params) });
    if prev.error != s.error {
        out.insert("error".into(), json!({"before": prev.error, "after": s.error}));
    }
    if s.output.is_some() {
        out.insert("output".into(), json!({"before": null, "after": s.output}));
    }
    if prev.plugin_version != s.plugin_version {
        out.insert("plugin_version".into(), json!({"before": prev.plugin_version, "after": s.plugin_version}));
    }
    out.insert(
        "earlier".into(),
        s.earlier
            .iter()
            .map(|a| json!({"attempt": a.attempt, "error": a.error, "started_at": a.started_at, "finished_at": a.finished_at}))
            .collect(),
    );
    Value::Object(out)
}

fn strip_all(mut c: Value) -> Value {
    if let Some(Value::Object(o)) = c.get_mut("steps") {
        o.clear();
    }
    c
}
