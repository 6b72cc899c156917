//! A fan-out step's items: the store's async operations, each publishing
//! after its commit.

use super::claims::{self, ClaimedItem, Offer, OfferNow, Open};
use super::{items, not_started, plan, rolled_back, FanoutPlan, ItemEnd, ItemPlan};
use crate::store::pool::Store;
use crate::store::Result;
use apollo_shared::protocol::{EventData, ItemRun, Topic};
use apollo_shared::state::{StepState, TaskState};
use serde_json::Value;

impl Store {
    pub async fn items_plan(&self, id: &str, seq: u32, items: Vec<ItemPlan>, p: FanoutPlan) -> Result<()> {
        let (i, a) = (id.to_string(), self.agent().to_string());
        self.write(move |c| plan(c, &i, seq, &items, p, &a)).await?;
        self.changed(id, TaskState::Running, Some((seq, StepState::Running)));
        Ok(())
    }

    /// Opens a life of the step (see `claims::open_round`): its number, and
    /// how many items an earlier one left RUNNING were interrupted.
    pub async fn items_round(
        &self,
        id: &str,
        seq: u32,
        p: FanoutPlan,
        keep: impl Fn(u32) -> bool + Send + 'static,
    ) -> Result<(u32, u32)> {
        let (i, a) = (id.to_string(), self.agent().to_string());
        self.write(move |c| claims::open_round(c, &i, seq, p, &keep, &a)).await
    }

    /// Offers a batch to every agent that can run its items (the others
    /// hear of it: `items.offered`).
    pub async fn items_offer(&self, id: &str, seq: u32, p: FanoutPlan, o: Offer, items: usize) -> Result<()> {
        let (i, a) = (id.to_string(), self.agent().to_string());
        self.write(move |c| claims::offer(c, &i, seq, p, o, items, &a)).await?;
        self.changed(id, TaskState::Running, Some((seq, StepState::Running)));
        if self.shared() {
            self.announce(Topic::Tasks, EventData::ItemsOffered { id: id.to_string(), seq });
        }
        Ok(())
    }

    /// Claims up to `most` items of the step's offered batch for this
    /// agent, in one write (one commit for them all); `render` makes each
    /// one's call (run in the claim's write).
    pub async fn item_claim<R: Send + 'static>(
        &self,
        id: &str,
        seq: u32,
        most: usize,
        render: impl Fn(u32, &Value) -> (Option<String>, R) + Send + Sync + 'static,
    ) -> Result<Vec<ClaimedItem<R>>> {
        let (i, a) = (id.to_string(), self.agent().to_string());
        self.write(move |c| {
            let mut got = Vec::new();
            while got.len() < most {
                match claims::claim(c, &i, seq, &a, &render)? {
                    Some(it) => got.push(it),
                    None => break,
                }
            }
            Ok(got)
        })
        .await
    }

    /// Ends an item this agent claimed (its index and the round of its claim).
    pub async fn item_end(
        &self,
        id: &str,
        seq: u32,
        claim: (u32, u32),
        result: std::result::Result<&Value, &str>,
    ) -> Result<()> {
        let (i, a) = (id.to_string(), self.agent().to_string());
        let (out, err) = match result {
            Ok(v) => (Some(v.to_string()), None),
            Err(e) => (None, Some(e.to_string())),
        };
        self.write(move |c| {
            let how = match (&out, &err) {
                (Some(o), _) => ItemEnd::Success { output: o },
                (_, e) => ItemEnd::Failed { error: e.as_deref().unwrap_or_default() },
            };
            claims::end(c, &i, seq, claim, &how, &a)
        })
        .await?;
        self.changed(id, TaskState::Running, Some((seq, StepState::Running)));
        Ok(())
    }

    /// Interrupts the step's items whose holders stopped answering; `mine`
    /// of its items run here (none elsewhere when the offer counts no more).
    pub async fn items_interrupt_dead(&self, id: &str, seq: u32, mine: u32) -> Result<u32> {
        let (i, a) = (id.to_string(), self.agent().to_string());
        let now = self.items_offer_now(id, seq).await?;
        if now.is_none_or(|n| n.running <= mine) {
            return Ok(0);
        }
        self.write(move |c| claims::interrupt_dead(c, &i, seq, &a)).await
    }

    /// The step's offer as it stands (`None`: none is open).
    pub async fn items_offer_now(&self, id: &str, seq: u32) -> Result<Option<OfferNow>> {
        let i = id.to_string();
        self.read(move |c| claims::now(c, &i, seq)).await
    }

    /// The items that failed in the step's life `round`: (index, label).
    pub async fn items_failed_in(&self, id: &str, seq: u32, round: u32) -> Result<Vec<(u32, String)>> {
        let i = id.to_string();
        self.read(move |c| claims::failed_in(c, &i, seq, round)).await
    }

    /// The items of an instance a live agent runs: (seq, index, label).
    pub async fn items_running_live(&self, id: &str) -> Result<Vec<(u32, u32, String)>> {
        let (i, a) = (id.to_string(), self.agent().to_string());
        self.read(move |c| claims::running_live(c, &i, &a)).await
    }

    /// Withdraws the step's offer.
    pub async fn items_close(&self, id: &str, seq: u32) -> Result<()> {
        let i = id.to_string();
        self.write(move |c| claims::close(c, &i, seq)).await
    }

    /// An instance as its executor reads it (its steps, its whole
    /// context), for an agent that runs items of it.
    pub async fn instance_for_items(&self, id: &str) -> Result<apollo_shared::protocol::Instance> {
        let i = id.to_string();
        self.read(move |c| crate::store::rows::instance_with_steps(c, &i)).await
    }

    /// Offers with room, of instances other agents hold.
    pub async fn items_open(&self) -> Result<Vec<Open>> {
        let a = self.agent().to_string();
        self.read(move |c| claims::open(c, &a)).await
    }

    pub async fn items_not_started(&self, id: &str, seq: u32, reason: &str) -> Result<u32> {
        let (i, r, a) = (id.to_string(), reason.to_string(), self.agent().to_string());
        self.write(move |c| not_started(c, &i, seq, &r, &a)).await
    }

    pub async fn item_rolled_back(&self, id: &str, seq: u32, idx: u32, error: Option<&str>) -> Result<()> {
        let (i, e, a) = (id.to_string(), error.map(str::to_string), self.agent().to_string());
        self.write(move |c| rolled_back(c, &i, seq, idx, e.as_deref(), &a)).await?;
        self.changed(id, TaskState::Failed, Some((seq, StepState::RolledBack)));
        Ok(())
    }

    /// An operator's skip of one item (see `operator::skip_item`).
    pub async fn skip_item(&self, id: &str, seq: u32, idx: u32, reason: &str, actor: &str) -> Result<()> {
        let (i, r, a) = (id.to_string(), reason.to_string(), actor.to_string());
        self.write(move |c| crate::store::operator::skip_item(c, &i, seq, idx, &r, &a)).await?;
        self.changed(id, TaskState::Failed, Some((seq, StepState::Failed)));
        Ok(())
    }

    /// A fan-out step's items, in list order (empty for any other step).
    pub async fn items(&self, id: &str, seq: u32) -> Result<Vec<ItemRun>> {
        self.items_page(id, seq, 0, u32::MAX).await
    }

    /// Up to `limit` of a fan-out step's items, from index `from` on.
    pub async fn items_page(&self, id: &str, seq: u32, from: u32, limit: u32) -> Result<Vec<ItemRun>> {
        let id = id.to_string();
        self.read(move |c| items(c, &id, seq, from, limit)).await
    }
}
