//! `data_parser`: reads csv, json (an array of objects) or jsonl; puts a
//! summary into the context (row count, columns, per-column numeric
//! summary) and writes the full result as jsonl to a file referenced by path
//! and checksum. The input defaults to the previous step's output `path`.

use super::contract::{Call, ParamDoc, Plugin, PluginError};
use super::params::{check_known, io_err, str_param};
use futures::future::BoxFuture;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};

pub struct DataParser;

const PARAMS: &[&str] = &["input", "format", "output", "delimiter"];
const FORMATS: &[&str] = &["csv", "json", "jsonl"];

#[derive(Default)]
struct Column {
    count: u64,
    numeric: u64,
    sum: f64,
    min: Option<f64>,
    max: Option<f64>,
}

#[derive(Default)]
struct Summary {
    columns: Vec<String>,
    stats: BTreeMap<String, Column>,
    rows: u64,
}

impl Summary {
    fn add(&mut self, row: &Map<String, Value>) {
        self.rows += 1;
        for (k, v) in row {
            if !self.stats.contains_key(k) {
                self.columns.push(k.clone());
            }
            let c = self.stats.entry(k.clone()).or_default();
            c.count += 1;
            let n = match v {
                Value::Number(n) => n.as_f64(),
                Value::String(s) => s.trim().parse::<f64>().ok(),
                _ => None,
            };
            if let Some(x) = n.filter(|x| x.is_finite()) {
                c.numeric += 1;
                c.sum += x;
                c.min = Some(c.min.map_or(x, |m| m.min(x)));
                c.max = Some(c.max.map_or(x, |m| m.max(x)));
            }
        }
    }

    fn to_value(&self) -> Value {
        let mut numeric = Map::new();
        for name in &self.columns {
            let c = &self.stats[name];
            // A column is numeric when every value in it is a number.
            if c.numeric > 0 && c.numeric == c.count {
                let mean = c.sum / c.numeric as f64;
                numeric.insert(
                    name.clone(),
                    json!({"count": c.numeric, "sum": round(c.sum), "min": c.min, "max": c.max, "mean": round(mean)}),
                );
            }
        }
        json!({"rows": self.rows, "columns": self.columns, "summary": numeric})
    }
}

fn round(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

fn format_of(p: &Map<String, Value>, input: &Path) -> Result<String, String> {
    let f = match str_param(p, "format")? {
        Some(f) => f.to_string(),
        None => input.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase(),
    };
    if FORMATS.contains(&f.as_str()) {
        Ok(f)
    } else {
        Err(format!(
            "format: {f:?} is not supported (expected one of: {}; set format: when the file name does not say)",
            FORMATS.join(", ")
        ))
    }
}

/// The csv field separator: one ASCII character, or `\t` / `tab`.
fn delimiter(p: &Map<String, Value>) -> Result<u8, String> {
    match str_param(p, "delimiter")? {
        None => Ok(b','),
        Some("\\t" | "\t" | "tab") => Ok(b'\t'),
        Some(d) if d.len() == 1 && d.is_ascii() && d != "\"" && d != "\n" => Ok(d.as_bytes()[0]),
        Some(d) => Err(format!(
            "delimiter: {d:?} is not one character (expected a single ASCII character such as \",\", \";\" or \"|\", or \"tab\")"
        )),
    }
}

fn parse_file(
    path: &Path,
    format: &str,
    delimiter: u8,
    out: &mut impl Write,
    summary: &mut Summary,
) -> Result<(), String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut emit = |row: Map<String, Value>, summary: &mut Summary| -> Result<(), String> {
        summary.add(&row);
        serde_json::to_writer(&mut *out, &row).map_err(|e| e.to_string())?;
        out.write_all(b"\n").map_err(|e| e.to_string())
    };
    match format {
        "csv" => {
            let mut rdr = csv::ReaderBuilder::new().delimiter(delimiter).from_reader(file);
            let headers = rdr.headers().map_err(|e| format!("{}: {e}", path.display()))?.clone();
            for (i, rec) in rdr.records().enumerate() {
                let rec = rec.map_err(|e| format!("{}: row {}: {e}", path.display(), i + 2))?;
                let row = headers
                    .iter()
                    .zip(rec.iter())
                    .map(|(h, v)| (h.to_string(), Value::String(v.to_string())))
                    .collect();
                emit(row, summary)?;
            }
        }
        "jsonl" => {
            for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
                let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
                if line.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str(&line) {
                    Ok(Value::Object(row)) => emit(row, summary)?,
                    Ok(_) => return Err(format!("{}: line {}: expected a JSON object", path.display(), i + 1)),
                    Err(e) => return Err(format!("{}: line {}: {e}", path.display(), i + 1)),
                }
            }
        }
        _ => {
            let v: Value = serde_json::from_reader(std::io::BufReader::new(file))
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let Value::Array(items) = v else {
                return Err(format!("{}: expected a JSON array of objects", path.display()));
            };
            for (i, item) in items.into_iter().enumerate() {
                match item {
                    Value::Object(row) => emit(row, summary)?,
                    _ => return Err(format!("{}: item {i}: expected an object", path.display())),
                }
            }
        }
    }
    Ok(())
}

fn input(call: &Call<'_>) -> Result<PathBuf, PluginError> {
    if let Some(i) = call.params.get("input").and_then(Value::as_str) {
        return Ok(super::params::resolve_path(call.work_dir, i));
    }
    call.previous.and_then(|o| o["path"].as_str()).map(PathBuf::from).ok_or_else(|| {
        PluginError::permanent("input: missing, and the previous step's output has no `path` to default to")
    })
}

