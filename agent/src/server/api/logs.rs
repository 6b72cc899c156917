//! steps.logs (a step's log, or a fan-out item's), steps.items, and
//! archive.export (what the store holds, read a page at a time).

use super::*;

impl Api {
    pub(super) async fn logs(&self, p: LogsParams) -> Result<LogsResult, RpcError> {
        // The steps' rows only (a follower asks many times a second); an
        // archived instance's from its document.
        let mut steps: Vec<(u32, String, StepState, u32)> = self.h.store.step_states(&p.id).await.map_err(store_err)?;
        if steps.is_empty() {
            let inst = self.h.store.get(&p.id).await.map_err(store_err)?;
            steps = inst.steps.unwrap_or_default().into_iter().map(|s| (s.seq, s.name, s.state, s.attempts)).collect();
        }
        let (seq, state, attempts) = Self::step_named(&p.id, &p.step, &steps)?;
        // A fan-out item's log: its own file, its own state.
        let item = match &p.item {
            Some(item) => Some(self.item_named(&p.id, seq, item).await?),
            None => None,
        };
        let (state, attempts) = item.as_ref().map_or((state, attempts), |(_, s, a, _)| (*s, *a));
        let path = match &item {
            Some((idx, ..)) => crate::logs::StepLog::item_path(&self.h.data_dir, &p.id, seq, *idx),
            None => crate::logs::StepLog::path_for(&self.h.data_dir, &p.id, seq),
        };
        // An item another agent ran keeps its log there.
        if let Some((idx, _, _, Some(holder))) = &item {
            let here = self.h.store.agent();
            let name = |a: &str| a.trim_start_matches("agent:").split(':').next().unwrap_or_default().to_string();
            if name(holder) != name(here) && !path.exists() {
                return Err(RpcError::new(
                    code::NOT_FOUND,
                    format!(
                        "item {idx} ran on agent {} ({holder}); its log is kept on that agent: ask it (apollo --agent …)",
                        name(holder)
                    ),
                ));
            }
        }
        let item = item.map(|(idx, s, a, _)| (idx, s, a));
        let read = || {
            crate::logs::read(&path, p.offset.unwrap_or(0), LOGS_READ_BYTES)
                .map_err(|e| RpcError::new(code::INTERNAL, format!("reading {}: {e}", path.display())))
        };
        let answer = |(text, next_offset, eof), (step_state, attempts)| LogsResult {
            text,
            next_offset,
            eof,
            step_state: Some(step_state),
            attempts,
        };
        let wait = std::time::Duration::from_millis(p.wait_ms.unwrap_or(0).min(MAX_LOGS_WAIT_MS));
        if wait.is_zero() || state != StepState::Running {
            return Ok(answer(read()?, (state, attempts)));
        }
        // Following a running step: listen before reading, so a line written
        // between the read and the wait is not missed. The log's notifier
        // fires for each line and when the attempt ends; nothing else wakes
        // this call.
        let follow = crate::logs::follow(&path);
        let woken = follow.grew.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let (text, next_offset, eof) = read()?;
        if !text.is_empty() || !eof {
            return Ok(answer((text, next_offset, eof), (state, attempts)));
        }
        // The attempt may have ended since its state was read, its notifier
        // fired before this call listened: the state is read again, now that
        // it listens (an attempt's log is dropped after its end commits).
        let state_now = || async {
            if let Some((idx, ..)) = item {
                let items = self.h.store.items(&p.id, seq).await.map_err(store_err)?;
                let now = items.iter().find(|i| i.index == idx).map_or((state, attempts), |i| (i.state, i.attempts));
                return Ok::<_, RpcError>(now);
            }
            let now = self.h.store.step_states(&p.id).await.map_err(store_err)?;
            Ok::<_, RpcError>(now.iter().find(|s| s.0 == seq).map_or((state, attempts), |s| (s.2, s.3)))
        };
        let now = state_now().await?;
        if now.0 == StepState::Running && now.1 == attempts {
            let _ = tokio::time::timeout(wait, woken).await;
            return Ok(answer(read()?, state_now().await?));
        }
        Ok(answer(read()?, now))
    }

