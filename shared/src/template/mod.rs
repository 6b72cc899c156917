//! Step parameters are templates over the context (minijinja).
//!
//! A string that is exactly one expression (`"{{ params.count }}"`) keeps the
//! type of its value; any other string containing `{{` or `{%` renders to a
//! string. An undefined name is an error; dry-run renders what it can and
//! leaves a string it cannot resolve as written.

use minijinja::{Environment, UndefinedBehavior};
use serde_json::{Map, Value};

mod refs;
pub use refs::{refs, unknown_callables, Refs, FIXED_NAMES};

/// The one environment every render uses: building one registers every
/// built-in filter and test, which cost more than a step's whole render.
fn env() -> &'static Environment<'static> {
    static ENV: std::sync::LazyLock<Environment<'static>> = std::sync::LazyLock::new(|| {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env
    });
    &ENV
}

/// Whether any string in `params` is a template (most steps' are not, and
/// then there is nothing to render and no context to build).
pub fn has_templates(params: &Map<String, Value>) -> bool {
    fn any(v: &Value) -> bool {
        match v {
            Value::String(s) => is_template(s),
            Value::Array(items) => items.iter().any(any),
            Value::Object(m) => m.values().any(any),
            _ => false,
        }
    }
    params.values().any(any)
}

fn is_template(s: &str) -> bool {
    s.contains("{{") || s.contains("{%")
}

/// The inner expression of a string that is a single `{{ … }}`.
fn single_expression(s: &str) -> Option<&str> {
    let t = s.trim();
    let inner = t.strip_prefix("{{")?.strip_suffix("}}")?;
    (!inner.contains("{{") && !inner.contains("}}")).then_some(inner.trim())
}

/// Checks a template's syntax without rendering it.
pub fn compile_check(text: &str) -> Result<(), String> {
    if !is_template(text) {
        return Ok(());
    }
    let env = env();
    env.template_from_str(text).map(|_| ()).map_err(|e| describe(&e))
}

/// Every string in `v` with its dotted path under `prefix`.
pub fn strings<'a>(v: &'a Value, prefix: &str) -> Vec<(String, &'a str)> {
    let mut out = Vec::new();
    walk(v, prefix.to_string(), &mut out);
    out
}

fn walk<'a>(v: &'a Value, path: String, out: &mut Vec<(String, &'a str)>) {
    match v {
        Value::String(s) => out.push((path, s)),
        Value::Array(items) => items.iter().enumerate().for_each(|(i, x)| walk(x, format!("{path}[{i}]"), out)),
        Value::Object(m) => m.iter().for_each(|(k, x)| walk(x, format!("{path}.{k}"), out)),
        _ => {}
    }
}

/// Renders every template string in `params` against `ctx`.
///
/// With `strict`, the first failure is returned as `Err(field: message)`.
/// Without it, unresolved strings are left as written and listed in the
/// second element of the result.
pub fn render(
    params: &Map<String, Value>,
    ctx: &Value,
    strict: bool,
) -> Result<(Map<String, Value>, Vec<String>), String> {
    if !has_templates(params) {
        return Ok((params.clone(), Vec::new()));
    }
    let env = env();
    let ctx = minijinja::Value::from_serialize(ctx);
    let mut unresolved = Vec::new();
    let mut out = Map::new();
    for (k, v) in params {
        out.insert(k.clone(), render_value(env, v, &ctx, k, strict, &mut unresolved)?);
    }
    Ok((out, unresolved))
}

fn render_value(
    env: &Environment<'static>,
    v: &Value,
    ctx: &minijinja::Value,
    path: &str,
    strict: bool,
    unresolved: &mut Vec<String>,
) -> Result<Value, String> {
    Ok(match v {
        Value::String(s) if is_template(s) => match render_str(env, s, ctx) {
            Ok(v) => v,
            Err(e) if strict => return Err(format!("{path}: {e}")),
            Err(_) => {
                unresolved.push(path.to_string());
                v.clone()
            }
        },
        Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, x)| render_value(env, x, ctx, &format!("{path}[{i}]"), strict, unresolved))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(m) => {
            let mut o = Map::new();
            for (k, x) in m {
                o.insert(k.clone(), render_value(env, x, ctx, &format!("{path}.{k}"), strict, unresolved)?);
            }
            Value::Object(o)
        }
        other => other.clone(),
    })
}

