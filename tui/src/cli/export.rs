//! `apollo archive export --before DATE FILE` (the archive's documents as
//! JSON lines, a page at a time over the socket, so it works on either
//! backend and from another host) and `apollo show --file FILE ID` (one
//! instance read back from such a file, no agent needed).

use super::failure::Failure;
use super::render::{self, print_json, Out};
use crate::client::Client;
use apollo_shared::protocol::methods as m;
use apollo_shared::protocol::{ExportParams, Instance};
use chrono::{DateTime, NaiveDate, Utc};
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::ExitCode;

fn parse_before(s: &str) -> Result<DateTime<Utc>, Failure> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .map(|d| d.and_hms_opt(0, 0, 0).expect("midnight").and_utc())
        .map_err(|_| Failure::Usage(format!("--before {s:?}: expected a date (2026-11-01) or an RFC 3339 time")))
}

pub async fn export(client: &Client, before: &str, file: &Path, json: bool) -> Result<ExitCode, Failure> {
    let before = parse_before(before)?;
    // Refused before anything is read: an export never overwrites.
    let f = std::fs::OpenOptions::new().write(true).create_new(true).open(file).map_err(|e| {
        Failure::Refused(format!("{}: cannot write the export there ({e}); give a new file's path", file.display()))
    })?;
    let mut w = std::io::BufWriter::new(f);
    let (mut after, mut n) = (None, 0usize);
    loop {
        let page = client.request::<m::ArchiveExport>(ExportParams { before, after: after.take() }).await?;
        for d in &page.docs {
            let line = serde_json::to_string(d).expect("an instance");
            writeln!(w, "{line}").map_err(|e| Failure::Refused(format!("{}: {e}", file.display())))?;
            n += 1;
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    w.flush().map_err(|e| Failure::Refused(format!("{}: {e}", file.display())))?;
    if json {
        print_json(&serde_json::json!({"file": file, "instances": n, "before": before}));
    } else {
        println!("{n} archived instance(s) that ended before {before} written to {}", file.display());
    }
    Ok(ExitCode::SUCCESS)
}

pub fn show(file: &Path, id: &str, json: bool, out: &Out) -> Result<ExitCode, Failure> {
    let f = std::fs::File::open(file).map_err(|e| Failure::Refused(format!("{}: {e}", file.display())))?;
    for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| Failure::Refused(format!("{}: {e}", file.display())))?;
        if !line.contains(id) {
            continue;
        }
        let inst: Instance = serde_json::from_str(&line).map_err(|e| {
            Failure::Refused(format!("{}: line {}: not an exported instance ({e})", file.display(), n + 1))
        })?;
        if inst.id != id {
            continue;
        }
        if json {
            print_json(&inst);
        } else {
            render::instance(out, &inst);
            render::history(out, &inst);
        }
        return Ok(ExitCode::SUCCESS);
    }
    Err(Failure::Refused(format!("{}: no instance {id} in this export", file.display())))
}
