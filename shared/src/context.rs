//! The context an instance carries from step to step.
//!
//! It holds references and summaries, not data: each step's output and the
//! whole context have size limits, and going over one fails the step with a
//! message that says to write the data to a file instead.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Default cap on one step's output, serialized as JSON.
pub const MAX_STEP_OUTPUT_BYTES: usize = 64 * 1024;
/// Default cap on the whole context, serialized as JSON.
pub const MAX_CONTEXT_BYTES: usize = 1024 * 1024;

/// Size limits, configurable in the agent's `scheduler` section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub step_output_bytes: usize,
    pub context_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { step_output_bytes: MAX_STEP_OUTPUT_BYTES, context_bytes: MAX_CONTEXT_BYTES }
    }
}

/// What a step's templates and plugin see, and what is persisted after each step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Context {
    pub task: String,
    pub task_id: String,
    pub trace_id: String,
    /// The instance's parameters, defaults filled in.
    pub params: Map<String, Value>,
    /// A directory private to the instance, under the agent's data dir.
    pub work_dir: String,
    /// The payload of the event that created the instance, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<Value>,
    /// The instance's attempt number, starting at 1.
    pub attempt: u32,
    /// Each succeeded step's output, by step name.
    pub steps: Map<String, Value>,
}

impl Context {
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// What the store keeps of a new instance's context: only what its row
    /// and its steps' outputs do not say — the work dir (as its root when
    /// it is `<root>/<id>`) and the event. [`Context::of`] makes the whole
    /// context again.
    pub fn stored(&self) -> Value {
        let mut m = Map::new();
        let suffix = format!("/{}", self.task_id);
        match self.work_dir.strip_suffix(&suffix).filter(|root| !root.is_empty() && !self.task_id.is_empty()) {
            Some(root) => m.insert("work_root".into(), Value::String(root.to_string())),
            None => m.insert("work_dir".into(), Value::String(self.work_dir.clone())),
        };
        if let Some(e) = &self.event {
            m.insert("event".into(), e.clone());
        }
        Value::Object(m)
    }

    /// The whole context of `inst` with its steps: what the store kept of
    /// it (`inst.context`: the stored form, or a whole context an earlier
    /// version kept, whose fields stand), the instance's row (task, id,
    /// trace id, params, attempt) and each succeeded step's output, by
    /// name, in step order — as `merge_output` built it step by step.
    pub fn of(inst: &crate::protocol::Instance) -> Context {
        let kept = inst.context.as_object();
        let get = |k: &str| kept.and_then(|m| m.get(k));
        let text = |k: &str, or: &str| get(k).and_then(Value::as_str).unwrap_or(or).to_string();
        let work_dir = match (get("work_dir").and_then(Value::as_str), get("work_root").and_then(Value::as_str)) {
            (Some(dir), _) => dir.to_string(),
            (None, Some(root)) => format!("{root}/{}", inst.id),
            (None, None) => String::new(),
        };
        let mut steps = get("steps").and_then(Value::as_object).cloned().unwrap_or_default();
        for st in inst.steps.iter().flatten() {
            let done = matches!(st.state, crate::state::StepState::Success | crate::state::StepState::RolledBack);
            if let (true, Some(out)) = (done, &st.output) {
                steps.insert(st.name.clone(), out.clone());
            }
        }
        Context {
            task: text("task", &inst.task),
            task_id: text("task_id", &inst.id),
            trace_id: text("trace_id", &inst.trace_id),
            params: get("params").or(Some(&inst.params)).and_then(Value::as_object).cloned().unwrap_or_default(),
            work_dir,
            event: get("event").cloned(),
            attempt: get("attempt").and_then(Value::as_u64).map_or(inst.attempt, |a| a as u32),
            steps,
        }
    }

    /// Merges a step's output, refusing it when it breaks a limit. Returns
    /// the output as the JSON text that is stored (its size, and the whole
    /// context's serialized, are the limits' measure). `size` holds the
    /// context's [`Context::size`] once known (`None` at first, then kept
    /// up to date here): a caller that merges output after output into one
    /// context keeps it, and each merge adds its entry's length instead of
    /// serializing the whole context again. The context must not change in
    /// between but through this call (debug builds check it).
    pub fn merge_output(
        &mut self,
        step: &str,
        output: Value,
        limits: Limits,
        size: &mut Option<usize>,
    ) -> Result<String, String> {
        let text = output.to_string();
        if text.len() > limits.step_output_bytes {
            return Err(format!(
                "output of step {step:?} is {} bytes, over the {} byte limit for one step's output: \
                 store it in a file and return its path and checksum instead",
                text.len(),
                limits.step_output_bytes
            ));
        }
        let before = *size.get_or_insert_with(|| self.size());
        debug_assert_eq!(before, self.size(), "the context changed outside merge_output");
        // An entry of `steps` is `"name":value`, after a comma unless first.
        let entry = |value_len: usize| serde_json::to_string(step).map_or(0, |k| k.len()) + 1 + value_len;
        let total = match self.steps.get(step) {
            Some(old) => before - entry(old.to_string().len()) + entry(text.len()),
            None => before + entry(text.len()) + usize::from(!self.steps.is_empty()),
        };
        if total > limits.context_bytes {
            return Err(format!(
                "context would grow to {total} bytes with the output of step {step:?}, over the {} byte limit: \
                 store large data in a file and return its path and checksum instead",
                limits.context_bytes
            ));
        }
        self.steps.insert(step.to_string(), output);
        *size = Some(total);
        Ok(text)
    }

