//! `apollo pause`, `apollo resume`, `apollo pauses`; `apollo locks`; `apollo approvals`.

use super::args::ScopeArgs;
use super::failure::Failure;
use super::render::{print_json, Out};
use crate::client::Client;
use apollo_shared::protocol::methods as m;
use apollo_shared::protocol::{Approval, LockInfo, Pause, PauseEnd, PauseScope, PauseStart};
use apollo_shared::state::Tone;
use std::process::ExitCode;

fn scope(s: &ScopeArgs) -> (PauseScope, Option<String>) {
    match (&s.queue, &s.task) {
        (Some(q), _) => (PauseScope::Queue, Some(q.clone())),
        (_, Some(t)) => (PauseScope::Task, Some(t.clone())),
        _ => (PauseScope::All, None),
    }
}

/// `--until`: an RFC 3339 time as given, or a duration from now.
fn until(raw: &str) -> Result<String, Failure> {
    if raw.parse::<chrono::DateTime<chrono::Utc>>().is_ok() {
        return Ok(raw.to_string());
    }
    let secs = apollo_shared::def::parse_duration(&serde_json::Value::String(raw.into()))
        .map_err(|e| Failure::Usage(format!("--until {raw:?}: neither an RFC 3339 time nor a duration ({e})")))?;
    let at = chrono::Utc::now() + chrono::Duration::milliseconds((secs * 1000.0) as i64);
    Ok(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

pub async fn pause(
    client: &Client,
    s: &ScopeArgs,
    until_at: Option<&str>,
    reason: &str,
    json: bool,
) -> Result<ExitCode, Failure> {
    let (scope, target) = scope(s);
    let until = until_at.map(until).transpose()?;
    let p = client.request::<m::SchedulerPause>(PauseStart { scope, target, until, reason: reason.into() }).await?;
    if json {
        print_json(&p);
    } else {
        let ends = match &p.until {
            Some(u) => format!("it resumes by itself at {u}, or with `apollo resume`"),
            None => format!("`apollo resume {}` ends it", flag(&p)),
        };
        println!("{} paused ({}): nothing new is claimed there; running instances go on; {ends}", p.what(), p.id);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn resume(client: &Client, s: &ScopeArgs, reason: &str, json: bool) -> Result<ExitCode, Failure> {
    let (scope, target) = scope(s);
    let ended = client.request::<m::SchedulerResume>(PauseEnd { scope, target, reason: reason.into() }).await?;
    if json {
        print_json(&ended);
    } else {
        for p in &ended {
            println!("{} resumed ({}, paused by {} since {})", p.what(), p.id, p.by, p.since);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The flag that names the pause's scope again (`--queue q`).
fn flag(p: &Pause) -> String {
    match &p.target {
        Some(t) => format!("--{} {t}", p.scope),
        None => "--all".into(),
    }
}

pub fn list(out: &Out, pauses: &[Pause]) {
    if pauses.is_empty() {
        println!("nothing is paused");
    }
    for p in pauses {
        println!("{}  {}", out.paint("PAUSED", Tone::Waiting), p.line());
    }
}

pub fn locks(out: &Out, locks: &[LockInfo]) {
    if locks.is_empty() {
        out.row("no locks held or waited for".to_string());
        return;
    }
    out.row(format!("{:<24} {:<28} {:<20} {:<28} {:>7}", "LOCK", "HELD BY", "TASK", "SINCE", "WAITING"));
    for l in locks {
        let (id, task, since) = match &l.holder {
            Some(h) => (h.id.as_str(), h.task.as_str(), h.since.as_deref().unwrap_or("-")),
            None => ("-", "-", "-"),
        };
        out.row(format!("{:<24} {:<28} {:<20} {:<28} {:>7}", l.lock, id, task, since, l.waiting));
    }
}

pub fn approvals(out: &Out, all: &[Approval]) {
    if all.is_empty() {
        out.row("no approvals".to_string());
    }
    for a in all {
        match &a.decision {
            None => {
                out.row(format!(
                    "{}  {} {}  {}",
                    out.paint("WAITING", Tone::Waiting),
                    a.task,
                    a.instance,
                    a.waiting_line()
                ));
                out.row(format!("         decide: {}", a.commands()));
            }
            Some(d) => out.row(format!(
                "{:<8} {} {}  step {} by {} at {}: {}",
                d.to_uppercase(),
                a.task,
                a.instance,
                a.step,
                a.decided_by.as_deref().unwrap_or("?"),
                a.decided_at.as_deref().unwrap_or("?"),
                a.reason.as_deref().unwrap_or("")
            )),
        }
    }
}
