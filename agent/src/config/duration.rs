//! Durations in the config: seconds (a number) or text with a unit.

use apollo_shared::def::parse_duration;
use serde::Deserializer;
use std::time::Duration;

/// Reads a duration inside the value's own deserializer, so an error carries
/// the field's path (`scheduler.lease`) and line.
struct DurationVisitor;

impl<'de> serde::de::Visitor<'de> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("seconds or a duration like \"30s\", \"5m\", \"1h\"")
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Duration, E> {
        self.visit_f64(v as f64)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Duration, E> {
        self.visit_f64(v as f64)
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Duration, E> {
        let n = serde_json::Number::from_f64(v).map(serde_json::Value::Number).unwrap_or_default();
        parse_duration(&n).map(Duration::from_secs_f64).map_err(E::custom)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
        parse_duration(&serde_json::Value::String(v.into())).map(Duration::from_secs_f64).map_err(E::custom)
    }
}

pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_any(DurationVisitor)
}

/// An optional duration (`null` or absent: none).
pub(crate) fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    <Option<serde_json::Value> as serde::Deserialize>::deserialize(d)?
        .map(|v| parse_duration(&v).map(Duration::from_secs_f64).map_err(serde::de::Error::custom))
        .transpose()
}

/// `N` seconds, as a serde default.
pub(crate) fn secs<const N: u64>() -> Duration {
    Duration::from_secs(N)
}

/// A registration's timeout: a duration, or `auto` (learned from history).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TimeoutConf {
    Fixed(Duration),
    Auto,
}

pub(crate) fn opt_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Option<TimeoutConf>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = TimeoutConf;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("auto, seconds or a duration like \"30s\", \"5m\", \"1h\"")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<TimeoutConf, E> {
            DurationVisitor.visit_u64(v).map(TimeoutConf::Fixed)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<TimeoutConf, E> {
            DurationVisitor.visit_i64(v).map(TimeoutConf::Fixed)
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<TimeoutConf, E> {
            DurationVisitor.visit_f64(v).map(TimeoutConf::Fixed)
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TimeoutConf, E> {
            match v {
                "auto" => Ok(TimeoutConf::Auto),
                _ => DurationVisitor.visit_str(v).map(TimeoutConf::Fixed),
            }
        }
    }
    d.deserialize_any(V).map(Some)
}
