//! `pauses.list`, `scheduler.pause`, `scheduler.resume`: an operator's
//! pause is a store record (cluster-wide, surviving restarts, audited); the
//! freeze windows open now come from `scheduler.freezes`.

use super::api::Api;
use crate::triggers::store_error as store_err;
use apollo_shared::protocol::{code, Instance, LockHolder, Pause, PauseEnd, PauseScope, PauseStart, RpcError};
use apollo_shared::state::TaskState;
use chrono::{DateTime, Utc};

/// The queue or task a scope names, checked: `all` names none, the others one.
fn target(method: &str, scope: PauseScope, target: Option<&str>) -> Result<Option<String>, RpcError> {
    let target = target.map(str::trim).filter(|t| !t.is_empty());
    match (scope, target) {
        (PauseScope::All, None) => Ok(None),
        (PauseScope::All, Some(t)) => Err(RpcError::new(
            code::INVALID_PARAMS,
            format!("{method}: scope all takes no target (got {t:?}); use scope queue or task for one"),
        )),
        (_, Some(t)) => Ok(Some(t.to_string())),
        (s, None) => Err(RpcError::new(code::INVALID_PARAMS, format!("{method}: scope {s} needs a target (its name)"))),
    }
}

fn reason<'a>(method: &str, reason: &'a str) -> Result<&'a str, RpcError> {
    match reason.trim() {
        "" => Err(RpcError::new(
            code::INVALID_PARAMS,
            format!("{method}: a reason is required (it goes to the history and the audit)"),
        )),
        r => Ok(r),
    }
}

impl Api {
    /// The operators' pauses in force and the freeze windows open now.
    pub(super) async fn pauses(&self) -> Result<Vec<Pause>, RpcError> {
        let mut all = self.listing.pauses().await.map_err(store_err)?;
        all.extend(self.h.config().scheduler.frozen_at(Utc::now()));
        Ok(all)
    }

    pub(super) async fn pause(&self, p: PauseStart, actor: &str) -> Result<Pause, RpcError> {
        const M: &str = "scheduler.pause";
        let target = target(M, p.scope, p.target.as_deref())?;
        let why = reason(M, &p.reason)?;
        let until = match p.until.as_deref() {
            None => None,
            Some(u) => {
                let at = u.parse::<DateTime<Utc>>().map_err(|e| {
                    RpcError::new(code::INVALID_PARAMS, format!("{M}: until {u:?} is not an RFC 3339 time: {e}"))
                })?;
                if at <= Utc::now() {
                    return Err(RpcError::new(code::INVALID_PARAMS, format!("{M}: until {u} has passed already")));
                }
                Some(at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
            }
        };
        if let (PauseScope::Queue | PauseScope::Task, Some(t)) = (p.scope, &target) {
            self.known(p.scope, t)?;
        }
        let pause = Pause {
            id: format!("pause-{}", self.triggers.new_id()),
            scope: p.scope,
            target,
            reason: why.to_string(),
            by: actor.to_string(),
            since: String::new(),
            until,
            freeze: None,
        };
        self.h.store.pause(pause).await.map_err(store_err)
    }

    pub(super) async fn resume(&self, p: PauseEnd, actor: &str) -> Result<Vec<Pause>, RpcError> {
        const M: &str = "scheduler.resume";
        let target = target(M, p.scope, p.target.as_deref())?;
        let why = reason(M, &p.reason)?;
        let ended = self.h.store.resume(p.scope, target.as_deref(), why, actor).await.map_err(store_err)?;
        if ended.is_empty() {
            let what = target.map(|t| format!("{} {t}", p.scope)).unwrap_or_else(|| p.scope.to_string());
            let frozen: Vec<String> = self
                .h
                .config()
                .scheduler
                .frozen_at(Utc::now())
                .iter()
                .filter(|f| f.scope == p.scope && f.target.as_deref() == p.target.as_deref().map(str::trim))
                .map(Pause::line)
                .collect();
            let hint = match frozen.is_empty() {
                true => "apollo pauses lists what is paused".to_string(),
                false => format!("a freeze window ends with its window or its configuration: {}", frozen.join("; ")),
            };
            return Err(
                RpcError::new(code::INVALID_PARAMS, format!("{M}: no pause of {what} is in force")).with_hint(hint)
            );
        }
        self.h.control.wake();
        Ok(ended)
    }

    /// Says why instances still to run wait, when a pause or freeze window
    /// covers them or another instance holds a lock they take (and nothing
    /// else already says why). A lock wait the claim recorded names the
    /// holder it met; the holder now is named instead.
    pub(super) async fn mark_waiting(&self, items: &mut [Instance]) {
        let waits = |i: &Instance| {
            matches!(i.state, TaskState::Pending | TaskState::Retrying)
                && i.waiting.as_deref().is_none_or(|w| w.starts_with(LockHolder::WAITING))
        };
        if !items.iter().any(waits) {
            return;
        }
        let Ok(paused) = self.pauses().await else { return };
        let holders = match items.iter().any(|i| waits(i) && !i.locks.is_empty()) {
            true => self.listing.lock_holders().await.unwrap_or_default(),
            false => Vec::new(),
        };
        for i in items.iter_mut().filter(|i| waits(i)) {
            if let Some(p) = paused.iter().find(|p| p.covers(&i.queue, &i.task)) {
                i.waiting = Some(format!("waiting: {}", p.line()));
            } else if let Some(h) = holders.iter().find(|h| i.locks.contains(&h.lock) && h.id != i.id) {
                i.waiting = Some(h.waiting_line());
            }
        }
    }

    /// A queue or task to pause must be one the agent knows (a typo would
    /// pause nothing and say it did).
    fn known(&self, scope: PauseScope, name: &str) -> Result<(), RpcError> {
        let cat = self.h.catalog.read().expect("catalog");
        let config = self.h.config();
        let mut names: Vec<String> = match scope {
            PauseScope::Queue => {
                let mut q: Vec<String> = cat.defs.values().map(|l| l.def.queue.clone()).collect();
                q.extend(config.scheduler.queues.keys().cloned());
                q
            }
            _ => cat.defs.keys().cloned().collect(),
        };
        names.sort();
        names.dedup();
        if names.iter().any(|n| n == name) {
            return Ok(());
        }
        let known: Vec<&str> = names.iter().map(String::as_str).collect();
        let hint = match apollo_shared::text::closest(name, &known) {
            Some(n) => format!("did you mean {n:?}? known: {}", names.join(", ")),
            None => format!("known: {}", names.join(", ")),
        };
        Err(RpcError::new(code::NOT_FOUND, format!("no {scope} {name:?} here")).with_hint(hint))
    }
}
