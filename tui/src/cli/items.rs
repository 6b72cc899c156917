//! A fan-out step's items: `apollo show ID --items` (each item's batch,
//! state, attempts and error, or why it never started) and `apollo logs ID
//! --step S --item X [--follow]` (one item's log).

use super::failure::Failure;
use super::render::{print_json, took, Out};
use super::watch::get;
use crate::client::Client;
use apollo_shared::protocol::methods as m;
use apollo_shared::protocol::{ItemsParams, LogsParams, MAX_ITEMS_PAGE};
use apollo_shared::state::{StepState, Tone};
use serde_json::{json, Value};
use std::process::ExitCode;

/// Prints every fan-out step's items of instance `id`.
pub async fn show(client: &Client, id: &str, json: bool, out: &Out) -> Result<ExitCode, Failure> {
    let inst = get(client, id).await?;
    let mut all = Vec::new();
    for s in inst.steps.iter().flatten().filter(|s| s.items.is_some()) {
        // Page by page: a step may have thousands.
        let mut items = Vec::new();
        loop {
            let p = ItemsParams { id: id.into(), step: s.seq.into(), from: items.len() as u32, limit: None };
            let page = client.request::<m::StepsItems>(p).await?;
            let last = page.len() < MAX_ITEMS_PAGE as usize;
            items.extend(page);
            if last {
                break;
            }
        }
        all.push((s, items));
    }
    if json {
        let doc: Vec<Value> = all
            .iter()
            .map(
                |(s, items)| json!({"seq": s.seq, "step": s.name, "state": s.state, "counts": s.items, "items": items}),
            )
            .collect();
        print_json(&doc);
        return Ok(ExitCode::SUCCESS);
    }
    if all.is_empty() {
        println!("instance {id} has no fan-out step that has started (a step with foreach:)");
        return Ok(ExitCode::SUCCESS);
    }
    for (s, items) in &all {
        let counts = s.items.as_ref().map(|n| n.line()).unwrap_or_default();
        println!("step {} (#{}) {}: {counts}", s.name, s.seq, s.state.as_str());
        println!(
            "  {:<6} {:<24} {:<5} {:<11} {:>8} {:>8}  ERROR",
            "INDEX", "ITEM", "BATCH", "STATE", "ATTEMPTS", "TOOK"
        );
        for i in items {
            let (state, tone) = match i.not_started() {
                true => ("NOT STARTED", Tone::Quiet),
                false => (i.state.as_str(), i.state.tone()),
            };
            out.row(format!(
                "  {:<6} {:<24} {:<5} {} {:>8} {:>8}  {}",
                i.index,
                i.label,
                i.batch,
                out.paint(&format!("{state:<11}"), tone),
                i.attempts,
                took(i.started_at, i.finished_at),
                i.error.as_deref().map(|e| apollo_shared::text::one_line(e, 200)).unwrap_or_default()
            ));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints one item's log; with `follow`, until the item is no longer running.
pub async fn logs(
    client: &Client,
    id: &str,
    step: &str,
    item: &str,
    follow: bool,
    json: bool,
) -> Result<ExitCode, Failure> {
    use std::io::Write;
    let mut offset = 0;
    loop {
        let p = LogsParams {
            id: id.into(),
            step: Value::String(step.into()),
            offset: Some(offset),
            wait_ms: follow.then_some(10_000),
            item: Some(Value::String(item.into())),
        };
        let r = client.request::<m::StepsLogs>(p).await?;
        offset = r.next_offset;
        if json {
            for line in r.text.lines() {
                println!("{}", json!({"step": step, "item": item, "line": line}));
            }
        } else {
            print!("{}", r.text);
            let _ = std::io::stdout().flush();
        }
        let running = r.step_state == Some(StepState::Running);
        if !follow || (r.eof && !running) {
            return Ok(ExitCode::SUCCESS);
        }
    }
}
