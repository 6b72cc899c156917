//! The files an instance leaves on the hosts that ran it end with it: its
//! work directory (`<data dir>/work/<id>`) once it has left the hot store
//! (archived, no step of it can run again), its step logs
//! (`<data dir>/logs/<id>/`) once it has left the archive too
//! (`scheduler.archive_retention`), so `apollo logs` reads an archived
//! instance's logs as long as `apollo show` finds it.
//!
//! A sweep of both directories, at most once a minute (as often as the
//! retention under a shorter one), asks the store about every entry named
//! by an instance id older than the retention — a younger instance cannot
//! have left — and removes what is gone. Being a sweep, it removes the
//! files of instances another agent of a shared store archived or deleted,
//! and those an earlier release left behind; it runs beside the loop, and
//! removes at most [`PER_PASS`] entries a pass.

use super::Scheduler;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest time between two sweeps.
const EVERY: Duration = Duration::from_secs(60);
/// Entries removed by one sweep at most (the rest wait for the next).
const PER_PASS: usize = 10_000;
/// Ids asked of the store in one read.
const ASK: usize = 500;

impl Scheduler {
    /// Starts a sweep beside the loop when one is due and none runs.
    pub(super) fn sweep_leftovers(self: &Arc<Self>) {
        let retention = self.config().scheduler.retention;
        {
            let mut last = self.sweeps.last.lock().expect("sweeps");
            if last.is_some_and(|t| t.elapsed() < retention.min(EVERY)) {
                return;
            }
            if self.sweeps.running.swap(true, Ordering::SeqCst) {
                return;
            }
            *last = Some(Instant::now());
        }
        let s = self.clone();
        tokio::spawn(async move {
            let removed = s.sweep(retention).await;
            s.sweeps.running.store(false, Ordering::SeqCst);
            if removed > 0 {
                tracing::info!(count = removed, "removed the work directories and logs of instances that have left");
            }
        });
    }

    /// One sweep: how many entries it removed.
    async fn sweep(&self, retention: Duration) -> usize {
        // A retention past the clock's range: nothing is old enough.
        let cut = chrono::Duration::from_std(retention).ok().and_then(|r| chrono::Utc::now().checked_sub_signed(r));
        let cut = cut.and_then(|t| u64::try_from(t.timestamp_millis()).ok()).unwrap_or(0);
        let (work, logs) = (self.data_dir.join("work"), self.data_dir.join("logs"));
        let listed = tokio::task::spawn_blocking(move || (older_than(&work, cut), older_than(&logs, cut)));
        let Ok((work, logs)) = listed.await else { return 0 };
        // Each id with its work directory and its logs, where it has them.
        let mut left: BTreeMap<String, [Option<PathBuf>; 2]> = BTreeMap::new();
        for (k, found) in [work, logs].into_iter().enumerate() {
            for (id, path) in found {
                left.entry(id).or_default()[k] = Some(path);
            }
        }
        let ids: Vec<String> = left.keys().cloned().collect();
        let mut gone = Vec::new();
        for chunk in ids.chunks(ASK) {
            let kept = match self.store.kept(chunk.to_vec()).await {
                Ok(k) => k,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot sweep the files of instances that have left");
                    return 0;
                }
            };
            for id in chunk {
                let [work, logs] = left.remove(id).unwrap_or_default();
                // A work directory ends with the hot instance; logs with the archived one.
                if !kept.hot.contains(id) {
                    gone.extend(work);
                    if !kept.archived.contains(id) {
                        gone.extend(logs);
                    }
                }
            }
            if gone.len() >= PER_PASS {
                break;
            }
        }
        gone.truncate(PER_PASS);
        tokio::task::spawn_blocking(move || {
            gone.iter()
                .filter(|p| match std::fs::remove_dir_all(p) {
                    Ok(()) => true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                    Err(e) => {
                        tracing::warn!(path = %p.display(), error = %e, "cannot remove what an instance left");
                        false
                    }
                })
                .count()
        })
        .await
        .unwrap_or(0)
    }
}

/// The entries of `dir` named by an instance id made before `cut` (ms
/// since the epoch), with their paths; other names (`work/dry-run`) are
/// never touched.
fn older_than(dir: &Path, cut: u64) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().into_string().ok()?;
            let made = ulid::Ulid::from_string(&name).ok()?.timestamp_ms();
            (made < cut).then(|| (name, e.path()))
        })
        .collect()
}
