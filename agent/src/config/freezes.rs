//! `scheduler.freezes:` — configured freeze windows. While one is open,
//! nothing new is claimed in the queues or tasks it covers (all of them when
//! it names none), exactly as under an operator's pause: running instances
//! go on, and what triggers create waits. A window is a date range (`from`,
//! `until`) or a recurring one (`cron` opens it, in `timezone`, for
//! `duration`).

use super::duration::duration;
use apollo_shared::protocol::{Pause, PauseScope};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer};
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Freeze {
    pub name: String,
    /// A date range: from (RFC 3339) …
    #[serde(default)]
    pub from: Option<DateTime<Utc>>,
    /// … until (RFC 3339).
    #[serde(default)]
    pub until: Option<DateTime<Utc>>,
    /// A recurring window opens at each fire of this cron expression …
    #[serde(default)]
    pub cron: Option<String>,
    /// … in this time zone (default UTC) …
    #[serde(default)]
    pub timezone: Option<String>,
    /// … and stays open this long.
    #[serde(default, deserialize_with = "some_duration")]
    pub duration: Option<Duration>,
    /// The queues it covers; with `tasks` empty too, everything.
    #[serde(default)]
    pub queues: Vec<String>,
    #[serde(default)]
    pub tasks: Vec<String>,
    pub reason: String,
}

/// A time as the store writes its own (so the two compare as text).
fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

fn some_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

