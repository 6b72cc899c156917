//! The webhook listener (`events.http`): `POST /events` takes an event as
//! `apollo emit` sends it (`{"name", "data", "dedup_key"}`); `POST
//! /alertmanager` takes Prometheus Alertmanager's webhook notification, each
//! alert becoming an event named after its `alertname` (`<alertname>.resolved`
//! once resolved) with its labels and annotations in the payload.
//!
//! A firing alert starts its task once per firing: Alertmanager repeats
//! notifications, so the dedup key is the alert's fingerprint, status and
//! start time.

use crate::config::HttpEventsConf;
use crate::triggers::Triggers;
use apollo_shared::protocol::{code, PublishParams, RpcError};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;

const PATHS: &str = "POST /events or POST /alertmanager";

struct Listener {
    triggers: Arc<Triggers>,
    token: Option<String>,
    max_body: usize,
}

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, body: Value) -> Reply {
    let mut text = serde_json::to_vec(&body).unwrap_or_default();
    text.push(b'\n');
    let mut r = Response::builder().status(status).header("content-type", "application/json");
    if status == StatusCode::UNAUTHORIZED {
        r = r.header("www-authenticate", "Bearer");
    }
    if status == StatusCode::METHOD_NOT_ALLOWED {
        r = r.header("allow", "POST");
    }
    r.body(Full::new(Bytes::from(text))).expect("a valid response")
}

fn refuse(status: StatusCode, message: impl Into<String>) -> Reply {
    reply(status, json!({ "error": message.into() }))
}

/// Compares without stopping at the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn rpc_status(e: &RpcError) -> StatusCode {
    match e.code {
        code::INVALID_PARAMS | code::VALIDATION_FAILED => StatusCode::BAD_REQUEST,
        code::BUSY => StatusCode::SERVICE_UNAVAILABLE,
        code::NOT_FOUND => StatusCode::NOT_FOUND,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The events one Alertmanager notification carries.
pub fn alertmanager_events(body: &Value) -> Result<Vec<PublishParams>, String> {
    let alerts = body.get("alerts").and_then(Value::as_array).ok_or(
        "expected Alertmanager's webhook payload: an object with \"alerts\": [{\"status\", \"labels\": {\"alertname\"}, …}]",
    )?;
    let mut out = Vec::new();
    for (i, a) in alerts.iter().enumerate() {
        let labels = a.get("labels").and_then(Value::as_object).ok_or(format!("alerts[{i}]: no labels object"))?;
        let name = labels
            .get("alertname")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or(format!("alerts[{i}]: no labels.alertname"))?;
        let status = a.get("status").and_then(Value::as_str).unwrap_or("firing");
        if status != "firing" && status != "resolved" {
            return Err(format!("alerts[{i}].status: {status:?} (expected firing or resolved)"));
        }
        let str_of = |k: &str| a.get(k).cloned().unwrap_or(Value::Null);
        let data = json!({
            "alertname": name,
            "status": status,
            "labels": labels,
            "annotations": a.get("annotations").cloned().unwrap_or_else(|| json!({})),
            "starts_at": str_of("startsAt"),
            "ends_at": str_of("endsAt"),
            "fingerprint": str_of("fingerprint"),
            "generator_url": str_of("generatorURL"),
            "receiver": body.get("receiver").cloned().unwrap_or(Value::Null),
            "external_url": body.get("externalURL").cloned().unwrap_or(Value::Null),
        });
        let dedup_key = a.get("fingerprint").and_then(Value::as_str).map(|fp| {
            format!("alertmanager:{fp}:{status}:{}", a.get("startsAt").and_then(Value::as_str).unwrap_or(""))
        });
        let name = if status == "resolved" { format!("{name}.resolved") } else { name.to_string() };
        out.push(PublishParams { name, data: Some(data), dedup_key });
    }
    Ok(out)
}

impl Listener {
    async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Reply {
        let path = req.uri().path().to_string();
        if path != "/events" && path != "/alertmanager" {
            return refuse(StatusCode::NOT_FOUND, format!("no such path {path:?} (expected {PATHS})"));
        }
        if req.method() != Method::POST {
            return refuse(StatusCode::METHOD_NOT_ALLOWED, format!("{} {path}: expected {PATHS}", req.method()));
        }
        if let Some(token) = &self.token {
            let given = req.headers().get(hyper::header::AUTHORIZATION).map(|v| v.as_bytes());
            match given.and_then(|v| v.strip_prefix(b"Bearer ")) {
                None => {
                    return refuse(StatusCode::UNAUTHORIZED, "missing bearer token (send Authorization: Bearer TOKEN)")
                }
                Some(t) if !same(t, token.as_bytes()) => {
                    return refuse(StatusCode::FORBIDDEN, "wrong bearer token");
                }
                Some(_) => {}
            }
        }
        let too_big = || {
            refuse(StatusCode::PAYLOAD_TOO_LARGE, format!("the body is larger than the {} byte limit", self.max_body))
        };
        let declared = req
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > self.max_body) {
            return too_big();
        }
        let body = match Limited::new(req.into_body(), self.max_body).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => return too_big(),
            Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("cannot read the body: {e}")),
        };
        let value: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("the body is not valid JSON: {e}")),
        };
        let actor = format!("webhook:{}", peer.ip());
        let events = if path == "/events" {
            match serde_json::from_value::<PublishParams>(value) {
                Ok(p) => vec![p],
                Err(e) => {
                    return refuse(
                        StatusCode::BAD_REQUEST,
                        format!("expected {{\"name\": EVENT, \"data\": {{…}}, \"dedup_key\": KEY}}: {e}"),
                    )
                }
            }
        } else {
            match alertmanager_events(&value) {
                Ok(e) => e,
                Err(e) => return refuse(StatusCode::BAD_REQUEST, e),
            }
        };
        let mut results = Vec::new();
        for p in events {
            let name = p.name.clone();
            match self.triggers.publish(p, &actor).await {
                Ok(r) => {
                    let mut r = json!(r);
                    r["name"] = json!(name);
                    results.push(r);
                }
                Err(e) => {
                    let status = rpc_status(&e);
                    let mut body = json!({ "error": e.message, "event": name, "accepted": results });
                    if let Some(h) = e.hint() {
                        body["hint"] = json!(h);
                    }
                    return reply(status, body);
                }
            }
        }
        if path == "/events" {
            reply(StatusCode::OK, results.pop().unwrap_or(Value::Null))
        } else {
            reply(StatusCode::OK, json!({ "events": results }))
        }
    }
}

