//! A definition's `secrets:`: each name and where its value comes from (an
//! environment variable of the agent, or a file it reads). Templates use them
//! as `{{ secrets.NAME }}`; their values are read when a step starts and
//! never stored (see [`Masker`]).

use super::{kind, show};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Where a secret's value comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecretSource {
    /// The agent's environment variable.
    Env(String),
    /// A file the agent reads (its trailing newline dropped).
    File(String),
}

impl SecretSource {
    /// `environment variable X` or `file F`, for messages.
    pub fn describe(&self) -> String {
        match self {
            SecretSource::Env(v) => format!("environment variable {v}"),
            SecretSource::File(f) => format!("file {f}"),
        }
    }
}

/// `secrets:` as written, checked; problems go to `at(field, message)`.
pub(super) fn parse(v: Option<&Value>, at: &mut impl FnMut(&str, String)) -> BTreeMap<String, SecretSource> {
    let mut out = BTreeMap::new();
    let m = match v {
        None | Some(Value::Null) => return out,
        Some(Value::Object(m)) => m,
        Some(v) => {
            at("secrets", format!("expected a mapping of names to {{env: VAR}} or {{file: PATH}}, found {}", kind(v)));
            return out;
        }
    };
    for (name, spec) in m {
        let field = format!("secrets.{name}");
        if !super::valid_name(name) || name.contains('-') || name.contains('.') {
            at(&field, format!("{name:?} is not a valid secret name (letters, digits and '_')"));
            continue;
        }
        let one = |o: &Map<String, Value>| -> Result<SecretSource, String> {
            match (o.get("env"), o.get("file"), o.len()) {
                (Some(Value::String(e)), None, 1) if !e.is_empty() => Ok(SecretSource::Env(e.clone())),
                (None, Some(Value::String(f)), 1) if !f.is_empty() => Ok(SecretSource::File(f.clone())),
                (Some(v), None, 1) | (None, Some(v), 1) => {
                    Err(format!("expected a non-empty string, found {}", show(v)))
                }
                _ => Err("expected exactly one of env: VAR or file: PATH".into()),
            }
        };
        match spec {
            Value::Object(o) => match one(o) {
                Ok(s) => {
                    out.insert(name.clone(), s);
                }
                Err(e) => at(&field, e),
            },
            other => at(&field, format!("expected {{env: VAR}} or {{file: PATH}}, found {}", kind(other))),
        }
    }
    out
}

/// The text every secret's value is replaced with wherever it would show.
pub const MASK: &str = "***";

/// Replaces secrets' values with [`MASK`] in text and in JSON. Values are
/// masked longest first (so one that contains another goes whole); values
/// shorter than 3 characters are not masked (they would mask everything).
#[derive(Debug, Clone, Default)]
pub struct Masker {
    values: Vec<String>,
}

impl Masker {
    pub fn new(values: impl IntoIterator<Item = String>) -> Masker {
        let mut values: Vec<String> = values.into_iter().filter(|v| v.len() >= 3).collect();
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        values.dedup();
        Masker { values }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn text(&self, s: &str) -> String {
        let mut out = s.to_string();
        for v in &self.values {
            if out.contains(v.as_str()) {
                out = out.replace(v.as_str(), MASK);
            }
        }
        out
    }

    pub fn value(&self, v: &Value) -> Value {
        if self.is_empty() {
            return v.clone();
        }
        match v {
            Value::String(s) => Value::String(self.text(s)),
            Value::Array(items) => Value::Array(items.iter().map(|x| self.value(x)).collect()),
            Value::Object(m) => Value::Object(m.iter().map(|(k, x)| (k.clone(), self.value(x))).collect()),
            other => other.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_are_masked_longest_first_in_text_and_json() {
        let m = Masker::new(["hunter2".to_string(), "hunter2-extra".to_string(), "x".to_string()]);
        assert_eq!(m.text("a hunter2-extra b hunter2 x"), "a *** b *** x");
        assert_eq!(m.value(&json!({"a": ["pw=hunter2"], "n": 1})), json!({"a": ["pw=***"], "n": 1}));
    }

    #[test]
    fn a_bad_secret_is_named() {
        let mut errs = Vec::new();
        let v = json!({"ok": {"env": "DB_PW"}, "both": {"env": "A", "file": "/f"}, "bad-name": {"env": "X"}, "n": 3});
        let got = parse(Some(&v), &mut |f: &str, m: String| errs.push(format!("{f}: {m}")));
        assert_eq!(got.get("ok"), Some(&SecretSource::Env("DB_PW".into())));
        assert!(errs.iter().any(|e| e.starts_with("secrets.both: expected exactly one")), "{errs:?}");
        assert!(errs.iter().any(|e| e.starts_with("secrets.bad-name: ")), "{errs:?}");
        assert!(errs.iter().any(|e| e.starts_with("secrets.n: expected {env: VAR}")), "{errs:?}");
    }
}
