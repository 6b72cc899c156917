//! `GET /metrics` over HTTP, on the address `metrics.listen` names, and the
//! scrape that reads the queue gauges from the store first.

use crate::handles::Handles;
use crate::metrics;
use std::collections::BTreeMap;

/// The text, with the per-queue gauges read from the store now (every queue
/// a definition or the config names, idle ones at 0).
pub async fn scrape(s: &Handles) -> String {
    if let Ok(stats) = s.store.queue_stats().await {
        let mut queues: BTreeMap<String, (u64, u64)> =
            s.catalog.read().expect("catalog").defs.values().map(|l| (l.def.queue.clone(), (0, 0))).collect();
        queues.extend(s.config().scheduler.queues.keys().map(|q| (q.clone(), (0, 0))));
        for st in stats {
            queues.insert(st.queue.clone(), (st.pending + st.retrying, st.running));
        }
        metrics::set_queues(queues.into_iter().map(|(q, (p, r))| (q, p, r)));
    }
    metrics::get().text()
}

/// Serves `GET /metrics` on `addr` until `shutdown`.
pub async fn serve(
    addr: std::net::SocketAddr,
    scheduler: Handles,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    use http_body_util::Full;
    use hyper::body::Bytes;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("metrics.listen {addr}: cannot listen: {e}"))?;
    tracing::info!(%addr, "serving metrics at /metrics");
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r { Ok(s) => s, Err(_) => continue },
            _ = shutdown.cancelled() => return Ok(()),
        };
        let scheduler = scheduler.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let scheduler = scheduler.clone();
                async move {
                    let resp = if req.uri().path() == "/metrics" {
                        // OpenMetrics to whoever asks for it (Prometheus
                        // does), the classic text to everyone else.
                        let open = req
                            .headers()
                            .get(hyper::header::ACCEPT)
                            .and_then(|a| a.to_str().ok())
                            .is_some_and(|a| a.contains("application/openmetrics-text"));
                        let text = scrape(&scheduler).await;
                        let (kind, body) = if open {
                            (metrics::OPENMETRICS, text)
                        } else {
                            (metrics::PROMETHEUS_TEXT, metrics::classic(&text))
                        };
                        hyper::Response::builder().header("content-type", kind).body(Full::new(Bytes::from(body)))
                    } else {
                        hyper::Response::builder().status(404).body(Full::new(Bytes::from("see /metrics\n")))
                    };
                    Ok::<_, hyper::http::Error>(resp.expect("a valid response"))
                }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
        });
    }
}

/// Serves metrics on the address `metrics.listen` names, following SIGHUP: a
/// changed address closes the old listener and opens the new one, none stops
/// serving. An address that cannot be had is logged and raised as an alert;
/// the agent runs on.
pub async fn follow(scheduler: Handles, shutdown: tokio_util::sync::CancellationToken) {
    let mut changes = scheduler.settings.subscribe();
    loop {
        let addr = changes.borrow_and_update().metrics.listen;
        let stop = shutdown.child_token();
        let server = addr.map(|addr| {
            let (scheduler, stop) = (scheduler.clone(), stop.clone());
            tokio::spawn(async move {
                if let Err(e) = serve(addr, scheduler.clone(), stop).await {
                    tracing::error!("{e:#}");
                    let _ = scheduler
                        .store
                        .alert(apollo_shared::protocol::AlertKind::MetricsError, &format!("{e:#}"), None)
                        .await;
                }
            })
        });
        let stopping = loop {
            tokio::select! {
                r = changes.changed() => match r {
                    Ok(()) if changes.borrow().metrics.listen == addr => continue,
                    Ok(()) => break false,
                    Err(_) => break true,
                },
                _ = shutdown.cancelled() => break true,
            }
        };
        stop.cancel();
        if let Some(s) = server {
            let _ = s.await;
        }
        if stopping {
            return;
        }
    }
}
