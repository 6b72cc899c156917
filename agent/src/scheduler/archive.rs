//! The archive's two moves, each in small writes: finished instances past
//! `scheduler.retention` into it, and (with `scheduler.archive_retention`)
//! archived ones past that out of it for good.

use super::state::{noted, Scheduler};
use crate::store::Result;
use chrono::{DateTime, Utc};
use std::future::Future;
use std::time::Duration;

/// Instances moved to the archive (or out of it) by one write (see `archive_bench`).
const ARCHIVE_BATCH: usize = 40;

impl Scheduler {
    /// Moves finished instances past the retention window to the archive, in
    /// batches of [`ARCHIVE_BATCH`] (one write each, so a start queued behind
    /// one waits a few milliseconds, not a tenth of a second) and at most
    /// 20,000 per maintenance tick, so it keeps up with any steady rate the
    /// engine reaches. Then deletes archived instances past
    /// `scheduler.archive_retention` (when set) the same way.
    pub(super) async fn archive(&self) {
        let n = self.in_batches(self.config().scheduler.retention, |cut| self.store.archive(cut, ARCHIVE_BATCH)).await;
        if n > 0 {
            tracing::info!(count = n, "archived finished instances past the retention window");
        }
        let Some(keep) = self.config().scheduler.archive_retention else { return };
        let n = self.in_batches(keep, |cut| self.store.expire_archive(cut, ARCHIVE_BATCH)).await;
        if n > 0 {
            tracing::info!(count = n, "deleted archived instances past scheduler.archive_retention");
        }
    }

    /// `write` (of instances that ended before the cut, `window` ago) run
    /// until a batch is short, at most 20,000 instances: how many it did.
    async fn in_batches<F, Fut>(&self, window: Duration, write: F) -> usize
    where
        F: Fn(DateTime<Utc>) -> Fut,
        Fut: Future<Output = Result<usize>>,
    {
        let Ok(window) = chrono::Duration::from_std(window) else { return 0 };
        let mut total = 0;
        for _ in 0..20_000 / ARCHIVE_BATCH {
            match noted(write(Utc::now() - window).await, &self.failing.archive) {
                Some(n) => {
                    total += n;
                    if n < ARCHIVE_BATCH {
                        break;
                    }
                }
                None => break,
            }
        }
        total
    }
}
