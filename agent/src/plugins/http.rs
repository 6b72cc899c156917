//! `http`: one HTTP request; the status must be in `expect_status` (default
//! any 2xx). 5xx, 429 and connection errors are retryable; other statuses
//! are permanent. An optional `rollback` request undoes it.

use super::contract::{Call, ParamDoc, Plugin, PluginError};
use super::params::{check_known, required_str, str_param};
use apollo_shared::def::Masker;
use futures::future::BoxFuture;
use serde_json::{json, Map, Value};

pub struct HttpRequest {
    client: std::sync::OnceLock<reqwest::Client>,
}

/// The lines of a response body the step log keeps.
const LOG_BODY_LINES: usize = 20;

/// The body's first lines to the step log, each masked before it is cut,
/// and how much was left out.
fn log_body(log: &crate::logs::StepLog, text: &str, bytes: usize) {
    let masker = log.masker();
    if bytes == 0 {
        log.line("< (empty body)");
        return;
    }
    log.line("<");
    let lines: Vec<&str> = text.lines().collect();
    for line in lines.iter().take(LOG_BODY_LINES) {
        log.line(&format!("< {}", apollo_shared::text::until(&masker.text(line), 200)));
    }
    if lines.len() > LOG_BODY_LINES || text.len() < bytes {
        log.line(&format!("< … ({bytes} bytes in all)"));
    }
}

impl HttpRequest {
    pub fn new() -> Self {
        HttpRequest { client: std::sync::OnceLock::new() }
    }

    /// The client, made at the first request: building one loads the TLS
    /// roots, which an agent that never sends one should not pay for.
    fn client(&self) -> &reqwest::Client {
        self.client.get_or_init(|| reqwest::Client::builder().build().unwrap_or_default())
    }
}

const PARAMS: &[&str] = &["url", "method", "headers", "body", "expect_status", "rollback"];
/// Response body kept in the output.
const BODY_BYTES: usize = 16 * 1024;

fn check_request(p: &Map<String, Value>, prefix: &str) -> Result<(), String> {
    let url = required_str(p, "url", "https://example.internal/health").map_err(|e| format!("{prefix}{e}"))?;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!("{prefix}url: {url:?} must start with http:// or https://"));
    }
    if let Some(m) = str_param(p, "method")? {
        reqwest::Method::from_bytes(m.to_ascii_uppercase().as_bytes())
            .map_err(|_| format!("{prefix}method: {m:?} is not an HTTP method"))?;
    }
    match p.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(h)) if h.values().all(Value::is_string) => {}
        Some(_) => return Err(format!("{prefix}headers: expected a mapping of header names to strings")),
    }
    Ok(())
}

/// Characters of an error response's text an error carries (the whole
/// response is not kept: an error page would fill every listing).
const ERROR_BODY_CHARS: usize = 300;

/// What an error carries of a response body: its content type, and the
/// start of its text on one line (markup stripped from HTML and XML, the
/// step's secrets masked before it is cut); of a body that is not text,
/// its size.
fn body_summary(content_type: &str, text: &str, bytes: usize, masker: &Masker) -> String {
    let mime = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    let textual = mime.is_empty()
        || mime.starts_with("text/")
        || mime.ends_with("json")
        || mime.ends_with("xml")
        || mime.ends_with("+json")
        || mime.ends_with("+xml");
    let shown = if mime.is_empty() { String::new() } else { format!(" ({mime})") };
    if bytes == 0 {
        return format!("{shown}, empty body");
    }
    if !textual {
        return format!("{shown}, {bytes} bytes");
    }
    let marked_up = mime.contains("html") || mime.ends_with("xml") || text.trim_start().starts_with('<');
    let body = if marked_up { apollo_shared::text::strip_markup(text) } else { text.to_string() };
    format!("{shown}: {}", apollo_shared::text::one_line(&masker.text(&body), ERROR_BODY_CHARS))
}