/// Serves the listener until `shutdown`. The token is read from its
/// variable once, at start.
pub async fn serve(
    conf: HttpEventsConf,
    triggers: Arc<Triggers>,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let token = match &conf.token_env {
        Some(var) => match std::env::var(var) {
            Ok(t) if !t.is_empty() => Some(t),
            _ => anyhow::bail!(
                "events.http: the token variable {var} is not set (or empty) in the agent's environment; \
                 no webhook is accepted until it is set and the agent restarted"
            ),
        },
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(conf.listen)
        .await
        .map_err(|e| anyhow::anyhow!("events.http.listen {}: cannot listen: {e}", conf.listen))?;
    tracing::info!(addr = %conf.listen, "accepting events at POST /events and /alertmanager");
    let this = Arc::new(Listener { triggers, token, max_body: conf.max_body });
    let tracker = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r { Ok(s) => s, Err(_) => continue },
            _ = shutdown.cancelled() => break,
        };
        let this = this.clone();
        tracker.spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let this = this.clone();
                async move { Ok::<_, std::convert::Infallible>(this.handle(req, peer).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
        });
    }
    tracker.close();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alertmanager_alerts_become_events_once_per_firing() {
        let body = json!({
            "version": "4", "status": "firing", "receiver": "apollo",
            "alerts": [
                {"status": "firing", "labels": {"alertname": "DiskFull", "host": "db1"},
                 "annotations": {"summary": "disk"}, "startsAt": "2026-11-30T08:00:00Z", "fingerprint": "abc"},
                {"status": "resolved", "labels": {"alertname": "DiskFull", "host": "db2"},
                 "startsAt": "2026-11-30T07:00:00Z", "fingerprint": "def"}
            ]
        });
        let events = alertmanager_events(&body).unwrap();
        assert_eq!(events[0].name, "DiskFull");
        assert_eq!(events[0].data.as_ref().unwrap()["labels"]["host"], "db1");
        assert_eq!(events[0].dedup_key.as_deref(), Some("alertmanager:abc:firing:2026-11-30T08:00:00Z"));
        assert_eq!(events[1].name, "DiskFull.resolved");
        assert!(alertmanager_events(&json!({"alerts": [{"labels": {}}]})).unwrap_err().contains("alertname"));
        assert!(alertmanager_events(&json!({"name": "x"})).unwrap_err().contains("Alertmanager"));
    }
}
