//! A fan-out step (`foreach:`): its plugin runs once per item, in batches,
//! up to `max_parallel` at once, within a failure budget counted over the
//! whole step. Parsed here with the step; the agent runs it.

use super::{show, valid_name};
use crate::template::{self, FIXED_NAMES};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The most items a fan-out may have unless the agent's
/// `scheduler.max_items` says otherwise.
pub const MAX_ITEMS: usize = 10_000;

/// A count, or a percentage of all the items.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Size {
    Count(u32),
    Pct(f64),
}

impl Size {
    /// How many items of `n` a batch of this size takes (a percentage
    /// rounds up, and takes at least one).
    pub fn of_batch(self, n: usize) -> usize {
        match self {
            Size::Count(c) => c as usize,
            Size::Pct(p) => ((p * n as f64 / 100.0).ceil() as usize).max(1),
        }
    }

    /// How many failures of `n` items a budget of this size allows (a
    /// percentage rounds down: 10 % of 5 items allows none).
    pub fn of_budget(self, n: usize) -> usize {
        match self {
            Size::Count(c) => c as usize,
            Size::Pct(p) => (p * n as f64 / 100.0).floor() as usize,
        }
    }

    fn parse(v: &Value, zero: bool) -> Option<Size> {
        match v {
            Value::Number(n) => {
                n.as_u64().filter(|c| zero || *c > 0).and_then(|c| u32::try_from(c).ok()).map(Size::Count)
            }
            Value::String(s) => {
                let p: f64 = s.trim().strip_suffix('%')?.trim().parse().ok()?;
                (p.is_finite() && (0.0..=100.0).contains(&p) && (zero || p > 0.0)).then_some(Size::Pct(p))
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Size::Count(c) => write!(f, "{c}"),
            Size::Pct(p) => write!(f, "{p}%"),
        }
    }
}

/// A step's `foreach:` and the fields that go with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fanout {
    /// The items: a template that renders a list, or a list (whose
    /// elements may be templates).
    pub foreach: Value,
    /// The item's name in the step's params and env (`as:`; `item`).
    pub name: String,
    /// Batch sizes in order; each starts when the one before has ended.
    /// Empty: one batch of all the items.
    pub batches: Vec<Size>,
    /// Items running at once within a batch; `None`: the whole batch when
    /// `batches:` is given, else 1.
    pub max_parallel: Option<u32>,
    /// Failures allowed over the whole step before no further item starts.
    pub max_failures: Size,
    /// An approval between two batches (`approve_after_batch:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<BatchGate>,
}

/// An approval that stands between batch `after` and the next
/// (`approve_after_batch:`): once batch `after` has ended, the instance
/// parks until an approver decides, as at an approval step, and the
/// batches after it start only if approved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchGate {
    /// The batch after which it asks (1: after the canary).
    pub after: u32,
    /// The approval's params as an approval step takes them (`message`,
    /// `approvers`, `timeout`, `on_timeout`, `distinct_approver`); the
    /// message has a default.
    pub params: Map<String, Value>,
}

impl Fanout {
    /// Each batch's size for `n` items (the last one takes what is left),
    /// or why the batches do not cover them all.
    pub fn plan(&self, n: usize) -> Result<Vec<usize>, String> {
        if self.batches.is_empty() {
            return Ok(if n == 0 { Vec::new() } else { vec![n] });
        }
        let mut left = n;
        let mut out = Vec::new();
        for b in &self.batches {
            if left == 0 {
                break;
            }
            let take = b.of_batch(n).min(left);
            out.push(take);
            left -= take;
        }
        if left > 0 {
            let shown: Vec<String> = self.batches.iter().map(|b| format!("{b}")).collect();
            return Err(format!(
                "batches [{}] cover {} of the {n} items; end them with \"100%\" so the last batch takes the rest",
                shown.join(", "),
                n - left
            ));
        }
        Ok(out)
    }

    /// Items running at once within a batch of `size`.
    pub fn parallel(&self, size: usize) -> usize {
        match (self.max_parallel, self.batches.is_empty()) {
            (Some(p), _) => p as usize,
            (None, false) => size.max(1),
            (None, true) => 1,
        }
    }