impl HttpRequest {
    /// Sends the request; what is cut of the response is masked first. The
    /// step log gets the exchange, failed or not: the request line, the
    /// status, the response headers and the body's first lines.
    async fn send(&self, p: &Map<String, Value>, log: &crate::logs::StepLog) -> Result<Value, PluginError> {
        let masker = &log.masker();
        let url = p["url"].as_str().unwrap_or_default();
        let method = p.get("method").and_then(Value::as_str).unwrap_or("GET").to_ascii_uppercase();
        let method =
            reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| PluginError::permanent(e.to_string()))?;
        let mut req = self.client().request(method.clone(), url);
        if let Some(Value::Object(h)) = p.get("headers") {
            for (k, v) in h {
                req = req.header(k, v.as_str().unwrap_or_default());
            }
        }
        req = match p.get("body") {
            None | Some(Value::Null) => req,
            Some(Value::String(s)) => req.body(s.clone()),
            Some(v) => req.json(v),
        };
        log.line(&format!("> {method} {url}"));
        let resp = req.send().await.map_err(|e| {
            let msg = format!("{method} {url}: {e}");
            log.line(&format!("! {msg}"));
            PluginError::retryable(msg)
        })?;
        let status = resp.status();
        log.line(&format!("< HTTP {status}"));
        for (name, value) in resp.headers() {
            log.line(&format!("< {name}: {}", String::from_utf8_lossy(value.as_bytes())));
        }
        let expected: Vec<u16> = match p.get("expect_status") {
            Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_u64().map(|c| c as u16)).collect(),
            _ => Vec::new(),
        };
        let ok = if expected.is_empty() { status.is_success() } else { expected.contains(&status.as_u16()) };
        let content_type =
            resp.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let bytes = resp.bytes().await.map_err(|e| PluginError::retryable(format!("{method} {url}: {e}")))?;
        let text = match bytes.len() > BODY_BYTES && !masker.is_empty() {
            // Cut (so no JSON): masked first, a secret's value across the cut whole.
            true => {
                let kept = &bytes[..bytes.len().min(BODY_BYTES + masker.longest())];
                masker.head(&String::from_utf8_lossy(kept), BODY_BYTES, kept.len() < bytes.len())
            }
            false => String::from_utf8_lossy(&bytes[..bytes.len().min(BODY_BYTES)]).into_owned(),
        };
        log_body(log, &text, bytes.len());
        if !ok {
            let summary = body_summary(&content_type, &text, bytes.len(), masker);
            let msg = format!("{method} {url}: HTTP {status}{summary}");
            let retry = status.is_server_error() || status.as_u16() == 429;
            return Err(if retry { PluginError::retryable(msg) } else { PluginError::permanent(msg) });
        }
        let body = serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text));
        Ok(json!({"status": status.as_u16(), "body": body, "bytes": bytes.len()}))
    }
}

impl Plugin for HttpRequest {
    fn name(&self) -> &str {
        "http"
    }
    fn version(&self) -> semver::Version {
        semver::Version::new(1, 0, 0)
    }
    fn description(&self) -> &str {
        "Sends one HTTP request and checks its status"
    }
    fn idempotent(&self) -> bool {
        false
    }
    fn outputs(&self) -> Option<Vec<String>> {
        Some(["status", "body", "bytes"].map(String::from).to_vec())
    }
    fn params(&self) -> Vec<ParamDoc> {
        vec![
            ParamDoc { name: "url", kind: "url", required: true, description: "http:// or https://" },
            ParamDoc { name: "method", kind: "string", required: false, description: "default GET" },
            ParamDoc { name: "headers", kind: "map", required: false, description: "request headers" },
            ParamDoc { name: "body", kind: "string|json", required: false, description: "request body" },
            ParamDoc {
                name: "expect_status",
                kind: "list",
                required: false,
                description: "accepted statuses (default 2xx)",
            },
            ParamDoc {
                name: "rollback",
                kind: "map",
                required: false,
                description: "a request (url, method, headers, body) that undoes this one",
            },
        ]
    }
    fn check_params(&self, p: &Map<String, Value>) -> Result<(), String> {
        check_known(p, PARAMS)?;
        check_request(p, "")?;
        match p.get("rollback") {
            None | Some(Value::Null) => Ok(()),
            Some(Value::Object(r)) => check_request(r, "rollback."),
            Some(_) => Err("rollback: expected a mapping with url, method, headers, body".into()),
        }
    }
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, PluginError>> {
        Box::pin(async move {
            let mut p = call.params.clone();
            let mut headers = p.get("headers").cloned().unwrap_or_else(|| json!({}));
            headers["Idempotency-Key"] = json!(call.idempotency_key);
            p.insert("headers".into(), headers);
            self.send(&p, call.log).await
        })
    }
    fn cannot_undo(&self, p: &Map<String, Value>) -> Option<String> {
        (!matches!(p.get("rollback"), Some(Value::Object(_)))).then(|| "no rollback request".to_string())
    }
    fn rollback<'a>(&'a self, _call: Call<'a>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), PluginError>> {
        Box::pin(async move {
            match _call.params.get("rollback") {
                Some(Value::Object(r)) => self.send(r, _call.log).await.map(|_| ()),
                _ => Ok(()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::body_summary;
    use apollo_shared::def::Masker;

    #[test]
    fn an_error_body_is_summed_up_on_one_line() {
        let none = Masker::default();
        let page = "<!DOCTYPE html>\n<html><head><title>501 Not Implemented</title></head>\n<body><h1>Not Implemented</h1>\n</body></html>\n";
        assert_eq!(
            body_summary("text/html; charset=utf-8", page, page.len(), &none),
            " (text/html): 501 Not Implemented Not Implemented"
        );
        assert_eq!(
            body_summary("application/json", "{\"error\":\"no\"}", 14, &none),
            " (application/json): {\"error\":\"no\"}"
        );
        assert_eq!(
            body_summary("application/octet-stream", "\u{1}", 9000, &none),
            " (application/octet-stream), 9000 bytes"
        );
        assert_eq!(body_summary("", "", 0, &none), ", empty body");
        assert!(body_summary("text/plain", &"word ".repeat(400), 2000, &none).chars().count() < 330);
        // A secret is masked before the text is cut.
        let m = Masker::new(["s3cr3t-at-the-cut".to_string()]);
        let body = format!("{}s3cr3t-at-the-cut", "e".repeat(290));
        assert_eq!(body_summary("text/plain", &body, body.len(), &m), format!(" (text/plain): {}***", "e".repeat(290)));
    }
}
