//! Events: every received event is stored (its dedup key unique); each
//! definition whose `on_event` names it, and whose `filter` holds for its
//! payload, gets one instance. An event that matches nothing is kept and
//! visible, not an error.

use super::{store_error, Request, Triggers};
use apollo_shared::protocol::{PublishParams, PublishResult, RpcError};
use serde_json::{Map, Value};

/// The payload field at a dotted path (`order.region`).
fn field<'a>(data: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(data, |v, k| v.get(k))
}

/// Whether every `filter` equality holds for `data`.
pub fn matches(filter: &Map<String, Value>, data: &Value) -> bool {
    filter.iter().all(|(path, want)| field(data, path) == Some(want))
}

impl Triggers {
    pub async fn publish(&self, p: PublishParams, actor: &str) -> Result<PublishResult, RpcError> {
        if !matches!(p.data, None | Some(Value::Null) | Some(Value::Object(_))) {
            return Err(RpcError::new(
                apollo_shared::protocol::code::INVALID_PARAMS,
                format!(
                    "events.publish: data must be a JSON object (the payload definitions read as event.*), found {}",
                    apollo_shared::def::kind(p.data.as_ref().unwrap_or(&Value::Null))
                ),
            ));
        }
        // A duplicate is known before anything is created: a definition added
        // since the first delivery must not get an instance from the repeat.
        if let Some(key) = &p.dedup_key {
            if let Some((id, _)) = self.h.store.event_by_key(key).await.map_err(store_error)? {
                // `instances` lists what this call created: nothing.
                return Ok(PublishResult { event_id: id, duplicate: true, instances: Vec::new() });
            }
        }
        let event_id = self.new_id();
        let key = p.dedup_key.clone().unwrap_or_else(|| event_id.clone());
        let data = p.data.clone().unwrap_or(Value::Null);
        let listeners: Vec<String> = self
            .h
            .catalog
            .read()
            .expect("catalog")
            .defs
            .values()
            .filter(|l| l.def.on_event.as_deref() == Some(p.name.as_str()) && matches(&l.def.filter, &data))
            .map(|l| l.def.task.clone())
            .collect();
        let mut created = Vec::new();
        // The instances one event starts share a trace.
        let trace = format!("{:032x}", rand::random::<u128>());
        for task in listeners {
            let r = self
                .create(Request {
                    dedup_key: Some(format!("event:{}:{key}:{task}", p.name)),
                    task,
                    params: Map::new(),
                    trigger: format!("event {}", p.name),
                    actor: actor.to_string(),
                    event: Some(data.clone()),
                    trace_id: Some(trace.clone()),
                })
                .await?;
            if r.created {
                created.push(r.id);
            }
        }
        let stored = self
            .h
            .store
            .record_event(&event_id, &p.name, p.data, p.dedup_key, created.clone())
            .await
            .map_err(store_error)?;
        if stored && created.is_empty() {
            tracing::info!(event = %p.name, "event matched no definition; kept");
        }
        Ok(PublishResult { event_id, duplicate: !stored, instances: created })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn filters_compare_dotted_fields_exactly() {
        let data = json!({"region": "eu", "order": {"total": 10, "vip": true}});
        let f = |v: Value| v.as_object().unwrap().clone();
        assert!(matches(&f(json!({})), &data));
        assert!(matches(&f(json!({"region": "eu", "order.vip": true})), &data));
        assert!(!matches(&f(json!({"region": "us"})), &data));
        assert!(!matches(&f(json!({"order.total": "10"})), &data), "no loose typing");
        assert!(!matches(&f(json!({"missing.field": null})), &data));
    }
}
