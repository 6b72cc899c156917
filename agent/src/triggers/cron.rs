//! Scheduled triggers. Each definition with `schedule:` fires in its
//! `timezone:` (default: the agent's local zone). The last fire of each task
//! is stored, so after downtime the missed fires are known and the task's
//! `catchup:` policy decides which run. Every fire creates its instance with
//! the dedup key `cron:<task>:<fire time>`, so a fire is never created twice —
//! not across restarts, not when the clock goes back.

use super::clock::Clock;
use super::{Request, Triggers};
use crate::catalog::Loaded;
use crate::repeats::Repeats;
use apollo_shared::cron::{self, Fire};
use apollo_shared::def::Catchup;
use chrono::{DateTime, Utc};
use serde_json::Map;
use std::sync::Arc;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A fire this close to now is on time; older ones were missed.
const ON_TIME: chrono::Duration = chrono::Duration::seconds(60);

fn in_zone(l: &Loaded, after: DateTime<Utc>, until: DateTime<Utc>, max: usize) -> Vec<Fire> {
    let Some(Ok(c)) = l.def.schedule.as_deref().map(cron::parse) else { return Vec::new() };
    match l.def.timezone.as_deref().and_then(|t| t.parse::<chrono_tz::Tz>().ok()) {
        Some(tz) => cron::fires_between(&c, &tz, after, until, max),
        None => cron::fires_between(&c, &chrono::Local, after, until, max),
    }
}

/// The first fire of a definition after `after`.
pub fn next_fire(l: &Loaded, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let c = cron::parse(l.def.schedule.as_deref()?).ok()?;
    let f = match l.def.timezone.as_deref().and_then(|t| t.parse::<chrono_tz::Tz>().ok()) {
        Some(tz) => cron::next_after(&c, &tz, after),
        None => cron::next_after(&c, &chrono::Local, after),
    };
    f.map(|f| f.at)
}

/// Which of the due fires run, by policy: on-time fires always run; of the
/// missed ones, `skip` runs none, `latest` the most recent (when no on-time
/// fire runs), `all` every one (the caller bounds how many are due).
pub fn plan(policy: Catchup, due: &[Fire], now: DateTime<Utc>) -> Vec<Fire> {
    let (on_time, missed): (Vec<Fire>, Vec<Fire>) = due.iter().cloned().partition(|f| now - f.at <= ON_TIME);
    match policy {
        Catchup::Skip => on_time,
        Catchup::Latest if on_time.is_empty() => missed.last().cloned().into_iter().collect(),
        Catchup::Latest => on_time,
        Catchup::All => due.to_vec(),
    }
}

pub struct CronRunner {
    pub triggers: Arc<Triggers>,
    pub clock: Arc<dyn Clock>,
    /// Notified when definitions were reloaded.
    pub reloaded: Arc<Notify>,
    /// The schedule state's reads while they fail: logged once, then as a
    /// count; and the time before which none is tried again.
    pub reads: Repeats,
    pub retry: std::sync::Mutex<Option<(DateTime<Utc>, std::time::Duration)>>,
}

/// The first pause after the schedule state could not be read, and the
/// longest (it doubles while reads fail): however often the runner is woken
/// meanwhile (reloads, clock jumps), the store is not asked before.
const READ_RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
const READ_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(60);

impl CronRunner {
    pub fn new(triggers: Arc<Triggers>, clock: Arc<dyn Clock>, reloaded: Arc<Notify>) -> CronRunner {
        CronRunner {
            triggers,
            clock,
            reloaded,
            reads: Repeats::new("cannot read the schedule state"),
            retry: std::sync::Mutex::new(None),
        }
    }

