//! What a pushed event is about: its topic (what a client subscribes to)
//! and its kind.

use serde::{Deserialize, Serialize};

macro_rules! names {
    ($(#[$m:meta])* $vis:vis enum $ty:ident { $($(#[$vm:meta])* $v:ident = $name:literal,)* } $what:literal) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $ty { $($(#[$vm])* $v,)* }
        impl $ty {
            pub const ALL: &'static [$ty] = &[$($ty::$v,)*];
            pub fn as_str(self) -> &'static str {
                match self { $($ty::$v => $name,)* }
            }
        }
        impl std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($name => Ok($ty::$v),)*
                    _ => Err(format!(concat!("unknown ", $what, " {:?}"), s)),
                }
            }
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }
        impl Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    };
}

names! {
    /// What a client subscribes to.
    pub enum Topic {
        /// Instances created, moved, archived.
        Tasks = "tasks",
        /// Definitions (re)loaded, and the config.
        Defs = "defs",
        Alerts = "alerts",
        Queues = "queues",
        Agent = "agent",
        /// Between agents only (a cancel for the agent running an instance).
        Control = "control",
        /// Every topic: the `resync` notice.
        All = "all",
    }
    "topic"
}

impl Topic {
    /// The topics a client may subscribe to.
    pub const SUBSCRIBABLE: &'static [Topic] = &[Topic::Tasks, Topic::Defs, Topic::Alerts, Topic::Queues, Topic::Agent];
}

impl<'de> Deserialize<'de> for Topic {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse::<Topic>().map_err(|_| {
            let known: Vec<&str> = Topic::SUBSCRIBABLE.iter().map(|t| t.as_str()).collect();
            serde::de::Error::custom(format!("unknown topic {s:?} (expected any of: {})", known.join(", ")))
        })
    }
}

names! {
    /// What happened.
    pub enum EventKind {
        InstanceCreated = "instance.created",
        /// A move of the instance or one of its steps (`data.step`).
        InstanceUpdated = "instance.updated",
        InstanceArchived = "instance.archived",
        AlertRaised = "alert.raised",
        DefsReloaded = "defs.reloaded",
        ConfigReloaded = "config.reloaded",
        /// The subscriber fell behind and missed events: re-read everything.
        Resync = "resync",
        /// An agent is asked to stop an instance it runs (`control`).
        Cancel = "cancel",
        /// A pause began or ended (`queues`): re-read `pauses.list`.
        PausesChanged = "pauses.changed",
        /// A fan-out step offers a batch of items to any agent (`tasks`).
        ItemsOffered = "items.offered",
        /// A kind this build does not know (from a newer agent).
        Other = "other",
    }
    "event kind"
}

/// Deserializes a [`names!`] enum whose unknown names (a newer agent's)
/// read as its `Other`.
macro_rules! or_other {
    ($ty:ident) => {
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Ok(s.parse().unwrap_or($ty::Other))
            }
        }
    };
}

or_other!(EventKind);
