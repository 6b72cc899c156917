//! `kind: nats` sources: a durable pull consumer on a JetStream stream.
//!
//! Each message becomes an event — named by its subject, or by the payload
//! field `name_field` — matched to definitions exactly as `apollo emit`
//! events are. A message is acknowledged only after its event and instances
//! are committed; the event's dedup key is the message's `Nats-Msg-Id`, else
//! its stream sequence, so a redelivery (the agent died before the ack)
//! creates nothing twice. A payload that is not a JSON object is kept as an
//! event marked `invalid` (visible in `apollo events`), raised as an alert
//! and acknowledged: it is not retried forever. A store that cannot take the
//! event leaves the message unacknowledged, to come back.
//!
//! The client reconnects by itself (with backoff); a lost connection is raised
//! as `event_source_down`, its return as `event_source_up`, and the backlog is
//! read from where the consumer stood.

use crate::config::SourceConf;
use crate::triggers::Triggers;
use apollo_shared::protocol::{code, PublishParams};
use async_nats::jetstream::{self, consumer::pull, AckKind};
use futures::StreamExt;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The longest wait between two attempts to reach the server.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How much of an invalid payload is kept with its event.
const RAW_KEPT: usize = 4096;

pub struct NatsSource {
    pub conf: SourceConf,
    pub triggers: Arc<Triggers>,
    /// The source is down (alerted once, until it is back).
    down: AtomicBool,
}

/// What became of one message.
enum Outcome {
    /// Committed (or already known): acknowledge.
    Done,
    /// The store could not take it now: let it come back.
    Later(String),
}

fn env_of(var: &Option<String>, what: &str, label: &str) -> anyhow::Result<Option<String>> {
    match var {
        None => Ok(None),
        Some(v) => match std::env::var(v) {
            Ok(s) if !s.is_empty() => Ok(Some(s)),
            _ => anyhow::bail!("{label}: {what} variable {v} is not set in the agent's environment"),
        },
    }
}

impl NatsSource {
    pub fn new(conf: SourceConf, triggers: Arc<Triggers>) -> NatsSource {
        NatsSource { conf, triggers, down: AtomicBool::new(false) }
    }

    fn label(&self) -> String {
        self.conf.label()
    }

    async fn alert(&self, kind: apollo_shared::protocol::AlertKind, message: &str) {
        let _ = self.triggers.h.store.alert(kind, message, None).await;
    }

    /// Raises `event_source_down` once per outage.
    async fn went_down(&self, why: &str) {
        if !self.down.swap(true, Ordering::SeqCst) {
            self.alert(apollo_shared::protocol::AlertKind::EventSourceDown, &format!("{}: {why}", self.label())).await;
        }
    }

    /// Raises `event_source_up` when an outage ends.
    async fn came_up(&self) {
        if self.down.swap(false, Ordering::SeqCst) {
            tracing::info!(source = %self.label(), "connection to {} back", self.conf.url);
            let msg = format!("{}: connection to {} back; reading the backlog", self.label(), self.conf.url);
            self.alert(apollo_shared::protocol::AlertKind::EventSourceUp, &msg).await;
        }
    }