impl Plugin for DataParser {
    fn name(&self) -> &str {
        "data_parser"
    }
    fn version(&self) -> semver::Version {
        semver::Version::new(1, 0, 0)
    }
    fn description(&self) -> &str {
        "Parses csv/json/jsonl: a summary into the context, the full result to a jsonl file"
    }
    fn outputs(&self) -> Option<Vec<String>> {
        Some(["rows", "columns", "summary", "path", "sha256"].map(String::from).to_vec())
    }
    fn params(&self) -> Vec<ParamDoc> {
        vec![
            ParamDoc {
                name: "input",
                kind: "path",
                required: false,
                description: "default: the previous step's output path",
            },
            ParamDoc {
                name: "format",
                kind: "csv|json|jsonl",
                required: false,
                description: "default: from the file name",
            },
            ParamDoc { name: "output", kind: "path", required: false, description: "default: work dir/<step>.jsonl" },
            ParamDoc {
                name: "delimiter",
                kind: "char",
                required: false,
                description: "csv field separator (default \",\"; \"tab\" for tabs)",
            },
        ]
    }
    fn check_params(&self, p: &Map<String, Value>) -> Result<(), String> {
        check_known(p, PARAMS)?;
        str_param(p, "input")?;
        str_param(p, "output")?;
        let format = str_param(p, "format")?;
        if let Some(f) = format {
            if !FORMATS.contains(&f) {
                return Err(format!("format: {f:?} is not supported (expected one of: {})", FORMATS.join(", ")));
            }
        }
        delimiter(p)?;
        if p.contains_key("delimiter") && format.is_some_and(|f| f != "csv") {
            return Err("delimiter: applies to format csv only".into());
        }
        Ok(())
    }
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, PluginError>> {
        Box::pin(async move {
            let input = input(&call)?;
            let format = format_of(call.params, &input).map_err(PluginError::permanent)?;
            let delimiter = delimiter(call.params).map_err(PluginError::permanent)?;
            let output = match call.params.get("output").and_then(Value::as_str) {
                Some(o) => super::params::resolve_path(call.work_dir, o),
                None => call.work_dir.join(format!("{}.jsonl", call.step)),
            };
            let tmp = output.with_extension("jsonl.part");
            let (inp, fmt, tmp2) = (input.clone(), format.clone(), tmp.clone());
            let summary = tokio::task::spawn_blocking(move || {
                let f = std::fs::File::create(&tmp2).map_err(|e| format!("cannot create {}: {e}", tmp2.display()))?;
                let mut w = BufWriter::new(f);
                let mut summary = Summary::default();
                parse_file(&inp, &fmt, delimiter, &mut w, &mut summary)?;
                w.flush().map_err(|e| e.to_string())?;
                Ok::<_, String>(summary)
            })
            .await
            .map_err(|e| PluginError::retryable(e.to_string()))?
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                PluginError::permanent(e)
            })?;
            std::fs::rename(&tmp, &output).map_err(|e| io_err("cannot rename into", &output, e))?;
            let sha = super::params::sha256_file(&output).map_err(|e| io_err("cannot read", &output, e))?;
            call.log.line(&format!("parsed {} rows of {} from {}", summary.rows, format, input.display()));
            let mut out = summary.to_value();
            out["path"] = json!(output);
            out["sha256"] = json!(sha);
            out["format"] = json!(format);
            out["input"] = json!(input);
            Ok(out)
        })
    }
    fn rollback<'a>(&'a self, _call: Call<'a>, output: Option<&'a Value>) -> BoxFuture<'a, Result<(), PluginError>> {
        Box::pin(async move {
            if let Some(path) = output.and_then(|o| o["path"].as_str()) {
                let _ = std::fs::remove_file(path);
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_summary_counts_rows_and_sums_numeric_columns() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.csv");
        std::fs::write(&p, "region,amount\neu,10.5\nus,4\neu,x\n").unwrap();
        let mut out = Vec::new();
        let mut s = Summary::default();
        parse_file(&p, "csv", b',', &mut out, &mut s).unwrap();
        let v = s.to_value();
        assert_eq!(v["rows"], 3);
        assert_eq!(v["columns"], json!(["region", "amount"]));
        // "x" makes amount non-numeric as a whole.
        assert!(v["summary"].get("amount").is_none());
        std::fs::write(&p, "region,amount\neu,10.5\nus,4\n").unwrap();
        let mut s = Summary::default();
        parse_file(&p, "csv", b',', &mut Vec::new(), &mut s).unwrap();
        assert_eq!(
            s.to_value()["summary"]["amount"],
            json!({"count": 2, "sum": 14.5, "min": 4.0, "max": 10.5, "mean": 7.25})
        );
        assert_eq!(String::from_utf8(out).unwrap().lines().count(), 3);
    }

    #[test]
    fn delimiters_are_one_character_or_tab() {
        let p = |d: &str| json!({ "delimiter": d }).as_object().unwrap().clone();
        assert_eq!(delimiter(&p(",")), Ok(b','));
        assert_eq!(delimiter(&p(";")), Ok(b';'));
        assert_eq!(delimiter(&p("tab")), Ok(b'\t'));
        assert!(delimiter(&p(",;")).unwrap_err().contains("not one character"));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s.csv");
        std::fs::write(&f, "region;amount\neu;10\n").unwrap();
        let mut s = Summary::default();
        parse_file(&f, "csv", b';', &mut Vec::new(), &mut s).unwrap();
        assert_eq!(s.to_value()["columns"], json!(["region", "amount"]));
    }
}
