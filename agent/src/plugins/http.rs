//! `http`: one HTTP request; the status must be in `expect_status` (default
//! any 2xx). 5xx, 429 and connection errors are retryable; other statuses
//! are permanent. An optional `rollback` request undoes it.

use super::{check_known, required_str, str_param, Call, ParamDoc, Plugin, PluginError};
use futures::future::BoxFuture;
use serde_json::{json, Map, Value};

pub struct HttpRequest {
    client: reqwest::Client,
}

impl HttpRequest {
    pub fn new() -> Self {
        HttpRequest { client: reqwest::Client::builder().build().unwrap_or_default() }
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

impl HttpRequest {
    async fn send(&self, p: &Map<String, Value>) -> Result<Value, PluginError> {
        let url = p["url"].as_str().unwrap_or_default();
        let method = p.get("method").and_then(Value::as_str).unwrap_or("GET").to_ascii_uppercase();
        let method =
            reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| PluginError::permanent(e.to_string()))?;
        let mut req = self.client.request(method.clone(), url);
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
        let resp = req.send().await.map_err(|e| PluginError::retryable(format!("{method} {url}: {e}")))?;
        let status = resp.status();
        let expected: Vec<u16> = match p.get("expect_status") {
            Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_u64().map(|c| c as u16)).collect(),
            _ => Vec::new(),
        };
        let ok = if expected.is_empty() { status.is_success() } else { expected.contains(&status.as_u16()) };
        let bytes = resp.bytes().await.map_err(|e| PluginError::retryable(format!("{method} {url}: {e}")))?;
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(BODY_BYTES)]).into_owned();
        if !ok {
            let msg = format!("{method} {url}: HTTP {status}: {}", text.chars().take(200).collect::<String>());
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
            let out = self.send(&p).await?;
            call.log.line(&format!("{} -> HTTP {}", p["url"], out["status"]));
            Ok(out)
        })
    }
    fn rollback<'a>(&'a self, _call: Call<'a>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), PluginError>> {
        Box::pin(async move {
            match _call.params.get("rollback") {
                Some(Value::Object(r)) => self.send(r).await.map(|_| ()),
                _ => Ok(()),
            }
        })
    }
}