    /// The length of the context as JSON, counted without building it.
    pub fn size(&self) -> usize {
        struct Count(usize);
        impl std::io::Write for Count {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0 += b.len();
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut n = Count(0);
        let _ = serde_json::to_writer(&mut n, self);
        n.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The size a merge keeps is the context's serialized length after
    /// every merge: a first entry, later ones, an entry replaced by a
    /// longer and a shorter value, names JSON escapes, and a refused merge
    /// (which changes neither).
    #[test]
    fn a_merge_keeps_the_contexts_size_as_serializing_it_would() {
        let mut c = Context { task: "t".into(), task_id: "T1".into(), ..Context::default() };
        c.params.insert("n".into(), json!(1));
        let limits = Limits { step_output_bytes: 1000, context_bytes: 400 };
        let mut size = None;
        let outputs = [
            ("a", json!({"x": 1})),
            ("b \"quoted\" é", json!("two\nlines")),
            ("a", json!({"x": "longer than before"})),
            ("c", json!(null)),
            ("a", json!(0)),
        ];
        for (step, out) in outputs {
            let text = c.merge_output(step, out.clone(), limits, &mut size).unwrap();
            assert_eq!(text, out.to_string());
            assert_eq!(size, Some(c.size()), "after {step:?}");
            assert_eq!(c.size(), serde_json::to_string(&c).unwrap().len());
        }
        let before = (c.clone(), size);
        let e = c.merge_output("d", json!("y".repeat(300)), limits, &mut size).unwrap_err();
        assert!(e.contains("context would grow to"), "{e}");
        assert_eq!((c, size), before);
    }

    #[test]
    fn oversized_output_is_refused_with_advice() {
        let mut c = Context::default();
        let limits = Limits { step_output_bytes: 100, context_bytes: 1000 };
        let e = c.merge_output("parse", json!("x".repeat(200)), limits, &mut None).unwrap_err();
        assert!(e.contains("store it in a file and return its path"), "{e}");
        assert!(c.steps.is_empty());
        let output = c.merge_output("a", json!("x".repeat(90)), limits, &mut None).unwrap();
        assert_eq!(c.steps["a"], json!("x".repeat(90)));
        assert_eq!(output, json!("x".repeat(90)).to_string());
        assert_eq!(c.size(), serde_json::to_string(&c).unwrap().len());
    }

    /// What the store keeps and its steps' outputs make the context the
    /// executor built step by step; a whole context an earlier version kept
    /// stands, with the outputs of steps that succeeded since.
    #[test]
    fn the_stored_form_and_the_steps_outputs_make_the_whole_context_again() {
        use crate::protocol::{Instance, StepRun};
        use crate::state::StepState;
        let mut c = Context {
            task: "t".into(),
            task_id: "01ID".into(),
            trace_id: "tr".into(),
            params: json!({"x": 1}).as_object().cloned().unwrap(),
            work_dir: "/data/work/01ID".into(),
            event: Some(json!({"e": true})),
            attempt: 1,
            steps: Map::new(),
        };
        assert_eq!(c.stored(), json!({"work_root": "/data/work", "event": {"e": true}}));
        let limits = Limits::default();
        let step = |seq: u32, name: &str, state: StepState, output: Option<Value>| StepRun {
            state,
            attempts: 1,
            output,
            seq,
            name: name.into(),
            plugin: "p".into(),
            ..StepRun::default()
        };
        let a = c.merge_output("a", json!({"n": 1}), limits, &mut None).unwrap();
        let b = c.merge_output("b", json!([2]), limits, &mut None).unwrap();
        let mut inst: Instance = serde_json::from_value(json!({
            "id": "01ID", "task": "t", "def_hash": "h", "state": "RUNNING", "attempt": 1, "trace_id": "tr",
            "priority": 50, "queue": "q", "trigger": "manual", "dedup_key": null, "params": {"x": 1},
            "created_at": "2026-12-06T00:00:00Z", "started_at": null, "finished_at": null, "next_run_at": null,
            "error": null, "context": c.stored()
        }))
        .unwrap();
        inst.steps = Some(vec![
            step(0, "a", StepState::Success, serde_json::from_str(&a).ok()),
            step(1, "b", StepState::RolledBack, serde_json::from_str(&b).ok()),
            step(2, "c", StepState::Failed, Some(json!("not merged"))),
        ]);
        assert_eq!(Context::of(&inst), c);
        // A work dir that is not <root>/<id> is kept whole.
        let odd = Context { work_dir: "/elsewhere".into(), ..c.clone() };
        assert_eq!(odd.stored()["work_dir"], "/elsewhere");
        // A whole context kept by an earlier version: its fields stand.
        let mut old = c.clone();
        old.attempt = 7;
        old.steps.remove("b");
        inst.context = old.to_value();
        let made = Context::of(&inst);
        assert_eq!((made.attempt, made.steps.len()), (7, 2));
    }

    #[test]
    fn context_limit_is_enforced_and_leaves_the_context_as_it_was() {
        let mut c = Context::default();
        let limits = Limits { step_output_bytes: 600, context_bytes: 1000 };
        c.merge_output("a", json!("x".repeat(500)), limits, &mut None).unwrap();
        let e = c.merge_output("b", json!("y".repeat(500)), limits, &mut None).unwrap_err();
        assert!(e.contains("context would grow"), "{e}");
        assert!(!c.steps.contains_key("b"));
    }
}