impl Freeze {
    /// What is wrong with it, naming the field and what would be valid.
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut out = Vec::new();
        let range = self.from.is_some() || self.until.is_some();
        let recurring = self.cron.is_some() || self.duration.is_some() || self.timezone.is_some();
        match (range, recurring) {
            (true, true) | (false, false) => out.push(format!(
                "{at}: give either from and until (a date range) or cron and duration (a recurring window)"
            )),
            (true, false) => match (self.from, self.until) {
                (Some(f), Some(u)) if f >= u => out.push(format!("{at}: from {f} is not before until {u}")),
                (Some(_), Some(_)) => {}
                _ => out.push(format!("{at}: a date range needs both from and until (RFC 3339 times)")),
            },
            (false, true) => {
                match &self.cron {
                    Some(c) => {
                        if let Err(e) = apollo_shared::cron::parse(c) {
                            out.push(format!("{at}.cron: {e}"));
                        }
                    }
                    None => out.push(format!("{at}: a recurring window needs cron (when it opens)")),
                }
                match self.duration {
                    Some(d) if d.is_zero() => {
                        out.push(format!("{at}.duration: 0 is out of range (expected more than 0)"))
                    }
                    Some(_) => {}
                    None => out.push(format!("{at}: a recurring window needs duration (how long it stays open)")),
                }
                if let Some(tz) = &self.timezone {
                    if tz.parse::<chrono_tz::Tz>().is_err() {
                        out.push(format!("{at}.timezone: {tz:?} is not an IANA time zone (e.g. Europe/Paris)"));
                    }
                }
            }
        }
        if self.reason.trim().is_empty() {
            out.push(format!("{at}.reason: say why (it is what operators read while the window is open)"));
        }
        out
    }

    /// The window open at `now`, as (opened, closes); `None` when closed.
    pub fn open_at(&self, now: DateTime<Utc>) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        if let (Some(f), Some(u)) = (self.from, self.until) {
            return (f <= now && now < u).then_some((f, u));
        }
        let cron = apollo_shared::cron::parse(self.cron.as_deref()?).ok()?;
        let length = chrono::Duration::from_std(self.duration?).ok()?;
        let tz: chrono_tz::Tz = self.timezone.as_deref().unwrap_or("UTC").parse().ok()?;
        // The first opening strictly after now - length (so it closes after
        // now), if it is not after now, is the window now is in (windows
        // that overlap read as one).
        let fire = apollo_shared::cron::next_after(&cron, &tz, now - length)?;
        (fire.at <= now).then(|| (fire.at, fire.at + length))
    }

    /// The pauses it stands for while open at `now`: one per queue and task
    /// it covers, or one for everything.
    pub fn pauses_at(&self, now: DateTime<Utc>) -> Vec<Pause> {
        let Some((since, until)) = self.open_at(now) else { return Vec::new() };
        let pause = |scope: PauseScope, target: Option<&String>| Pause {
            id: format!("freeze:{}", self.name),
            scope,
            target: target.cloned(),
            reason: self.reason.clone(),
            by: "config".into(),
            since: stamp(since),
            until: Some(stamp(until)),
            freeze: Some(self.name.clone()),
        };
        if self.queues.is_empty() && self.tasks.is_empty() {
            return vec![pause(PauseScope::All, None)];
        }
        let queues = self.queues.iter().map(|q| pause(PauseScope::Queue, Some(q)));
        queues.chain(self.tasks.iter().map(|t| pause(PauseScope::Task, Some(t)))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn weekly() -> Freeze {
        // Fridays 18:00 Paris time, for 63 hours (until Monday 09:00).
        serde_json::from_value(serde_json::json!({
            "name": "weekend", "cron": "0 18 * * FRI", "timezone": "Europe/Paris", "duration": "63h",
            "queues": ["deploys"], "reason": "no deploys over the weekend"
        }))
        .unwrap()
    }

    #[test]
    fn a_recurring_window_is_open_from_its_fire_for_its_duration() {
        let f = weekly();
        assert!(f.problems("f").is_empty(), "{:?}", f.problems("f"));
        // Friday 2026-12-04 18:00 Paris is 17:00 UTC.
        assert_eq!(f.open_at(at("2026-12-04T16:59:59Z")), None);
        let open = Some((at("2026-12-04T17:00:00Z"), at("2026-12-07T08:00:00Z")));
        assert_eq!(f.open_at(at("2026-12-04T17:00:00Z")), open);
        assert_eq!(f.open_at(at("2026-12-06T12:00:00Z")), open);
        assert_eq!(f.open_at(at("2026-12-07T08:00:00Z")), None);
        let p = f.pauses_at(at("2026-12-05T00:00:00Z"));
        assert_eq!(p.len(), 1);
        assert!(p[0].covers("deploys", "any") && !p[0].covers("other", "any"));
        assert_eq!(p[0].until.as_deref(), Some("2026-12-07T08:00:00.000000Z"));
    }

    #[test]
    fn a_date_range_is_open_within_it_and_everything_when_it_names_nothing() {
        let f: Freeze = serde_json::from_value(serde_json::json!({
            "name": "year-end", "from": "2026-12-20T00:00:00Z", "until": "2027-01-04T00:00:00Z", "reason": "freeze"
        }))
        .unwrap();
        assert!(f.open_at(at("2026-12-19T23:59:59Z")).is_none());
        let p = f.pauses_at(at("2026-12-25T00:00:00Z"));
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].scope, PauseScope::All);
        assert!(f.open_at(at("2027-01-04T00:00:00Z")).is_none());
    }

    #[test]
    fn a_window_that_is_neither_or_both_is_named() {
        let both: Freeze = serde_json::from_value(serde_json::json!({
            "name": "x", "from": "2026-12-20T00:00:00Z", "until": "2027-01-04T00:00:00Z", "cron": "0 0 * * *",
            "duration": "1h", "reason": "r"
        }))
        .unwrap();
        assert!(both.problems("scheduler.freezes[0]")[0].contains("give either from and until"));
        let bad: Freeze = serde_json::from_value(serde_json::json!({
            "name": "x", "cron": "0 25 * * *", "duration": "1h", "timezone": "Mars/Olympus", "reason": ""
        }))
        .unwrap();
        let p = bad.problems("scheduler.freezes[0]");
        assert!(p.iter().any(|e| e.starts_with("scheduler.freezes[0].cron:") && e.contains("hour")), "{p:?}");
        assert!(p.iter().any(|e| e.contains(".timezone: \"Mars/Olympus\"")), "{p:?}");
        assert!(p.iter().any(|e| e.contains(".reason: say why")), "{p:?}");
    }
}