    /// The items when they are known without running anything: a literal
    /// list with no template in it.
    pub fn literal(&self) -> Option<&[Value]> {
        match &self.foreach {
            Value::Array(a)
                if template::strings(&self.foreach, "").iter().all(|(_, s)| !s.contains("{{") && !s.contains("{%")) =>
            {
                Some(a)
            }
            _ => None,
        }
    }
}

/// The fan-out fields of step `m`, or `None` when it has no `foreach:`;
/// problems go to `at` (field, message).
pub(super) fn parse(m: &Map<String, Value>, at: &mut dyn FnMut(&str, String)) -> Option<Fanout> {
    let Some(foreach) = m.get("foreach").filter(|v| !v.is_null()) else {
        for field in ["as", "batches", "max_parallel", "max_failures", "approve_after_batch"] {
            if m.contains_key(field) {
                at(field, format!("`{field}:` goes with `foreach:` (a fan-out step); this step has none"));
            }
        }
        return None;
    };
    match foreach {
        Value::String(s) if s.contains("{{") => {
            if let Err(e) = template::compile_check(s) {
                at("foreach", format!("bad template: {e}"));
            }
        }
        Value::Array(items) => {
            for (path, text) in template::strings(foreach, "foreach") {
                if let Err(e) = template::compile_check(text) {
                    at(&path, format!("bad template: {e}"));
                }
            }
            if items.len() > MAX_ITEMS {
                at("foreach", format!("{} items is more than a fan-out may have ({MAX_ITEMS})", items.len()));
            }
        }
        v => at(
            "foreach",
            format!(
                "expected a list of items or a template that renders one (e.g. \"{{{{ params.hosts }}}}\"), found {}",
                show(v)
            ),
        ),
    }
    let name = match m.get("as") {
        None | Some(Value::Null) => "item".to_string(),
        Some(Value::String(s)) if valid_name(s) && !s.contains(['-', '.']) => {
            if FIXED_NAMES.contains(&s.as_str()) || ["params", "steps", "secrets"].contains(&s.as_str()) {
                at("as", format!("{s:?} is a name templates have already; choose another (e.g. host)"));
            }
            s.clone()
        }
        Some(v) => {
            at("as", format!("expected the item's name in templates (letters, digits, '_'), found {}", show(v)));
            "item".to_string()
        }
    };
    let batches = match m.get("batches") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) if !list.is_empty() => {
            let mut out = Vec::new();
            for (i, b) in list.iter().enumerate() {
                match Size::parse(b, false) {
                    Some(s) => out.push(s),
                    None => at(
                        &format!("batches[{i}]"),
                        format!(
                            "expected a batch size: a count above 0 or a percentage like \"25%\", found {}",
                            show(b)
                        ),
                    ),
                }
            }
            out
        }
        Some(v) => {
            at("batches", format!("expected a list of batch sizes such as [1, \"25%\", \"100%\"], found {}", show(v)));
            Vec::new()
        }
    };
    let max_parallel = match m.get("max_parallel") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) if n.as_u64().is_some_and(|p| (1..=10_000).contains(&p)) => n.as_u64().map(|p| p as u32),
        Some(v) => {
            at("max_parallel", format!("expected a whole number of items at once from 1 to 10000, found {}", show(v)));
            None
        }
    };
    let max_failures = match m.get("max_failures") {
        None | Some(Value::Null) => Size::Count(0),
        Some(v) => Size::parse(v, true).unwrap_or_else(|| {
            at(
                "max_failures",
                format!("expected a count of failures (0 or more) or a percentage like \"10%\", found {}", show(v)),
            );
            Size::Count(0)
        }),
    };
    let gate = m.get("approve_after_batch").filter(|v| !v.is_null()).and_then(|v| gate(v, &batches, at));
    let f = Fanout { foreach: foreach.clone(), name, batches, max_parallel, max_failures, gate };
    if let Some(items) = f.literal() {
        if let Err(e) = f.plan(items.len()) {
            at("batches", e);
        }
    }
    Some(f)
}

