//! `agent.stats`: throughput over the last minutes, from the store.

use apollo_shared::protocol::{QueueRate, StatsResult};
use apollo_shared::state::TaskState;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use std::collections::BTreeMap;

/// Folds `(minute, queue, state, count)` rows into per-minute totals,
/// oldest first, and per-queue counts, for the window of `minutes` ending
/// with the minute that holds `now`.
pub fn fold(rows: &[(String, String, String, u64)], minutes: u32, now: DateTime<Utc>) -> StatsResult {
    let until = now.duration_trunc(TimeDelta::minutes(1)).unwrap_or(now);
    let first = until - TimeDelta::minutes(i64::from(minutes) - 1);
    let mut ended = vec![0u64; minutes as usize];
    let mut queues: BTreeMap<&str, QueueRate> = BTreeMap::new();
    for (minute, queue, state, n) in rows {
        let Ok(at) = chrono::NaiveDateTime::parse_from_str(minute, "%Y-%m-%dT%H:%M") else { continue };
        let slot = (at.and_utc() - first).num_minutes();
        if let Some(bucket) = usize::try_from(slot).ok().and_then(|i| ended.get_mut(i)) {
            *bucket += n;
        } else {
            continue;
        }
        let q = queues.entry(queue).or_insert_with(|| QueueRate {
            queue: queue.clone(),
            ended: 0,
            succeeded: 0,
            failed: 0,
            rolled_back: 0,
            per_minute: 0.0,
        });
        q.ended += n;
        match state.parse::<TaskState>() {
            Ok(TaskState::Success) => q.succeeded += n,
            Ok(TaskState::Failed) => q.failed += n,
            Ok(TaskState::RolledBack) => {
                q.failed += n;
                q.rolled_back += n;
            }
            _ => {}
        }
    }
    let queues = queues
        .into_values()
        .map(|mut q| {
            q.per_minute = (q.ended as f64 / f64::from(minutes) * 100.0).round() / 100.0;
            q
        })
        .collect();
    StatsResult { minutes, until, ended, queues }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_fall_into_their_minute_and_queue() {
        let now = "2026-11-30T08:15:32Z".parse::<DateTime<Utc>>().unwrap();
        let row = |m: &str, q: &str, s: &str, n| (m.to_string(), q.to_string(), s.to_string(), n);
        let rows = [
            row("2026-11-30T08:15", "default", "SUCCESS", 2),
            row("2026-11-30T08:14", "default", "FAILED", 1),
            row("2026-11-30T08:13", "default", "ROLLED_BACK", 1),
            row("2026-11-30T07:16", "reports", "SUCCESS", 3),
            row("2026-11-30T07:15", "reports", "SUCCESS", 9), // outside the hour
        ];
        let s = fold(&rows, 60, now);
        assert_eq!(s.ended.len(), 60);
        assert_eq!((s.ended[59], s.ended[58], s.ended[0]), (2, 1, 3));
        assert_eq!(s.ended.iter().sum::<u64>(), 7);
        assert_eq!(
            s.queues.iter().map(|q| (q.queue.as_str(), q.ended)).collect::<Vec<_>>(),
            [("default", 4), ("reports", 3)]
        );
        // A rolled-back instance failed.
        assert_eq!((s.queues[0].succeeded, s.queues[0].failed, s.queues[0].rolled_back), (2, 2, 1));
    }
}
