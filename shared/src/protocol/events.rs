//! What the agent tells its subscribers, typed end to end: the store and the
//! agent build an [`EventData`], the bus carries it, the socket writes it as
//! `{"seq":N,"topic":T,"kind":K,"data":{…}}`, and the console and the CLI
//! read it back as the same enum. An event of a kind this build does not
//! know (a newer agent's), or whose data does not read as its kind says,
//! arrives as [`EventData::Other`].

use super::{EventKind, Topic};
use crate::state::{StepState, TaskState};
use serde::{Deserialize, Serialize};
use serde_json::Value;

names! {
    /// What an alert reports.
    pub enum AlertKind {
        /// A step's rollback failed; the instance stays FAILED.
        RollbackFailed = "rollback_failed",
        /// An instance ended FAILED.
        InstanceFailed = "instance_failed",
        /// A plugin panicked; its step failed.
        PluginPanicked = "plugin_panicked",
        /// The reaper ended an instance running far longer than expected.
        ZombieReaped = "zombie_reaped",
        /// An instance's holder stopped renewing its lease; it was taken over.
        LeaseExpired = "lease_expired",
        /// The wall clock jumped; leases and retry times were moved with it.
        ClockJump = "clock_jump",
        /// Processes of an earlier run were still alive at the start.
        LeftoverProcesses = "leftover_processes",
        /// A state move the transition table refuses was asked for.
        IllegalTransition = "illegal_transition",
        /// The store cannot be written (disk full, read-only, out of reach).
        StoreUnwritable = "store_unwritable",
        /// The store can be written again.
        StoreWritable = "store_writable",
        /// A definition does not load.
        DefinitionError = "definition_error",
        /// The config does not load; the one in force stays.
        ConfigError = "config_error",
        /// A changed setting takes effect only at the next start.
        RestartNeeded = "restart_needed",
        /// A plugin does not load or is not usable.
        PluginError = "plugin_error",
        /// An alert hook could not deliver.
        HookFailed = "hook_failed",
        /// `metrics.listen` cannot be served.
        MetricsError = "metrics_error",
        /// An event source is out of reach.
        EventSourceDown = "event_source_down",
        /// An event source is back.
        EventSourceUp = "event_source_up",
        /// An event source delivered a message that is not a valid event.
        EventInvalid = "event_invalid",
        /// Instances wait that no live agent has the plugins to run.
        NoCapableAgent = "no_capable_agent",
        /// A plugin version's rollout was aborted (by hand or automatically).
        RolloutAborted = "rollout_aborted",
        /// An approval step waits for a decision (its message says who may
        /// give it and the command that does).
        ApprovalRequested = "approval_requested",
        /// A kind this build does not know (from a newer agent).
        Other = "other",
    }
    "alert kind"
}

or_other!(AlertKind);

/// A step's move within an instance's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepMoved {
    pub seq: u32,
    pub state: StepState,
}

/// An alert as it is raised (the stored one also has an id and a time).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Raised {
    pub kind: AlertKind,
    pub message: String,
    #[serde(default)]
    pub instance: Option<String>,
}

/// What an event says: its kind and its data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "data")]
pub enum EventData {
    #[serde(rename = "instance.created")]
    InstanceCreated { id: String, task: String, state: TaskState },
    /// A move of the instance, or of one of its steps (`step`).
    #[serde(rename = "instance.updated")]
    InstanceUpdated {
        id: String,
        state: TaskState,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<StepMoved>,
    },
    #[serde(rename = "instance.archived")]
    InstanceArchived { id: String },
    #[serde(rename = "alert.raised")]
    AlertRaised(Raised),
    /// The definitions were read again: the tasks changed and removed, and
    /// every file that does not load, with why.
    #[serde(rename = "defs.reloaded")]
    DefsReloaded { changed: Vec<String>, removed: Vec<String>, errors: Vec<String> },
    /// The config was read again: what took effect, what needs a restart.
    #[serde(rename = "config.reloaded")]
    ConfigReloaded { applied: Vec<String>, need_restart: Vec<String> },
    /// The subscriber fell behind and missed events: re-read everything.
    #[serde(rename = "resync")]
    Resync {},
    /// An agent (`to`) is asked to stop an instance it runs.
    #[serde(rename = "cancel")]
    Cancel { id: String, to: String, actor: String, reason: String },
    /// A pause began or ended (its id; `ended` when it ended).
    #[serde(rename = "pauses.changed")]
    PausesChanged { id: String, ended: bool },
    /// A fan-out step (`seq`) offers a batch of items to any agent that
    /// can run them.
    #[serde(rename = "items.offered")]
    ItemsOffered { id: String, seq: u32 },
    /// A kind this build does not know, or data that does not read as its
    /// kind says.
    #[serde(rename = "other")]
    Other,
}

