//! `tasks.timeline`: the instances chosen (and the children their
//! sub-runbook steps made), their history rows merged into one
//! time-ordered list of events, each step attempt's end with its duration
//! and its error's first line, operators' actions marked — what a
//! postmortem starts from. Built from what `tasks.get` returns (hot or
//! archived), with what held or touched those instances beside them: the
//! operators' pauses over their queue or task, the rollouts whose arms they
//! ran, and the alerts raised about them.

use super::children::parent_of;
use super::rails::LockHolder;
use super::types::{Alert, Instance, Transition};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TimelineParams {
    /// Instance ids; without them, the instances of a window:
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<String>,
    /// Created at or after this (default: 24 hours ago)…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    /// …and at or before this (default: now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// Only the instances of this trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// The events from this one on (a timeline too large for one answer
    /// comes in pages: ask again with the answer's `next_event`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_event: Option<u32>,
}

/// One instance of a timeline, as it stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineInstance {
    pub id: String,
    pub task: String,
    pub state: String,
    pub trigger: String,
    pub trace_id: String,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The instance whose sub-runbook step made this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

/// What a timeline shows beside its instances without being one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BesideKind {
    /// An operator's pause whose scope covered an instance while it lived.
    Pause,
    /// A rollout of a plugin version whose arm an instance ran.
    Rollout,
}

/// A pause or a rollout, with its history rows (begun, ended).
#[derive(Debug, Clone, PartialEq)]
pub struct Beside {
    pub kind: BesideKind,
    pub id: String,
    pub rows: Vec<Transition>,
}

/// One event. `offset_secs` counts from the timeline's first event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineEvent {
    pub at: DateTime<Utc>,
    pub offset_secs: f64,
    /// The instance's id; a pause's (`pause-…`) or a rollout's id for those.
    pub instance: String,
    /// `instance` (the instance moved), `step` (one of its steps moved),
    /// `lock` (it began to wait for a lock another instance held: `reason`
    /// names the lock and the holder; the wait ends at its next claim),
    /// `pause` (an operator's pause over its queue, task or everything
    /// began or ended: `to` is `paused` or `resumed`), `rollout` (a rollout
    /// whose arm it ran started, was promoted or aborted: `to` is `running`,
    /// `promoted` or `aborted`) or `alert` (`to` is the alert's kind,
    /// `reason` its message).
    pub kind: String,
    /// The step's name (step events).
    pub step: Option<String>,
    pub from: Option<String>,
    pub to: String,
    pub actor: String,
    /// A person (or a trigger on their behalf) caused it, not the agent.
    pub operator: bool,
    pub reason: String,
    /// A step attempt's end: how long it ran.
    pub duration_secs: Option<f64>,
    /// A failure's first line.
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    pub instances: Vec<TimelineInstance>,
    pub events: Vec<TimelineEvent>,
    /// What was read: `hot` and `archive` for a window.
    #[serde(default)]
    pub read: Vec<String>,
    /// More events follow: ask again with `from_event` set to this (and
    /// the same ids or window, its `until` fixed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_event: Option<u32>,
}

