//! The slots `scheduler.concurrency` allows, and who fills them: the loop's
//! claims (in batches, starting new instances' first steps in the same
//! write) and, on an agent that has caught up with its work, a trigger's own
//! write (see `Store::create_claiming`). Every claim reserves its slots
//! first and frees them only once what it claimed is in `active`, so two
//! claims never fill one slot twice.

use super::state::Scheduler;
use crate::steps::FirstStart;
use crate::store::{ClaimTerms, Claimed};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Scheduler {
    /// Holds up to `want` free slots for a claim about to run; returns how
    /// many.
    pub(super) fn reserve_slots(&self, want: usize) -> usize {
        if self.is_shutting_down() {
            return 0;
        }
        let mut reserved = self.slots.reserved.lock().expect("reserved");
        let free = (self.config().scheduler.concurrency() as usize).saturating_sub(self.running() + *reserved);
        let k = want.min(free);
        *reserved += k;
        k
    }

    pub(super) fn release_slots(&self, k: usize) {
        *self.slots.reserved.lock().expect("reserved") -= k;
    }

    /// The loop's claim: fills every free slot, new instances starting their
    /// first step in the claim's write; `adopt` hands each to an executor
    /// before the slots are released.
    pub(super) async fn claim_free(self: &Arc<Self>, adopt: impl Fn(Claimed, Option<Box<FirstStart>>)) {
        let free = self.reserve_slots(usize::MAX);
        if free == 0 {
            return;
        }
        self.slots.looping.store(true, Ordering::SeqCst);
        // The tests hold the loop's claim here (`slots.loop_claim=return(MS)`).
        if let Some(ms) = loop_claim_hold() {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
        let (plugins, catalog) = (self.registry.clone(), self.catalog.clone());
        let ready = move |i: &Claimed| crate::steps::ready_first(&plugins, &catalog, i);
        let claim = self.store.claim_starting(free, self.lease(), self.queue_policy(), ready).await;
        if let Some((claimed, waiting)) = super::state::noted(claim, &self.failing.claim) {
            self.slots.backlog.store(waiting || claimed.len() >= free, Ordering::Relaxed);
            self.slots.limited.store(waiting, Ordering::Relaxed);
            for (i, started) in claimed {
                let first = started.map(|(ready, attempt)| Box::new(FirstStart { ready, attempt, checked: None }));
                adopt(i, first);
            }
        }
        self.release_slots(free);
        self.slots.looping.store(false, Ordering::SeqCst);
        self.slots.released.notify_waiters();
    }

    /// A free slot for what a trigger's write claims, with the terms of that
    /// claim; `None` while work may be waiting (the loop claims it) or when
    /// every slot is taken.
    pub(super) fn reserve_for_trigger(&self) -> Option<ClaimTerms> {
        if self.slots.backlog() {
            return None;
        }
        (self.reserve_slots(1) == 1).then(|| ClaimTerms { lease: self.lease(), policy: self.queue_policy() })
    }

    /// Another agent's change: new work wakes the loop; an instance that
    /// ended there wakes it only when this agent's last claim left work
    /// held back (its own slots are as they were), so idle agents do not
    /// all take the cluster's claim turn for every instance that ends.
    pub fn heard(&self, change: crate::store::listen::Change) {
        if change == crate::store::listen::Change::Work || self.slots.limited.load(Ordering::Relaxed) {
            self.wake();
        }
    }

    /// What a trigger that found no free slot may wait for: the release of
    /// the slots a claim of the loop holds now (`None` when none does).
    pub(super) fn loop_claim_release(&self) -> Option<Arc<tokio::sync::Notify>> {
        let looping = self.slots.looping.load(Ordering::SeqCst);
        (looping && !self.slots.backlog()).then(|| self.slots.released.clone())
    }

    pub(super) fn release_for_trigger(&self) {
        self.release_slots(1)
    }
}

/// How long the tests hold a loop's claim (`slots.loop_claim=return(MS)`).
fn loop_claim_hold() -> Option<u64> {
    fail::fail_point!("slots.loop_claim", |ms| ms.and_then(|m| m.parse::<u64>().ok()));
    None
}