/// The fields an approval step's params may have, which a gate takes too.
const GATE_FIELDS: &[&str] = &["batch", "message", "approvers", "timeout", "on_timeout", "distinct_approver"];

/// `approve_after_batch:` as written: the batch's number, or a mapping of
/// `batch` and the approval's params. Its approval params are checked by
/// the agent (who the approvers are is the host's business).
fn gate(v: &Value, batches: &[Size], at: &mut dyn FnMut(&str, String)) -> Option<BatchGate> {
    const FIELD: &str = "approve_after_batch";
    let (after, mut params) = match v {
        Value::Number(_) => (v.clone(), Map::new()),
        Value::Object(m) => {
            if let Some(k) = m.keys().find(|k| !GATE_FIELDS.contains(&k.as_str())) {
                let hint =
                    crate::text::closest(k, GATE_FIELDS).map(|c| format!("did you mean {c:?}? ")).unwrap_or_default();
                at(FIELD, format!("unknown field {k:?} ({hint}expected one of: {})", GATE_FIELDS.join(", ")));
                return None;
            }
            let mut params = m.clone();
            (params.remove("batch").unwrap_or(Value::Null), params)
        }
        other => {
            at(FIELD, format!("expected the batch after which to ask (e.g. 1), or a mapping with `batch:` and the approval's message and approvers, found {}", show(other)));
            return None;
        }
    };
    let Some(after) = after.as_u64().filter(|n| *n >= 1).and_then(|n| u32::try_from(n).ok()) else {
        at(
            FIELD,
            format!(
                "batch: expected the number of the batch after which to ask (1 for the first), found {}",
                show(&after)
            ),
        );
        return None;
    };
    if batches.is_empty() {
        at(FIELD, "the step has one batch, so nothing comes after it: give `batches:` (e.g. [1, \"100%\"]: a canary, then the rest)".into());
        return None;
    }
    if after as usize >= batches.len() {
        at(
            FIELD,
            format!(
                "batch {after} is the last of the {} in `batches:`, so nothing comes after it to approve",
                batches.len()
            ),
        );
        return None;
    }
    params
        .entry("message")
        .or_insert_with(|| Value::String(format!("batch {after} has ended: start the batches after it?")));
    Some(BatchGate { after, params })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fanout(batches: Value) -> Fanout {
        let m = json!({"foreach": ["a"], "batches": batches});
        let mut errors = Vec::new();
        let f = parse(m.as_object().unwrap(), &mut |f, e| errors.push(format!("{f}: {e}"))).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        f
    }

    #[test]
    fn a_canary_then_a_quarter_then_the_rest() {
        assert_eq!(fanout(json!([1, "25%", "100%"])).plan(40).unwrap(), vec![1, 10, 29]);
        assert_eq!(fanout(json!([1, "25%", "100%"])).plan(1).unwrap(), vec![1]);
        assert_eq!(fanout(json!([1, "25%", "100%"])).plan(0).unwrap(), Vec::<usize>::new());
    }

    #[test]
    fn batches_short_of_the_items_say_how_many_they_cover() {
        let e = fanout(json!([1, 10])).plan(40).unwrap_err();
        assert!(e.contains("cover 11 of the 40 items"), "{e}");
    }

    #[test]
    fn a_budget_in_percent_rounds_down() {
        assert_eq!(Size::Pct(10.0).of_budget(40), 4);
        assert_eq!(Size::Pct(10.0).of_budget(5), 0);
        assert_eq!(Size::Count(2).of_budget(40), 2);
    }

    #[test]
    fn bad_fields_are_named() {
        let m = json!({"foreach": 5, "as": "task", "batches": [0], "max_failures": -1, "max_parallel": 0});
        let mut errors = Vec::new();
        parse(m.as_object().unwrap(), &mut |f, e| errors.push(format!("{f}: {e}")));
        let all = errors.join("\n");
        for f in ["foreach:", "as:", "batches[0]:", "max_failures:", "max_parallel:"] {
            assert!(all.contains(f), "{f} in {all}");
        }
    }
}
