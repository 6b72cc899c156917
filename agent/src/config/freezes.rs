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
use std::collections::BTreeMap;
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
    /// Its lines in the file, for messages: its item's (under `""`) and
    /// each field's written on a line of its own.
    #[serde(skip)]
    pub lines: BTreeMap<&'static str, usize>,
}

/// The fields of a window.
const FIELDS: &[&str] = &["name", "from", "until", "cron", "timezone", "duration", "queues", "tasks", "reason"];

/// Notes in each window where the file `src` writes it and its fields.
pub(super) fn locate(freezes: &mut [Freeze], src: &str) {
    let lines: Vec<&str> = src.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let Some(at) = lines.iter().position(|l| l.trim_start().starts_with("freezes:")) else { return };
    let base = indent(lines[at]);
    let (mut items, mut dash, mut end): (Vec<usize>, Option<usize>, usize) = (Vec::new(), None, lines.len());
    for (i, &l) in lines.iter().enumerate().skip(at + 1) {
        let t = l.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if indent(l) < base || (indent(l) == base && !t.starts_with('-')) {
            end = i;
            break;
        }
        if t.starts_with('-') && dash.is_none_or(|d| d == indent(l)) {
            dash = Some(indent(l));
            items.push(i);
        }
    }
    let key_at = |l: &str, key: &str| {
        let t = l.trim_start().trim_start_matches("- ").trim_start();
        t.strip_prefix(key).is_some_and(|r| r.trim_start().starts_with(':'))
    };
    for (n, f) in freezes.iter_mut().enumerate() {
        let Some(&start) = items.get(n) else {
            f.lines.insert("", at + 1);
            continue;
        };
        let stop = items.get(n + 1).copied().unwrap_or(end);
        f.lines.insert("", start + 1);
        for &field in FIELDS {
            if let Some(i) = (start..stop).find(|&i| key_at(lines[i], field)) {
                f.lines.insert(field, i + 1);
            }
        }
    }
}

/// Each queue and task a window names that the agent does not know (it
/// would freeze nothing), with the closest known name: `queues` those of
/// `scheduler.queues` and of the definitions, `tasks` the definitions'.
pub fn unknown_targets(freezes: &[Freeze], file: &str, queues: &[&str], tasks: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, f) in freezes.iter().enumerate() {
        let targets = [("queues", "queue", &f.queues, queues), ("tasks", "task", &f.tasks, tasks)];
        for (field, what, names, known) in targets {
            for (n, name) in names.iter().enumerate().filter(|(_, n)| !known.contains(&n.as_str())) {
                let listed = if known.is_empty() { "none".to_string() } else { known.join(", ") };
                let hint = match apollo_shared::text::closest(name, known) {
                    Some(k) => format!("did you mean {k:?}? known: {listed}"),
                    None => format!("known: {listed}"),
                };
                let message = format!("no {what} {name:?} here: the window would freeze nothing of it ({hint})");
                out.push(f.said(file, i, &format!("{field}[{n}]"), &message));
            }
        }
    }
    out
}

/// A time as the store writes its own (so the two compare as text).
fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

fn some_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

impl Freeze {
    /// A problem of this window (the `i`th of `file`), as
    /// `file: line N: scheduler.freezes[i] (name).field: message`.
    pub fn said(&self, file: &str, i: usize, field: &str, message: &str) -> String {
        let key = field.split('[').next().unwrap_or(field);
        let line = self.lines.get(key).or_else(|| self.lines.get(""));
        let line = line.map(|l| format!(" line {l}:")).unwrap_or_default();
        let dot = if field.is_empty() { String::new() } else { format!(".{field}") };
        format!("{file}:{line} scheduler.freezes[{i}] ({}){dot}: {message}", self.name)
    }

    /// What is wrong with it (the `i`th window of `file`), naming the line,
    /// the field and what would be valid.
    pub fn problems(&self, file: &str, i: usize) -> Vec<String> {
        self.issues().into_iter().map(|(field, message)| self.said(file, i, field, &message)).collect()
    }

    /// What is wrong with it, as (field, message): `""` the window itself.
    fn issues(&self) -> Vec<(&'static str, String)> {
        let mut out: Vec<(&'static str, String)> = Vec::new();
        let range = self.from.is_some() || self.until.is_some();
        let recurring = self.cron.is_some() || self.duration.is_some() || self.timezone.is_some();
        match (range, recurring) {
            (true, true) | (false, false) => out.push((
                "",
                "give either from and until (a date range) or cron and duration (a recurring window)".into(),
            )),
            (true, false) => match (self.from, self.until) {
                (Some(f), Some(u)) if f >= u => out.push(("from", format!("from {f} is not before until {u}"))),
                (Some(_), Some(_)) => {}
                _ => out.push(("", "a date range needs both from and until (RFC 3339 times)".into())),
            },
            (false, true) => {
                match &self.cron {
                    Some(c) => {
                        if let Err(e) = apollo_shared::cron::parse(c) {
                            out.push(("cron", e));
                        }
                    }
                    None => out.push(("", "a recurring window needs cron (when it opens)".into())),
                }
                match self.duration {
                    Some(d) if d.is_zero() => out.push(("duration", "0 is out of range (expected more than 0)".into())),
                    Some(_) => {}
                    None => out.push(("", "a recurring window needs duration (how long it stays open)".into())),
                }
                if let Some(tz) = &self.timezone {
                    if tz.parse::<chrono_tz::Tz>().is_err() {
                        out.push(("timezone", format!("{tz:?} is not an IANA time zone (e.g. Europe/Paris)")));
                    }
                }
            }
        }
        if self.reason.trim().is_empty() {
            out.push(("reason", "say why (it is what operators read while the window is open)".into()));
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
        assert!(f.problems("f", 0).is_empty(), "{:?}", f.problems("f", 0));
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
        assert!(both.problems("a", 0)[0].contains("scheduler.freezes[0] (x): give either from and until"));
        let bad: Freeze = serde_json::from_value(serde_json::json!({
            "name": "x", "cron": "0 25 * * *", "duration": "1h", "timezone": "Mars/Olympus", "reason": ""
        }))
        .unwrap();
        let p = bad.problems("a", 0);
        assert!(p.iter().any(|e| e.starts_with("a: scheduler.freezes[0] (x).cron:") && e.contains("hour")), "{p:?}");
        assert!(p.iter().any(|e| e.contains(".timezone: \"Mars/Olympus\"")), "{p:?}");
        assert!(p.iter().any(|e| e.contains(".reason: say why")), "{p:?}");
    }

    #[test]
    fn a_problem_is_said_on_its_line_and_two_windows_of_one_name_are_refused() {
        let src = "scheduler:\n  freezes:\n    - name: a\n      cron: '0 25 * * *'\n      duration: 1h\n      \
                   reason: r\n    - name: a\n      from: 2026-12-20T00:00:00Z\n      \
                   until: 2026-12-21T00:00:00Z\n      reason: r\n";
        let e = format!("{:#}", crate::config::Config::parse(src, "apollo.yaml").unwrap_err());
        assert!(e.contains("apollo.yaml: line 4: scheduler.freezes[0] (a).cron:"), "{e}");
        assert!(e.contains("apollo.yaml: line 7: scheduler.freezes[1] (a).name: freezes[0] is named \"a\" too"), "{e}");
        let known = unknown_targets(&[weekly()], "f", &["deploy"], &[]);
        assert_eq!(known.len(), 1, "{known:?}");
        assert!(known[0].contains("(weekend).queues[0]: no queue \"deploys\" here"), "{known:?}");
        assert!(known[0].contains("did you mean \"deploy\"?"), "{known:?}");
    }
}