impl EventData {
    /// The kind's name on the wire.
    pub fn kind(&self) -> EventKind {
        match self {
            EventData::InstanceCreated { .. } => EventKind::InstanceCreated,
            EventData::InstanceUpdated { .. } => EventKind::InstanceUpdated,
            EventData::InstanceArchived { .. } => EventKind::InstanceArchived,
            EventData::AlertRaised(_) => EventKind::AlertRaised,
            EventData::DefsReloaded { .. } => EventKind::DefsReloaded,
            EventData::ConfigReloaded { .. } => EventKind::ConfigReloaded,
            EventData::Resync {} => EventKind::Resync,
            EventData::Cancel { .. } => EventKind::Cancel,
            EventData::PausesChanged { .. } => EventKind::PausesChanged,
            EventData::ItemsOffered { .. } => EventKind::ItemsOffered,
            EventData::Other => EventKind::Other,
        }
    }

    /// The instance the event creates, moves, archives or cancels.
    pub fn instance(&self) -> Option<&str> {
        match self {
            EventData::InstanceCreated { id, .. }
            | EventData::InstanceUpdated { id, .. }
            | EventData::InstanceArchived { id }
            | EventData::ItemsOffered { id, .. }
            | EventData::Cancel { id, .. } => Some(id),
            _ => None,
        }
    }

    /// The `data` of the wire form, as JSON (for scripts, and for tests
    /// that read an event as a client written in another language would).
    pub fn json(&self) -> Value {
        match serde_json::to_value(self) {
            Ok(Value::Object(mut m)) => m.remove("data").unwrap_or(Value::Null),
            _ => Value::Null,
        }
    }

    /// An event's data from its wire parts; [`EventData::Other`] when the
    /// kind is unknown or the data does not read as it says.
    pub fn from_parts(kind: &str, data: Value) -> EventData {
        serde_json::from_value(serde_json::json!({ "kind": kind, "data": data })).unwrap_or(EventData::Other)
    }
}

/// One notification pushed to a subscriber.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    pub seq: u64,
    pub topic: Topic,
    #[serde(flatten)]
    pub data: EventData,
}

impl Event {
    pub fn kind(&self) -> EventKind {
        self.data.kind()
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            seq: u64,
            topic: Topic,
            kind: String,
            #[serde(default)]
            data: Value,
        }
        let w = Wire::deserialize(d)?;
        Ok(Event { seq: w.seq, topic: w.topic, data: EventData::from_parts(&w.kind, w.data) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_keep_their_wire_form_and_read_back_typed() {
        let ev = Event {
            seq: 3,
            topic: Topic::Tasks,
            data: EventData::InstanceUpdated {
                id: "01J".into(),
                state: TaskState::Running,
                step: Some(StepMoved { seq: 1, state: StepState::Running }),
            },
        };
        let wire = serde_json::to_value(&ev).unwrap();
        assert_eq!(
            wire,
            json!({"seq": 3, "topic": "tasks", "kind": "instance.updated",
                   "data": {"id": "01J", "state": "RUNNING", "step": {"seq": 1, "state": "RUNNING"}}})
        );
        assert_eq!(serde_json::from_value::<Event>(wire).unwrap(), ev);
        let resync = Event { seq: 4, topic: Topic::All, data: EventData::Resync {} };
        assert_eq!(
            serde_json::to_value(&resync).unwrap(),
            json!({"seq": 4, "topic": "all", "kind": "resync", "data": {}})
        );
        let alert = json!({"seq": 5, "topic": "alerts", "kind": "alert.raised",
                           "data": {"kind": "store_writable", "message": "back", "instance": null}});
        let ev: Event = serde_json::from_value(alert.clone()).unwrap();
        assert_eq!(
            ev.data,
            EventData::AlertRaised(Raised { kind: AlertKind::StoreWritable, message: "back".into(), instance: None })
        );
        assert_eq!(serde_json::to_value(&ev).unwrap(), alert);
    }

    #[test]
    fn an_unknown_kind_or_unreadable_data_arrives_as_other() {
        let ev: Event =
            serde_json::from_value(json!({"seq": 2, "topic": "tasks", "kind": "instance.teleported", "data": {}}))
                .unwrap();
        assert_eq!((ev.topic, ev.kind()), (Topic::Tasks, EventKind::Other));
        let ev: Event =
            serde_json::from_value(json!({"seq": 2, "topic": "tasks", "kind": "instance.updated", "data": {}}))
                .unwrap();
        assert_eq!(ev.data, EventData::Other);
        // An alert kind from a newer agent is still an alert.
        let ev: Event = serde_json::from_value(
            json!({"seq": 1, "topic": "alerts", "kind": "alert.raised", "data": {"kind": "moon_phase", "message": "m"}}),
        )
        .unwrap();
        assert!(matches!(ev.data, EventData::AlertRaised(Raised { kind: AlertKind::Other, .. })));
    }
}
