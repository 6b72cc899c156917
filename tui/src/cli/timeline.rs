//! `apollo timeline ID…`: the instances' history as one time-ordered list,
//! a table for the terminal, Markdown for a postmortem, or JSON.

use super::failure::Failure;
use super::render::{print_json, Out};
use apollo_shared::protocol::{Timeline, TimelineParams};
use chrono::{DateTime, Utc};
use std::process::ExitCode;

pub async fn run(client: &crate::client::Client, p: TimelineParams, md: bool, json: bool) -> Result<ExitCode, Failure> {
    let t = client.timeline(p).await?;
    if json {
        print_json(&t);
    } else if md {
        print!("{}", t.markdown());
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

fn table(out: &Out, t: &Timeline) {
    let lines = t.lines();
    if lines.is_empty() {
        let read = if t.read.is_empty() { String::new() } else { format!(" (read: {})", t.read.join(", ")) };
        println!("no instance in the window{read}");
    }
    for line in lines {
        out.row(line);
    }
}
