//! `report_generator`: renders a template (minijinja; HTML-escaped for .html
//! names) with the context into a file.

use super::contract::{Call, ParamDoc, Plugin, PluginError};
use super::params::{check_known, io_err, required_str, str_param};
use futures::future::BoxFuture;
use serde_json::{json, Map, Value};
use std::io::BufRead;
use std::path::{Path, PathBuf};

pub struct ReportGenerator;

const PARAMS: &[&str] = &["template", "output", "title", "rows_file"];
/// Rows loaded from `rows_file` at most; the report says when it cut.
const MAX_ROWS: usize = 10_000;

/// A template path: absolute, or relative to the tasks directory (then to its
/// `templates/` folder).
fn template_path(tasks_dir: &Path, t: &str) -> PathBuf {
    let p = Path::new(t);
    if p.is_absolute() {
        return p.to_path_buf();
    }
    let direct = tasks_dir.join(p);
    if direct.exists() {
        direct
    } else {
        tasks_dir.join("templates").join(p)
    }
}

fn load_rows(path: &Path) -> Result<(Vec<Value>, bool), String> {
    let f = std::fs::File::open(path).map_err(|e| format!("rows_file: cannot open {}: {e}", path.display()))?;
    let mut rows = Vec::new();
    for line in std::io::BufReader::new(f).lines() {
        let line = line.map_err(|e| format!("rows_file: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        if rows.len() == MAX_ROWS {
            return Ok((rows, true));
        }
        rows.push(serde_json::from_str(&line).map_err(|e| format!("rows_file: {}: {e}", path.display()))?);
    }
    Ok((rows, false))
}

impl Plugin for ReportGenerator {
    fn name(&self) -> &str {
        "report_generator"
    }
    fn version(&self) -> semver::Version {
        semver::Version::new(1, 0, 0)
    }
    fn description(&self) -> &str {
        "Renders a template with the context into an HTML (or any text) file"
    }
    fn outputs(&self) -> Option<Vec<String>> {
        Some(["path", "bytes", "sha256", "created"].map(String::from).to_vec())
    }
    fn params(&self) -> Vec<ParamDoc> {
        vec![
            ParamDoc {
                name: "template",
                kind: "path",
                required: true,
                description: "relative to the tasks dir or its templates/",
            },
            ParamDoc { name: "output", kind: "path", required: false, description: "default: work dir/report.html" },
            ParamDoc { name: "title", kind: "string", required: false, description: "available as {{ title }}" },
            ParamDoc {
                name: "rows_file",
                kind: "path",
                required: false,
                description: "jsonl rows, available as {{ rows }} (default: a data_parser step just before)",
            },
        ]
    }
    fn check_params(&self, p: &Map<String, Value>) -> Result<(), String> {
        check_known(p, PARAMS)?;
        required_str(p, "template", "daily.html")?;
        str_param(p, "output")?;
        str_param(p, "title")?;
        str_param(p, "rows_file")?;
        Ok(())
    }
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, PluginError>> {
        Box::pin(async move {
            let p = call.params;
            let tpl = template_path(call.tasks_dir, required_str(p, "template", "").map_err(PluginError::permanent)?);
            let source = std::fs::read_to_string(&tpl)
                .map_err(|e| PluginError::permanent(format!("template: cannot read {}: {e}", tpl.display())))?;
            let output = match p.get("output").and_then(Value::as_str) {
                Some(o) => super::params::resolve_path(call.work_dir, o),
                None => call.work_dir.join("report.html"),
            };
            let mut vars = (**call.context).clone();
            vars["title"] = p.get("title").cloned().unwrap_or_else(|| json!(call.context["task"]));
            vars["generated_at"] = json!(chrono::Utc::now().to_rfc3339());
            // Without rows_file, the rows are the previous step's jsonl (a
            // data_parser's result), and its summary is `previous`.
            vars["previous"] = call.previous.cloned().unwrap_or(Value::Null);
            let rows_file = p
                .get("rows_file")
                .and_then(Value::as_str)
                .map(|rf| super::params::resolve_path(call.work_dir, rf))
                .or_else(|| {
                    call.previous
                        .filter(|o| o["format"].is_string())
                        .and_then(|o| o["path"].as_str())
                        .map(PathBuf::from)
                });
            if let Some(rf) = rows_file {
                let (rows, cut) = load_rows(&rf).map_err(PluginError::permanent)?;
                vars["rows"] = Value::Array(rows);
                vars["rows_truncated"] = json!(cut);
            }
            let name = output.file_name().and_then(|n| n.to_str()).unwrap_or("report.html").to_string();
            let mut env = minijinja::Environment::new();
            env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
            env.add_template_owned(name.clone(), source)
                .map_err(|e| PluginError::permanent(format!("template {}: {e}", tpl.display())))?;
            let text = env
                .get_template(&name)
                .and_then(|t| t.render(&vars))
                .map_err(|e| PluginError::permanent(format!("template {}: {e}", tpl.display())))?;
            if let Some(dir) = output.parent() {
                std::fs::create_dir_all(dir).map_err(|e| io_err("cannot create directory", dir, e))?;
            }
            let existed = output.exists();
            let tmp = output.with_extension("part");
            std::fs::write(&tmp, &text).map_err(|e| io_err("cannot write", &tmp, e))?;
            std::fs::rename(&tmp, &output).map_err(|e| io_err("cannot rename into", &output, e))?;
            let sha = super::params::sha256_file(&output).map_err(|e| io_err("cannot read", &output, e))?;
            call.log.line(&format!("wrote {} ({} bytes)", output.display(), text.len()));
            Ok(json!({"path": output, "bytes": text.len(), "sha256": sha, "created": !existed}))
        })
    }
    fn rollback<'a>(&'a self, call: Call<'a>, output: Option<&'a Value>) -> BoxFuture<'a, Result<(), PluginError>> {
        Box::pin(async move {
            if let Some(path) = output.filter(|o| o["created"] == Value::Bool(true)).and_then(|o| o["path"].as_str()) {
                if std::fs::remove_file(path).is_ok() {
                    call.log.line(&format!("rollback: removed {path}"));
                }
            }
            Ok(())
        })
    }
}