impl Timeline {
    /// The events of `instances` (with their history, as `tasks.get` gives
    /// them), of what was `beside` them and of their alerts, in time order;
    /// rows of one instance keep their order.
    pub fn build(instances: &[Instance], beside: &[Beside], alerts: &[Alert]) -> Timeline {
        let mut events = Vec::new();
        for inst in instances {
            let names: HashMap<u32, &str> = inst.steps.iter().flatten().map(|s| (s.seq, s.name.as_str())).collect();
            let mut running: HashMap<u32, DateTime<Utc>> = HashMap::new();
            for t in inst.transitions.iter().flatten() {
                events.push(event(&inst.id, t, &names, &mut running));
            }
        }
        for b in beside {
            let kind = match b.kind {
                BesideKind::Pause => "pause",
                BesideKind::Rollout => "rollout",
            };
            let none = HashMap::new();
            events.extend(
                b.rows
                    .iter()
                    .map(|t| TimelineEvent { kind: kind.into(), ..event(&b.id, t, &none, &mut HashMap::new()) }),
            );
        }
        events.extend(alerts.iter().map(|a| TimelineEvent {
            at: a.at,
            offset_secs: 0.0,
            instance: a.instance.clone().unwrap_or_default(),
            kind: "alert".into(),
            step: None,
            from: None,
            to: a.kind.as_str().to_string(),
            actor: "agent".into(),
            operator: false,
            reason: a.message.clone(),
            duration_secs: None,
            error: None,
        }));
        events.sort_by_key(|e| e.at); // stable: one instance's rows stay in order
        if let Some(first) = events.first().map(|e| e.at) {
            for e in &mut events {
                e.offset_secs = (e.at - first).num_milliseconds() as f64 / 1000.0;
            }
        }
        let instances = instances
            .iter()
            .map(|i| TimelineInstance {
                id: i.id.clone(),
                task: i.task.clone(),
                state: i.state.as_str().to_string(),
                trigger: i.trigger.clone(),
                trace_id: i.trace_id.clone(),
                created_at: i.created_at,
                finished_at: i.finished_at,
                parent: parent_of(i.dedup_key.as_deref()).map(|(id, _)| id),
            })
            .collect();
        Timeline { instances, events, read: Vec::new(), next_event: None }
    }

    /// The events from `from` on that fit in `budget` bytes of JSON (at
    /// least one), with `next_event` set when more follow.
    pub fn page(mut self, from: usize, budget: usize) -> Timeline {
        let mut events = self.events.split_off(from.min(self.events.len()));
        let mut used = serde_json::to_vec(&self.instances).map_or(0, |v| v.len());
        let mut fit = 0;
        for e in &events {
            used += serde_json::to_vec(e).map_or(0, |v| v.len()) + 1;
            if used > budget && fit > 0 {
                break;
            }
            fit += 1;
        }
        if fit < events.len() {
            self.next_event = Some((from + fit) as u32);
        }
        events.truncate(fit);
        self.events = events;
        self
    }

    /// A following page's events added to this one's.
    pub fn extend(&mut self, page: Timeline) {
        self.events.extend(page.events);
        self.next_event = page.next_event;
    }

    /// One line per event: `+HH:MM:SS  UTC  task…id  step: FROM -> TO  detail`.
    pub fn lines(&self) -> Vec<String> {
        let t = self;
        self.events
            .iter()
            .map(|e| {
                format!(
                    "{}  {}  {}  {}  {}",
                    offset(e.offset_secs),
                    e.at.format("%Y-%m-%d %H:%M:%S%.3fZ"),
                    who(t, e),
                    what(e),
                    detail(e)
                )
            })
            .collect()
    }

    /// A Markdown section to paste into a postmortem: a summary, then every event.
    pub fn markdown(&self) -> String {
        markdown(self)
    }

    /// The operators who acted, in the order they first did.
    pub fn actors(&self) -> Vec<&str> {
        let mut seen = BTreeSet::new();
        self.events.iter().filter(|e| e.operator && seen.insert(e.actor.as_str())).map(|e| e.actor.as_str()).collect()
    }
}

fn event(
    instance: &str,
    t: &Transition,
    names: &HashMap<u32, &str>,
    running: &mut HashMap<u32, DateTime<Utc>>,
) -> TimelineEvent {
    let mut duration_secs = None;
    if let Some(seq) = t.step {
        if t.to == "RUNNING" {
            running.insert(seq, t.at);
        } else if t.from.as_deref() == Some("RUNNING") {
            duration_secs = running.remove(&seq).map(|s| (t.at - s).num_milliseconds() as f64 / 1000.0);
        }
    }
    let failed = matches!(t.to.as_str(), "FAILED" | "RETRYING");
    let kind = match t.step {
        Some(_) => "step",
        None if t.from.as_deref() == Some(&t.to) && t.reason.starts_with(LockHolder::WAITING) => "lock",
        None => "instance",
    };
    TimelineEvent {
        at: t.at,
        offset_secs: 0.0,
        instance: instance.to_string(),
        kind: kind.to_string(),
        step: t.step.map(|s| names.get(&s).map(|n| n.to_string()).unwrap_or_else(|| format!("#{s}"))),
        from: t.from.clone(),
        to: t.to.clone(),
        actor: t.actor.clone(),
        operator: t.by_operator(),
        reason: t.reason.clone(),
        duration_secs,
        error: failed.then(|| t.reason.lines().next().unwrap_or_default().to_string()).filter(|e| !e.is_empty()),
    }
}