    /// The step `step` (a name or seq) of instance `id`: (seq, state, attempts), or the error naming the steps there are.
    fn step_named(
        id: &str,
        step: &Value,
        steps: &[(u32, String, StepState, u32)],
    ) -> Result<(u32, StepState, u32), RpcError> {
        let found = match step {
            Value::Number(n) => n.as_u64().and_then(|n| steps.iter().find(|s| s.0 as u64 == n)),
            Value::String(s) => steps.iter().find(|st| st.1 == *s || st.0.to_string() == *s),
            _ => None,
        };
        let names: Vec<String> = steps.iter().map(|s| format!("{} ({})", s.1, s.0)).collect();
        found.map(|s| (s.0, s.2, s.3)).ok_or_else(|| {
            RpcError::new(code::NOT_FOUND, format!("instance {id} has no step {step} (steps: {})", names.join(", ")))
        })
    }

    pub(super) async fn items(&self, p: ItemsParams) -> Result<Vec<ItemRun>, RpcError> {
        let steps = self.h.store.step_states(&p.id).await.map_err(store_err)?;
        if steps.is_empty() {
            // Unknown, or archived (whose items are counted in its document only).
            self.h.store.get(&p.id).await.map_err(store_err)?;
            return Ok(Vec::new());
        }
        let (seq, ..) = Self::step_named(&p.id, &p.step, &steps)?;
        let limit = p.limit.unwrap_or(MAX_ITEMS_PAGE).min(MAX_ITEMS_PAGE);
        self.h.store.items_page(&p.id, seq, p.from, limit).await.map_err(store_err)
    }

    /// Item `item` (its label, or its 0-based index as a number) of step
    /// `seq`: (index, state, attempts).
    /// The item `item` names (its index or label): index, state, attempts
    /// and the agent that ran its last attempt.
    pub(super) async fn item_named(
        &self,
        id: &str,
        seq: u32,
        item: &Value,
    ) -> Result<(u32, StepState, u32, Option<String>), RpcError> {
        let items = self.h.store.items(id, seq).await.map_err(store_err)?;
        if items.is_empty() {
            return Err(RpcError::new(
                code::NOT_FOUND,
                format!("step {seq} of instance {id} has no items (it is not a fan-out step, or it has not started)"),
            ));
        }
        let found = match item {
            Value::Number(n) => n.as_u64().and_then(|n| items.iter().find(|i| i.index as u64 == n)),
            Value::String(s) => items
                .iter()
                .find(|i| i.label == *s)
                .or_else(|| s.parse::<u32>().ok().and_then(|n| items.iter().find(|i| i.index == n))),
            _ => None,
        };
        found.map(|i| (i.index, i.state, i.attempts, i.holder.clone())).ok_or_else(|| {
            let labels: Vec<&str> = items.iter().map(|i| i.label.as_str()).collect();
            let near = match item {
                Value::String(s) => apollo_shared::text::closest(s, &labels)
                    .map(|k| format!("; did you mean {k:?}?"))
                    .unwrap_or_default(),
                _ => String::new(),
            };
            RpcError::new(
                code::NOT_FOUND,
                format!("step {seq} of instance {id} has no item {item} ({} items{near})", items.len()),
            )
        })
    }

    pub(super) async fn export(&self, p: ExportParams) -> Result<ExportPage, RpcError> {
        // Half a frame of documents at most: the answer's envelope fits.
        let (docs, next) =
            self.listing.archive_page(p.before, p.after, MAX_FRAME_BYTES / 2).await.map_err(store_err)?;
        let docs = docs.iter().filter_map(|d| serde_json::from_str(d).ok()).collect();
        Ok(ExportPage { docs, next })
    }
}
