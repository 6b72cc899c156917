//! The event bus: what changed, for subscribers (the socket server forwards
//! it to clients) and for the scheduler's wake-ups.
//!
//! A broadcast channel with a bounded backlog: a subscriber that falls behind
//! loses events and is told so (the server then sends `resync`), rather than
//! slowing the agent.

use apollo_shared::protocol::Event;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::broadcast;

const BACKLOG: usize = 4096;

#[derive(Clone)]
pub struct Bus {
    tx: broadcast::Sender<Arc<Event>>,
    seq: Arc<AtomicU64>,
}

impl Default for Bus {
    fn default() -> Self {
        Bus { tx: broadcast::channel(BACKLOG).0, seq: Arc::new(AtomicU64::new(0)) }
    }
}

impl Bus {
    pub fn publish(&self, topic: &str, kind: &str, data: Value) {
        // The sequence number is taken and the event sent under one order, so
        // subscribers see increasing numbers.
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let _ = self.tx.send(Arc::new(Event { seq, topic: topic.into(), kind: kind.into(), data }));
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// The sequence number of the last event published.
    pub fn seq(&self) -> u64 {
        self.seq.load(Ordering::SeqCst)
    }
}
