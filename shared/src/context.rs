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

    /// Merges a step's output, refusing it when it breaks a limit. Returns
    /// the output and the whole context as the JSON text that is stored,
    /// each serialized once (their sizes are the limits' measure).
    pub fn merge_output(&mut self, step: &str, output: Value, limits: Limits) -> Result<(String, String), String> {
        let text = output.to_string();
        let size = text.len();
        if size > limits.step_output_bytes {
            return Err(format!(
                "output of step {step:?} is {size} bytes, over the {} byte limit for one step's output: \
                 store it in a file and return its path and checksum instead",
                limits.step_output_bytes
            ));
        }
        self.steps.insert(step.to_string(), output);
        let context = serde_json::to_string(self).unwrap_or_default();
        let total = context.len();
        if total > limits.context_bytes {
            self.steps.remove(step);
            return Err(format!(
                "context would grow to {total} bytes with the output of step {step:?}, over the {} byte limit: \
                 store large data in a file and return its path and checksum instead",
                limits.context_bytes
            ));
        }
        Ok((text, context))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn oversized_output_is_refused_with_advice() {
        let mut c = Context::default();
        let limits = Limits { step_output_bytes: 100, context_bytes: 1000 };
        let e = c.merge_output("parse", json!("x".repeat(200)), limits).unwrap_err();
        assert!(e.contains("store it in a file and return its path"), "{e}");
        assert!(c.steps.is_empty());
        let (output, context) = c.merge_output("a", json!("x".repeat(90)), limits).unwrap();
        assert_eq!(c.steps["a"], json!("x".repeat(90)));
        assert_eq!(output, json!("x".repeat(90)).to_string());
        assert_eq!(serde_json::from_str::<Context>(&context).unwrap(), c);
    }

    #[test]
    fn context_limit_is_enforced_and_leaves_the_context_as_it_was() {
        let mut c = Context::default();
        let limits = Limits { step_output_bytes: 600, context_bytes: 1000 };
        c.merge_output("a", json!("x".repeat(500)), limits).unwrap();
        let e = c.merge_output("b", json!("y".repeat(500)), limits).unwrap_err();
        assert!(e.contains("context would grow"), "{e}");
        assert!(!c.steps.contains_key("b"));
    }
}
