//! The event bus: what changed, for subscribers (the socket server forwards
//! it to clients) and for the scheduler's wake-ups.
//!
//! A broadcast channel with a bounded backlog: a subscriber that falls behind
//! loses events and is told so (the server then sends `resync`), rather than
//! slowing the agent.

use crate::shutdown::Shutdown;
use apollo_shared::protocol::{Event, EventData, Raised, Topic};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

const BACKLOG: usize = 4096;

#[derive(Clone)]
pub struct Bus {
    /// Every event, for clients and waits.
    tx: broadcast::Sender<Arc<Event>>,
    /// One topic's events, for the agent's own listeners ([`Bus::each`]):
    /// a listener for alerts does not wake for every step that moves.
    topics: Arc<Mutex<HashMap<Topic, broadcast::Sender<Arc<Event>>>>>,
    /// The last sequence number; held while an event is numbered and sent,
    /// so events reach every subscriber in sequence order.
    seq: Arc<Mutex<u64>>,
}

impl Default for Bus {
    fn default() -> Self {
        Bus { tx: broadcast::channel(BACKLOG).0, topics: Default::default(), seq: Arc::new(Mutex::new(0)) }
    }
}

impl Bus {
    pub fn publish(&self, topic: Topic, data: EventData) {
        let mut seq = self.seq.lock().expect("bus seq");
        *seq += 1;
        let ev = Arc::new(Event { seq: *seq, topic, data });
        if let Some(tx) = self.topics.lock().expect("bus topics").get(&topic) {
            let _ = tx.send(ev.clone());
        }
        let _ = self.tx.send(ev);
    }

    /// Whether anyone listens to `topic` now (an event nobody would read
    /// need not be built).
    pub fn wants(&self, topic: Topic) -> bool {
        self.tx.receiver_count() > 0
            || self.topics.lock().expect("bus topics").get(&topic).is_some_and(|tx| tx.receiver_count() > 0)
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// Calls `f` with the data of every alert published from now on, until
    /// the shutdown (a task in its tracker); alerts missed by falling behind are counted in a warning.
    pub fn each_alert(&self, tasks: &Shutdown, mut f: impl FnMut(&Raised) + Send + 'static) {
        self.each(Topic::Alerts, tasks, move |ev| {
            if let EventData::AlertRaised(alert) = &ev.data {
                f(alert)
            }
        })
    }

    /// Calls `f` with every event on `topic` published from now on, until
    /// the shutdown (a task in its tracker); events missed by falling behind are counted in a warning.
    pub fn each(&self, topic: Topic, tasks: &Shutdown, mut f: impl FnMut(&Event) + Send + 'static) {
        let mut rx = self
            .topics
            .lock()
            .expect("bus topics")
            .entry(topic)
            .or_insert_with(|| broadcast::channel(BACKLOG).0)
            .subscribe();
        let stop = tasks.token();
        tasks.spawn(async move {
            loop {
                let ev = tokio::select! {
                    ev = rx.recv() => ev,
                    _ = stop.cancelled() => return,
                };
                match ev {
                    Ok(ev) if ev.topic == topic => f(&ev),
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, %topic, "a bus listener fell behind");
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }

    /// The sequence number of the last event published.
    pub fn seq(&self) -> u64 {
        *self.seq.lock().expect("bus seq")
    }
}
