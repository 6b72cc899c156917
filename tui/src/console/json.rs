//! JSON shown as a tree that folds: one line per value, children indented.
//! Folded objects and arrays show a one-line summary. The lines are plain
//! text, so what is on screen can be copied as it is.

use serde_json::Value;
use std::collections::BTreeSet;

/// (path, text) for each line of `v` rendered under `folds`.
pub fn lines(v: &Value, folds: &BTreeSet<String>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    walk(None, v, "$", 0, folds, &mut out);
    out
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

fn walk(
    key: Option<&str>,
    v: &Value,
    path: &str,
    depth: usize,
    folds: &BTreeSet<String>,
    out: &mut Vec<(String, String)>,
) {
    let indent = "  ".repeat(depth);
    let label = key.map(|k| format!("{k}: ")).unwrap_or_default();
    match v {
        Value::Object(m) if !m.is_empty() => {
            if folds.contains(path) {
                out.push((path.into(), format!("{indent}▸ {label}{{…{} keys}}", m.len())));
                return;
            }
            out.push((path.into(), format!("{indent}▾ {label}{{")));
            for (k, x) in m {
                walk(Some(k), x, &format!("{path}.{k}"), depth + 1, folds, out);
            }
            out.push((format!("{path}}}"), format!("{indent}  }}")));
        }
        Value::Array(a) if !a.is_empty() => {
            if folds.contains(path) {
                out.push((path.into(), format!("{indent}▸ {label}[…{} items]", a.len())));
                return;
            }
            out.push((path.into(), format!("{indent}▾ {label}[")));
            for (i, x) in a.iter().enumerate() {
                walk(None, x, &format!("{path}[{i}]"), depth + 1, folds, out);
            }
            out.push((format!("{path}]"), format!("{indent}  ]")));
        }
        // A string of several lines (a shell script) shows as its lines.
        Value::String(s) if s.trim_end().contains('\n') => {
            out.push((path.into(), format!("{indent}  {label}|")));
            for (i, line) in s.trim_end().lines().enumerate() {
                out.push((format!("{path}#{i}"), format!("{indent}    {line}")));
            }
        }
        other => out.push((path.into(), format!("{indent}  {label}{}", scalar(other)))),
    }
}

/// What differs between two JSON values: for each leaf path (objects are
/// walked, arrays and scalars compared whole) `{"before", "after"}`.
pub fn diff(before: &Value, after: &Value) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    diff_at("", before, after, &mut out);
    out
}

fn diff_at(path: &str, a: &Value, b: &Value, out: &mut serde_json::Map<String, Value>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                diff_at(&p, x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null), out);
            }
        }
        _ if a != b => {
            let key = if path.is_empty() { "(value)".to_string() } else { path.to_string() };
            out.insert(key, serde_json::json!({"before": a, "after": b}));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn folds_and_unfolds() {
        let v = json!({"rows": 12, "columns": ["a", "b"], "summary": {"x": {"sum": 1.5}}});
        let open: Vec<String> = lines(&v, &BTreeSet::new()).into_iter().map(|l| l.1).collect();
        assert_eq!(open[0], "▾ {");
        assert!(open.contains(&"      \"a\"".to_string()), "{open:?}");
        let folds: BTreeSet<String> = ["$.summary".to_string()].into();
        let folded: Vec<String> = lines(&v, &folds).into_iter().map(|l| l.1).collect();
        assert!(folded.contains(&"  ▸ summary: {…1 keys}".to_string()), "{folded:?}");
        assert!(folded.len() < open.len());
    }

    #[test]
    fn a_string_of_several_lines_shows_as_its_lines() {
        let v = json!({"command": "echo one\necho two\n"});
        let text: Vec<String> = lines(&v, &BTreeSet::new()).into_iter().map(|l| l.1).collect();
        assert_eq!(text, ["▾ {", "    command: |", "      echo one", "      echo two", "  }"]);
    }

    #[test]
    fn diff_names_each_changed_leaf() {
        let a = serde_json::json!({"source": "s3://b/k", "opts": {"retries": 1, "gone": true}});
        let b = serde_json::json!({"source": "s3://b/k", "opts": {"retries": 2}, "new": [1]});
        let d = super::diff(&a, &b);
        let keys: Vec<&str> = d.keys().map(String::as_str).collect();
        assert_eq!(keys, ["new", "opts.gone", "opts.retries"]);
        assert_eq!(d["opts.retries"], serde_json::json!({"before": 1, "after": 2}));
    }
}