    /// Fires whatever is due now; returns when the next fire is.
    pub async fn tick(&self) -> Option<DateTime<Utc>> {
        let now = self.clock.now();
        let store = &self.triggers.h.store;
        let waiting = *self.retry.lock().expect("cron retry");
        if let Some((at, _)) = waiting.filter(|(at, _)| now < *at) {
            return Some(at);
        }
        let last_fires = match store.cron_state().await {
            Ok(s) => {
                self.reads.ok();
                self.retry.lock().expect("cron retry").take();
                s
            }
            Err(e) => {
                self.reads.failed(&e);
                let pause = waiting.map_or(READ_RETRY_FIRST, |(_, p)| (p * 2).min(READ_RETRY_MAX));
                let at = now + chrono::Duration::from_std(pause).unwrap_or_default();
                *self.retry.lock().expect("cron retry") = Some((at, pause));
                return Some(at);
            }
        };
        let scheduled: Vec<Loaded> = self
            .triggers
            .h
            .catalog
            .read()
            .expect("catalog")
            .defs
            .values()
            .filter(|l| l.def.schedule.is_some())
            .cloned()
            .collect();
        // Most missed fires run by `catchup: all`.
        let catchup_max = self.triggers.h.config().scheduler.catchup_max;
        let mut next: Option<DateTime<Utc>> = None;
        for l in scheduled {
            let task = l.def.task.clone();
            let last = match last_fires.get(&task) {
                Some(t) => *t,
                None => {
                    // First sight of this schedule: it fires from now on.
                    let _ = store.set_cron_fire(&task, now).await;
                    now
                }
            };
            if now < last {
                tracing::warn!(task = %task, last_fire = %last, now = %now, "the clock went back; the schedule resumes after its last fire");
            }
            let due = in_zone(&l, last, now, catchup_max.max(1));
            if let Some(newest) = due.last() {
                let run = plan(l.def.catchup, &due, now);
                if run.len() < due.len() || due.len() > 1 {
                    tracing::warn!(
                        task = %task, due = due.len(), running = run.len(), policy = ?l.def.catchup,
                        "fires were missed (agent down or clock jumped); catch-up policy applied"
                    );
                }
                let mut failed = false;
                for f in &run {
                    if let Some(note) = &f.note {
                        tracing::warn!(task = %task, "{note}");
                    }
                    let r = self
                        .triggers
                        .create(Request {
                            task: task.clone(),
                            params: Map::new(),
                            dedup_key: Some(format!("cron:{task}:{}", f.at.to_rfc3339())),
                            trigger: format!("cron {}", f.at.to_rfc3339()),
                            actor: "scheduler".into(),
                            event: None,
                            trace_id: None,
                        })
                        .await;
                    if let Err(e) = r {
                        // The fire stays unmarked and is tried again shortly: a
                        // fire is never lost to a store that refused a write.
                        tracing::error!(task = %task, error = %e, "scheduled trigger failed; it is tried again in 5s");
                        failed = true;
                        break;
                    }
                }
                if failed {
                    let again = now + chrono::Duration::seconds(5);
                    next = Some(next.map_or(again, |x| x.min(again)));
                    continue;
                }
                if let Err(e) = store.set_cron_fire(&task, newest.at).await {
                    tracing::error!(task = %task, error = %e, "cannot record the schedule's last fire");
                }
            }
            let after = last.max(now);
            if let Some(n) = next_fire(&l, after) {
                next = Some(next.map_or(n, |x| x.min(n)));
            }
        }
        next
    }

    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            let next = self.tick().await;
            let until = next.unwrap_or_else(|| self.clock.now() + chrono::Duration::hours(24));
            tokio::select! {
                _ = self.clock.sleep_until(until) => {}
                _ = self.reloaded.notified() => {}
                // The scheduler noticed the wall clock jump: look again now.
                _ = self.triggers.h.clock_jumped.notified() => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn catch_up_policies() {
        let due: Vec<Fire> = ["2026-01-01T06:00:00Z", "2026-01-02T06:00:00Z", "2026-01-03T06:00:00Z"]
            .iter()
            .map(|s| Fire { at: t(s), note: None })
            .collect();
        let after_downtime = t("2026-01-03T09:00:00Z");
        assert!(plan(Catchup::Skip, &due, after_downtime).is_empty());
        assert_eq!(plan(Catchup::Latest, &due, after_downtime), vec![due[2].clone()]);
        assert_eq!(plan(Catchup::All, &due, after_downtime), due);
        // On time: every policy runs the fire that is due now.
        let now = t("2026-01-03T06:00:01Z");
        for p in [Catchup::Skip, Catchup::Latest, Catchup::All] {
            assert!(plan(p, &due, now).contains(&due[2]), "{p:?}");
        }
        assert_eq!(plan(Catchup::Latest, &due, now), vec![due[2].clone()]);
    }
}