    /// Runs until `shutdown`: connects (retrying), then consumes.
    pub async fn run(self, shutdown: CancellationToken) {
        let label = self.label();
        let mut backoff = Duration::from_millis(250);
        loop {
            match self.session(&shutdown).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(source = %label, "{e:#}; retrying in {backoff:?}");
                    self.went_down(&format!("{e:#}; retrying")).await;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.cancelled() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// One connection's life: returns Ok on shutdown, Err when it must start over.
    async fn session(&self, shutdown: &CancellationToken) -> anyhow::Result<()> {
        let c = &self.conf;
        let label = self.label();
        let (events_tx, mut events_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut opts = async_nats::ConnectOptions::new()
            .name(format!("apollo-agent {}", self.triggers.h.store.agent()))
            .connection_timeout(Duration::from_secs(5))
            .max_reconnects(None)
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis(100u64.saturating_mul(1 << attempts.min(8))).min(MAX_BACKOFF)
            })
            .event_callback(move |ev| {
                let tx = events_tx.clone();
                async move {
                    let _ = tx.send(ev);
                }
            });
        if let Some(t) = env_of(&c.token_env, "token_env", &label)? {
            opts = opts.token(t);
        }
        if let (Some(u), Some(p)) =
            (env_of(&c.user_env, "user_env", &label)?, env_of(&c.password_env, "password_env", &label)?)
        {
            opts = opts.user_and_password(u, p);
        }
        let urls: Vec<&str> = c.url.split(',').map(str::trim).collect();
        let client =
            opts.connect(urls.as_slice()).await.map_err(|e| anyhow::anyhow!("cannot connect to {}: {e}", c.url))?;
        let js = jetstream::new(client);
        let stream =
            js.get_stream(&c.stream).await.map_err(|e| anyhow::anyhow!("stream {:?} on {}: {e}", c.stream, c.url))?;
        let consumer: jetstream::consumer::Consumer<pull::Config> = stream
            .get_or_create_consumer(
                &c.durable,
                pull::Config {
                    durable_name: Some(c.durable.clone()),
                    filter_subject: c.subject.clone().unwrap_or_default(),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: c.ack_wait,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| anyhow::anyhow!("consumer {:?} on stream {:?}: {e}", c.durable, c.stream))?;
        let mut messages = consumer
            .stream()
            .max_messages_per_batch(64)
            .heartbeat(Duration::from_secs(5))
            .messages()
            .await
            .map_err(|e| anyhow::anyhow!("consuming {:?}: {e}", c.stream))?;
        tracing::info!(source = %label, stream = %c.stream, consumer = %c.durable, "consuming events");
        self.came_up().await;
        loop {
            tokio::select! {
                ev = events_rx.recv() => match ev {
                    Some(async_nats::Event::Disconnected) => {
                        tracing::warn!(source = %label, "connection to {} lost; reconnecting", c.url);
                        self.went_down(&format!("connection to {} lost; reconnecting", c.url)).await;
                    }
                    Some(async_nats::Event::Connected) => self.came_up().await,
                    _ => {}
                },
                m = messages.next() => match m {
                    None => anyhow::bail!("the consumer's message stream ended"),
                    Some(Err(e)) if matches!(e.kind(), pull::MessagesErrorKind::MissingHeartbeat) => {
                        tracing::debug!(source = %label, "missed heartbeat: {e}");
                    }
                    Some(Err(e)) => anyhow::bail!("receiving from {:?}: {e}", c.stream),
                    Some(Ok(msg)) => match self.handle(&msg).await {
                        Outcome::Done => {
                            crate::crash_point!("nats.before_ack");
                            if let Err(e) = msg.ack().await {
                                // Redelivered later; its dedup key makes that harmless.
                                tracing::warn!(source = %label, "ack failed: {e}");
                            }
                        }
                        Outcome::Later(why) => {
                            tracing::warn!(source = %label, "event not stored ({why}); the message comes back");
                            let _ = msg.ack_with(AckKind::Nak(Some(Duration::from_secs(2)))).await;
                        }
                    },
                },
                _ = shutdown.cancelled() => return Ok(()),
            }
        }
    }

    /// Turns one message into an event (and its instances).
    async fn handle(&self, msg: &jetstream::Message) -> Outcome {
        let c = &self.conf;
        let seq = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
        let id = msg.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")).map(|v| v.to_string());
        let dedup = match &id {
            Some(id) => format!("nats:{}:id:{id}", c.stream),
            None => format!("nats:{}:seq:{seq}", c.stream),
        };
        let subject = msg.subject.to_string();
        let parsed = match serde_json::from_slice::<Value>(&msg.payload) {
            Ok(v @ Value::Object(_)) => match &c.name_field {
                None => Ok((subject.clone(), v)),
                Some(f) => match f.split('.').try_fold(&v, |v, k| v.get(k)).and_then(Value::as_str) {
                    Some(name) if !name.is_empty() => Ok((name.to_string(), v)),
                    _ => Err(format!("the payload has no string field {f:?} to name the event")),
                },
            },
            Ok(other) => Err(format!("the payload is {}, not a JSON object", apollo_shared::def::kind(&other))),
            Err(e) => Err(format!("the payload is not valid JSON: {e}")),
        };
        let actor = format!("nats:{}", self.label());
        match parsed {
            Ok((name, data)) => {
                let p = PublishParams { name, data: Some(data), dedup_key: Some(dedup.clone()) };
                match self.triggers.publish(p, &actor).await {
                    Ok(_) => Outcome::Done,
                    Err(e) if e.code == code::BUSY || e.code == code::INTERNAL => Outcome::Later(e.message),
                    // A definition refused it (a required parameter, say): kept, not retried.
                    Err(e) => self.reject(&subject, seq, &dedup, &e.message, &msg.payload).await,
                }
            }
            Err(why) => self.reject(&subject, seq, &dedup, &why, &msg.payload).await,
        }
    }

    /// Keeps a message that cannot become work as an event marked invalid.
    async fn reject(&self, subject: &str, seq: u64, dedup: &str, why: &str, payload: &[u8]) -> Outcome {
        let label = self.label();
        let raw = String::from_utf8_lossy(&payload[..payload.len().min(RAW_KEPT)]).into_owned();
        let data = json!({ "invalid": why, "subject": subject, "stream_sequence": seq, "raw": raw });
        let id = self.triggers.new_id();
        let store = &self.triggers.h.store;
        match store.record_event(&id, subject, Some(data), Some(dedup.to_string()), Vec::new()).await {
            Ok(false) => Outcome::Done, // seen before
            Ok(true) => {
                tracing::warn!(source = %label, subject, seq, "message kept as an invalid event: {why}");
                self.alert(
                    apollo_shared::protocol::AlertKind::EventInvalid,
                    &format!("{label}: message {seq} on {subject}: {why} (kept as event {id})"),
                )
                .await;
                Outcome::Done
            }
            Err(e) => Outcome::Later(e.to_string()),
        }
    }
}
