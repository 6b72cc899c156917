//! The wall clock, behind a trait so the cron runner can be driven by a
//! manual clock in tests (no real minute-long waits).

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use std::sync::Mutex;
use tokio::sync::Notify;

pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
    /// Resolves once `now() >= t`.
    fn sleep_until(&self, t: DateTime<Utc>) -> BoxFuture<'_, ()>;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
    fn sleep_until(&self, t: DateTime<Utc>) -> BoxFuture<'_, ()> {
        // Sleep in bounded slices so a wall clock that jumps is noticed.
        Box::pin(async move {
            loop {
                let left = (t - Utc::now()).to_std().unwrap_or_default();
                if left.is_zero() {
                    return;
                }
                tokio::time::sleep(left.min(std::time::Duration::from_secs(60))).await;
            }
        })
    }
}

/// A clock that moves only when told to.
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
    moved: Notify,
}

impl ManualClock {
    pub fn new(t: DateTime<Utc>) -> Self {
        ManualClock { now: Mutex::new(t), moved: Notify::new() }
    }
    pub fn set(&self, t: DateTime<Utc>) {
        *self.now.lock().expect("clock") = t;
        self.moved.notify_waiters();
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().expect("clock")
    }
    fn sleep_until(&self, t: DateTime<Utc>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            loop {
                let moved = self.moved.notified();
                if self.now() >= t {
                    return;
                }
                moved.await;
            }
        })
    }
}
