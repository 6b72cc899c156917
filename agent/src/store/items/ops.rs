//! A fan-out step's items: the store's async operations, each publishing
//! after its commit.

use super::{batch, end, interrupted, items, not_started, plan, rolled_back, start, FanoutPlan, ItemEnd, ItemPlan};
use crate::store::pool::Store;
use crate::store::Result;
use apollo_shared::protocol::ItemRun;
use apollo_shared::state::{StepState, TaskState};
use serde_json::Value;

impl Store {
    pub async fn items_plan(&self, id: &str, seq: u32, items: Vec<ItemPlan>, p: FanoutPlan) -> Result<()> {
        let (i, a) = (id.to_string(), self.agent().to_string());
        self.write(move |c| plan(c, &i, seq, &items, p, &a)).await?;
        self.changed(id, TaskState::Running, Some((seq, StepState::Running)));
        Ok(())
    }

    pub async fn items_batch(&self, id: &str, seq: u32, p: FanoutPlan, items: usize) -> Result<()> {
        let (i, a) = (id.to_string(), self.agent().to_string());
        self.write(move |c| batch(c, &i, seq, p, items, &a)).await?;
        self.changed(id, TaskState::Running, Some((seq, StepState::Running)));
        Ok(())
    }

    pub async fn item_start(&self, id: &str, seq: u32, idx: u32, params: &Value) -> Result<u32> {
        let (i, p, a) = (id.to_string(), params.to_string(), self.agent().to_string());
        self.write(move |c| start(c, &i, seq, idx, &p, &a)).await
    }

    pub async fn item_end(
        &self,
        id: &str,
        seq: u32,
        idx: u32,
        result: std::result::Result<&Value, &str>,
        done: u32,
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
            end(c, &i, seq, idx, &how, done, &a)
        })
        .await?;
        self.changed(id, TaskState::Running, Some((seq, StepState::Running)));
        Ok(())
    }

    pub async fn items_not_started(&self, id: &str, seq: u32, reason: &str) -> Result<u32> {
        let (i, r, a) = (id.to_string(), reason.to_string(), self.agent().to_string());
        self.write(move |c| not_started(c, &i, seq, &r, &a)).await
    }

    pub async fn items_interrupted(&self, id: &str, seq: u32) -> Result<u32> {
        let (i, a) = (id.to_string(), self.agent().to_string());
        self.write(move |c| interrupted(c, &i, seq, &a)).await
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