/// `+01:02:03` from seconds.
fn offset(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    format!("+{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

fn duration(secs: f64) -> String {
    if secs < 1.0 {
        format!("{}ms", (secs * 1000.0).round() as u64)
    } else if secs < 60.0 {
        format!("{secs:.1}s")
    } else {
        let s = secs as u64;
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

/// The instance column: the task and the id's last 6 characters (for a
/// pause or a rollout: the kind and its id's).
fn who(t: &Timeline, e: &TimelineEvent) -> String {
    let tail = &e.instance[e.instance.len().saturating_sub(6)..];
    if matches!(e.kind.as_str(), "pause" | "rollout") {
        return format!("{}…{tail}", e.kind);
    }
    let task = t.instances.iter().find(|i| i.id == e.instance).map(|i| i.task.as_str()).unwrap_or("?");
    format!("{task}…{tail}")
}

fn what(e: &TimelineEvent) -> String {
    match e.kind.as_str() {
        "alert" => return format!("alert {}", e.to),
        "lock" => return "waits for a lock".to_string(),
        "rollout" => return format!("rollout {}", e.to),
        "pause" => return e.to.clone(),
        _ => {}
    }
    let moved = format!("{} -> {}", e.from.as_deref().unwrap_or("-"), e.to);
    match &e.step {
        Some(s) => format!("{s}: {moved}"),
        None => moved,
    }
}

/// What a row says after the move: how long, by whom (an operator), why.
fn detail(e: &TimelineEvent) -> String {
    let mut d = String::new();
    if let Some(secs) = e.duration_secs {
        let _ = write!(d, "after {}  ", duration(secs));
    }
    if e.operator {
        let _ = write!(d, "{}: ", e.actor);
    }
    d.push_str(e.error.as_deref().unwrap_or(&e.reason));
    d
}

/// A section to paste into a postmortem: a summary, then every event.
fn markdown(t: &Timeline) -> String {
    let mut s = String::from("## Timeline\n\n");
    let (first, last) = (t.events.first(), t.events.last());
    if let (Some(first), Some(last)) = (first, last) {
        let started = t.instances.iter().min_by_key(|i| i.created_at);
        if let Some(i) = started {
            let _ = writeln!(s, "- **Started:** {} ({}), {}", i.task, i.trigger, first.at.format("%Y-%m-%d %H:%M:%SZ"));
        }
        let _ =
            writeln!(s, "- **Lasted:** {} (to {})", duration(last.offset_secs), last.at.format("%Y-%m-%d %H:%M:%SZ"));
        let outcome: Vec<String> = t
            .instances
            .iter()
            .map(|i| {
                let child = i.parent.as_deref().map(|p| format!(" (child of {p})")).unwrap_or_default();
                format!("{} {} {}{child}", i.task, i.id, i.state)
            })
            .collect();
        let _ = writeln!(s, "- **Outcome:** {}", outcome.join("; "));
        let actors = t.actors();
        let _ = writeln!(
            s,
            "- **Who acted:** {}",
            if actors.is_empty() { "nobody".to_string() } else { actors.join(", ") }
        );
    }
    if !t.read.is_empty() {
        let _ = writeln!(s, "- **Read:** {}", t.read.join(", "));
    }
    s.push_str("\n| + | UTC | instance | what | detail |\n|---|---|---|---|---|\n");
    for e in &t.events {
        let cell = |v: String| v.replace('|', "\\|").replace('\n', " ");
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            offset(e.offset_secs),
            e.at.format("%Y-%m-%d %H:%M:%S%.3fZ"),
            cell(who(t, e)),
            cell(what(e)),
            cell(detail(e))
        );
    }
    s
}
