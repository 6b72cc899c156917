//! An error that repeats is logged once, then as a count while it lasts,
//! and once more when it changes or clears: an outage of the store reads as
//! a few lines that matter, not five hundred copies of one.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a repeating error's count is logged while it lasts.
const SUMMARY_EVERY: Duration = Duration::from_secs(60);

struct Failing {
    message: String,
    count: u64,
    since: Instant,
    reported: Instant,
}

/// The state of one thing that can fail again and again (a schedule read,
/// the lease renewal), named by `what` in each line.
pub struct Repeats {
    what: &'static str,
    failing: Mutex<Option<Failing>>,
}

impl Repeats {
    pub const fn new(what: &'static str) -> Repeats {
        Repeats { what, failing: Mutex::new(None) }
    }

    /// Another failure: logged if it is the first or a different one, and
    /// every [`SUMMARY_EVERY`] as a count while it repeats. Returns how many
    /// times in a row it has failed.
    pub fn failed(&self, error: &dyn std::fmt::Display) -> u64 {
        let message = error.to_string();
        let now = Instant::now();
        let mut f = self.failing.lock().expect("repeats");
        let what = self.what;
        match f.as_mut() {
            None => {
                tracing::error!(error = %message, "{what}");
                *f = Some(Failing { message, count: 1, since: now, reported: now });
                1
            }
            Some(cur) if cur.message == message => {
                cur.count += 1;
                if now - cur.reported >= SUMMARY_EVERY {
                    cur.reported = now;
                    let secs = (now - cur.since).as_secs();
                    tracing::warn!(error = %message, times = cur.count, "{what}: still failing, {} times in {secs}s", cur.count);
                }
                cur.count
            }
            Some(cur) => {
                let secs = (now - cur.since).as_secs();
                tracing::error!(
                    error = %message,
                    "{what} (the error changed; the one before came {} times in {secs}s: {})",
                    cur.count,
                    cur.message
                );
                *cur = Failing { message, count: 1, since: now, reported: now };
                1
            }
        }
    }

    /// It worked: when it had been failing, that is logged once, with how
    /// long and how often.
    pub fn ok(&self) {
        if let Some(cur) = self.failing.lock().expect("repeats").take() {
            let secs = cur.since.elapsed().as_secs();
            tracing::info!("{}: works again, after {} failures over {secs}s", self.what, cur.count);
        }
    }
}
