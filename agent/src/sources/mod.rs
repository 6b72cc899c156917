//! Where events come from besides the socket: message-queue consumers
//! (`events.sources`) and the webhook listener (`events.http`). Each ends
//! in `Triggers::publish`, as `apollo emit` does.
//!
//! Layout:
//! - `nats`: JetStream durable consumers.
//! - `http`: JSON events and Alertmanager notifications over HTTP.

pub mod http;
pub mod nats;

use crate::config::Config;
use crate::shutdown::Shutdown;
use crate::triggers::Triggers;
use std::sync::Arc;

/// Starts every configured source; they stop with `shutdown`. A source that
/// cannot start is logged and raised as an alert; the agent runs on.
pub fn start(config: &Config, triggers: Arc<Triggers>, tasks: &Shutdown) {
    let shutdown = tasks.token();
    for conf in &config.events.sources {
        let source = nats::NatsSource::new(conf.clone(), triggers.clone());
        tasks.spawn(source.run(shutdown.clone()));
    }
    if let Some(conf) = config.events.http.clone() {
        let (t, stop) = (triggers.clone(), shutdown.clone());
        tasks.spawn(async move {
            if let Err(e) = http::serve(conf, t.clone(), stop).await {
                tracing::error!("{e:#}");
                let _ =
                    t.h.store.alert(apollo_shared::protocol::AlertKind::EventSourceDown, &format!("{e:#}"), None).await;
            }
        });
    }
}
