//! `apollo timeline ID…`: the instances' history as one time-ordered list,
//! a table for the terminal, Markdown for a postmortem, or JSON.

use super::failure::Failure;
use super::render::{print_json, Out};
use apollo_shared::protocol::methods as m;
use apollo_shared::protocol::{Timeline, TimelineEvent, TimelineParams};
use chrono::{DateTime, Utc};
use std::fmt::Write;
use std::process::ExitCode;

pub async fn run(client: &crate::client::Client, p: TimelineParams, md: bool, json: bool) -> Result<ExitCode, Failure> {
    let t = client.request::<m::TasksTimeline>(p).await?;
    if json {
        print_json(&t);
    } else if md {
        print!("{}", markdown(&t));
    } else {
        table(&Out::new(), &t);
    }
    Ok(ExitCode::SUCCESS)
}

/// A window's bound: a time ago (`2h`) or an RFC 3339 time.
pub fn when(flag: &str, text: &str) -> Result<DateTime<Utc>, Failure> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    super::act::since(text).map_err(|_| {
        Failure::Usage(format!("{flag} {text:?}: expected a time ago (90s, 30m, 2h, 7d) or an RFC 3339 time"))
    })
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

/// The instance column: the task and the id's last 6 characters.
fn who(t: &Timeline, e: &TimelineEvent) -> String {
    let task = t.instances.iter().find(|i| i.id == e.instance).map(|i| i.task.as_str()).unwrap_or("?");
    format!("{task}…{}", &e.instance[e.instance.len().saturating_sub(6)..])
}

fn what(e: &TimelineEvent) -> String {
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

fn table(out: &Out, t: &Timeline) {
    if t.events.is_empty() {
        let read = if t.read.is_empty() { String::new() } else { format!(" (read: {})", t.read.join(", ")) };
        println!("no instance in the window{read}");
        return;
    }
    for e in &t.events {
        out.row(format!(
            "{}  {}  {}  {}  {}",
            offset(e.offset_secs),
            e.at.format("%Y-%m-%d %H:%M:%S%.3fZ"),
            who(t, e),
            what(e),
            detail(e)
        ));
    }
}

/// A section to paste into a postmortem: a summary, then every event.
pub fn markdown(t: &Timeline) -> String {
    let mut s = String::from("## Timeline\n\n");
    let (first, last) = (t.events.first(), t.events.last());
    if let (Some(first), Some(last)) = (first, last) {
        let started = t.instances.iter().min_by_key(|i| i.created_at);
        if let Some(i) = started {
            let _ = writeln!(s, "- **Started:** {} ({}), {}", i.task, i.trigger, first.at.format("%Y-%m-%d %H:%M:%SZ"));
        }
        let _ =
            writeln!(s, "- **Lasted:** {} (to {})", duration(last.offset_secs), last.at.format("%Y-%m-%d %H:%M:%SZ"));
        let outcome: Vec<String> = t.instances.iter().map(|i| format!("{} {} {}", i.task, i.id, i.state)).collect();
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