fn render_str(env: &Environment<'static>, s: &str, ctx: &minijinja::Value) -> Result<Value, String> {
    if let Some(expr) = single_expression(s) {
        let compiled = env.compile_expression(expr).map_err(|e| describe(&e))?;
        let value = compiled.eval(ctx).map_err(|e| describe(&e))?;
        if value.is_undefined() {
            return Err(format!("undefined value in {{{{ {expr} }}}}{HINT}"));
        }
        return serde_json::to_value(&value).map_err(|e| e.to_string());
    }
    let text = env.render_str(s, ctx).map_err(|e| describe(&e))?;
    Ok(Value::String(text))
}

const HINT: &str =
    " (names available: params, steps.<step>.<field>, work_dir, task_id, trace_id, task, attempt, event)";

fn describe(e: &minijinja::Error) -> String {
    let mut msg = e.detail().map(|d| format!("{}: {d}", e.kind())).unwrap_or_else(|| e.kind().to_string());
    if e.kind() == minijinja::ErrorKind::UndefinedError {
        msg.push_str(HINT);
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx() -> Value {
        json!({"params": {"n": 3, "date": "2026-11-29"}, "steps": {"download": {"path": "/w/r.csv"}}, "work_dir": "/w"})
    }

    #[test]
    fn single_expression_keeps_its_type() {
        let p = json!({"count": "{{ params.n }}", "path": "{{ steps.download.path }}"});
        let (out, _) = render(p.as_object().unwrap(), &ctx(), true).unwrap();
        assert_eq!(out["count"], json!(3));
        assert_eq!(out["path"], json!("/w/r.csv"));
    }

    #[test]
    fn mixed_text_renders_to_a_string_and_nested_values_render() {
        let p = json!({"target": "{{ work_dir }}/report-{{ params.date }}.html", "argv": ["echo", "{{ params.n }}"], "keep": 5});
        let (out, _) = render(p.as_object().unwrap(), &ctx(), true).unwrap();
        assert_eq!(out["target"], json!("/w/report-2026-11-29.html"));
        assert_eq!(out["argv"], json!(["echo", 3]));
        assert_eq!(out["keep"], json!(5));
    }

    #[test]
    fn strict_rendering_names_the_field_and_the_undefined_name() {
        let p = json!({"x": "{{ steps.parse.rows }}"});
        let e = render(p.as_object().unwrap(), &ctx(), true).unwrap_err();
        assert!(e.starts_with("x: "), "{e}");
        let p = json!({"x": "a {{ nope.deeper }}"});
        let e = render(p.as_object().unwrap(), &ctx(), true).unwrap_err();
        assert!(e.contains("undefined"), "{e}");
    }

    #[test]
    fn lenient_rendering_leaves_unresolved_templates_as_written() {
        let p = json!({"x": "{{ steps.parse.rows }}", "y": "{{ params.n }}"});
        let (out, unresolved) = render(p.as_object().unwrap(), &ctx(), false).unwrap();
        assert_eq!(out["x"], json!("{{ steps.parse.rows }}"));
        assert_eq!(out["y"], json!(3));
        assert_eq!(unresolved, vec!["x".to_string()]);
    }

    #[test]
    fn syntax_errors_are_found_without_rendering() {
        assert!(compile_check("{{ params.x ").is_err());
        assert!(compile_check("{% if %}").is_err());
        assert!(compile_check("plain text").is_ok());
        assert!(compile_check("{{ params.x | upper }}").is_ok());
    }
}
