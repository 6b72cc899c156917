//! The archive's two moves, each in small writes: finished instances past
//! `scheduler.retention` into it, and (with `scheduler.archive_retention`)
//! archived ones past that out of it for good.

use super::state::{noted, Scheduler};
use chrono::Utc;

/// Instances moved to the archive (or out of it) by one write (see `archive_bench`).
const ARCHIVE_BATCH: usize = 40;

impl Scheduler {
    /// Moves finished instances past the retention window to the archive, in
    /// batches of [`ARCHIVE_BATCH`] (one write each, so a start queued behind
    /// one waits a few milliseconds, not a tenth of a second) and at most
    /// 20,000 per maintenance tick, so it keeps up with any steady rate the
    /// engine reaches.
    pub(super) async fn archive(&self) {
        let Ok(window) = chrono::Duration::from_std(self.config().scheduler.retention) else { return };
        let mut total = 0;
        for _ in 0..20_000 / ARCHIVE_BATCH {
            match noted(self.store.archive(Utc::now() - window, ARCHIVE_BATCH).await, &self.failing.archive) {
                Some(n) => {
                    total += n;
                    if n < ARCHIVE_BATCH {
                        break;
                    }
                }
                None => break,
            }
        }
        if total > 0 {
            tracing::info!(count = total, "archived finished instances past the retention window");
        }
        self.expire().await;
    }

    /// Deletes archived instances past `scheduler.archive_retention` (when
    /// set), in the same small batches, at most 20,000 a tick.
    async fn expire(&self) {
        let Some(keep) = self.config().scheduler.archive_retention else { return };
        let Ok(window) = chrono::Duration::from_std(keep) else { return };
        let mut total = 0;
        for _ in 0..20_000 / ARCHIVE_BATCH {
            match noted(self.store.expire_archive(Utc::now() - window, ARCHIVE_BATCH).await, &self.failing.archive) {
                Some(n) => {
                    total += n;
                    if n < ARCHIVE_BATCH {
                        break;
                    }
                }
                None => break,
            }
        }
        if total > 0 {
            tracing::info!(count = total, "deleted archived instances past scheduler.archive_retention");
        }
    }
}
