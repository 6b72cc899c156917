//! tasks.timeline: the instances chosen by id, or by a window (created
//! since/until, a queue, a task, a trace id), with their children, each
//! read as `tasks.get` reads it (hot, else archived) in one read of the
//! store and merged into one list with what held or touched them.

use super::*;
use crate::store::ListFilter;

/// The most instances one timeline holds.
const MAX_INSTANCES: usize = 1000;
/// A window's default start: the last 24 hours.
const DEFAULT_WINDOW_HOURS: i64 = 24;

impl Api {
    pub(super) async fn timeline(&self, p: TimelineParams) -> Result<Timeline, RpcError> {
        let bad = |m: String| RpcError::new(code::INVALID_PARAMS, format!("tasks.timeline: {m}"));
        if p.ids.len() > MAX_INSTANCES {
            return Err(bad(format!("{} ids (expected at most {MAX_INSTANCES})", p.ids.len())));
        }
        let window = p.ids.is_empty();
        let (ids, read) = if window { self.window(&p).await? } else { (p.ids.clone(), Vec::new()) };
        let found = self.h.store.timeline(ids, MAX_INSTANCES).await.map_err(store_err)?;
        if let Some(id) = found.missing.first() {
            return Err(self.unknown(id).await);
        }
        let mut t = Timeline::build(&found.instances, &found.beside, &found.alerts);
        t.read = read;
        // What fits in one answer, room left for the frame's envelope.
        let budget = apollo_shared::protocol::MAX_FRAME_BYTES - 64 * 1024;
        Ok(t.page(p.from_event.unwrap_or(0) as usize, budget))
    }

    /// An id that is no instance, hot or archived: named, with the closest
    /// id among the latest instances (a mistyped character or two).
    async fn unknown(&self, id: &str) -> RpcError {
        let mut known = Vec::new();
        for archived in [false, true] {
            let f = ListFilter { state: None, task: None, queue: None, limit: 500, before: None, since: None };
            let page = if archived { self.listing.list_archived(f).await } else { self.listing.list(f).await };
            known.extend(page.unwrap_or_default().into_iter().map(|i| i.id));
        }
        let names: Vec<&str> = known.iter().map(String::as_str).collect();
        let hint = match apollo_shared::text::closest(id, &names) {
            Some(c) => format!(" (did you mean {c}?)"),
            None => " (not among the latest 500 instances or the archive's)".to_string(),
        };
        RpcError::new(code::NOT_FOUND, format!("tasks.timeline: no instance {id}{hint}"))
    }

    /// The ids of the instances the window holds, oldest first, and which
    /// parts of the store were read (the hot table, the archive).
    async fn window(&self, p: &TimelineParams) -> Result<(Vec<String>, Vec<String>), RpcError> {
        let since = p.since.unwrap_or_else(|| chrono::Utc::now() - chrono::Duration::hours(DEFAULT_WINDOW_HOURS));
        let until = p.until.unwrap_or_else(chrono::Utc::now);
        let mut ids = Vec::new();
        let mut read = Vec::new();
        // Ids are ULIDs, their time first: the lowest id after `until`.
        let after_until = ulid::Ulid::from_parts((until.timestamp_millis() + 1).max(0) as u64, 0).to_string();
        for archived in [false, true] {
            let mut before = Some(after_until.clone());
            loop {
                let filter = ListFilter {
                    state: None,
                    task: p.task.clone(),
                    queue: p.queue.clone(),
                    limit: 500,
                    before: before.clone(),
                    since: Some(since),
                };
                let page =
                    if archived { self.listing.list_archived(filter).await } else { self.listing.list(filter).await }
                        .map_err(store_err)?;
                let n = page.len();
                before = page.last().map(|i| i.id.clone());
                for i in page {
                    if p.trace.as_ref().is_none_or(|t| *t == i.trace_id) {
                        ids.push(i.id);
                    }
                }
                if ids.len() > MAX_INSTANCES {
                    return Err(RpcError::new(
                        code::INVALID_PARAMS,
                        format!(
                            "tasks.timeline: more than {MAX_INSTANCES} instances in the window; narrow it (since, until, queue, task)"
                        ),
                    ));
                }
                if n < 500 {
                    break;
                }
            }
            read.push(if archived { "archive" } else { "hot" }.to_string());
        }
        ids.sort();
        ids.dedup();
        Ok((ids, read))
    }
}
