//! `apollo rollout`: the rollouts with their two versions side by side,
//! and `start`, `promote`, `abort`.

use super::args::RolloutCmd;
use super::failure::Failure;
use super::render::{print_json, Out};
use crate::client::Client;
use apollo_shared::protocol::methods as m;
use apollo_shared::protocol::{NoParams, Rollout, RolloutEnd, RolloutStart, RolloutState};
use apollo_shared::state::Tone;
use std::process::ExitCode;

pub async fn run(client: &Client, action: Option<&RolloutCmd>, json: bool, out: &Out) -> Result<ExitCode, Failure> {
    let r = match action {
        None => {
            let all = client.request::<m::RolloutsList>(NoParams {}).await?;
            if json {
                print_json(&all);
            } else if all.is_empty() {
                println!(
                    "no rollouts: register the new version on the agents that should run it, then \
                     `apollo rollout start PLUGIN VERSION --share 10 --reason …`"
                );
            } else {
                all.iter().for_each(|r| show(out, r));
            }
            return Ok(ExitCode::SUCCESS);
        }
        Some(RolloutCmd::Start { plugin, version, agents, share, abort_margin, min_runs, reason }) => {
            let p = RolloutStart {
                plugin: plugin.clone(),
                version: version.clone(),
                share_pct: *share,
                agents: agents.clone(),
                abort_margin_pct: *abort_margin,
                min_runs: *min_runs,
                reason: reason.clone(),
            };
            client.request::<m::RolloutsStart>(p).await?
        }
        Some(RolloutCmd::Promote { plugin, reason }) => {
            let p = RolloutEnd { plugin: plugin.clone(), reason: reason.clone() };
            client.request::<m::RolloutsPromote>(p).await?
        }
        Some(RolloutCmd::Abort { plugin, reason }) => {
            let p = RolloutEnd { plugin: plugin.clone(), reason: reason.clone() };
            client.request::<m::RolloutsAbort>(p).await?
        }
    };
    if json {
        print_json(&r);
    } else {
        show(out, &r);
    }
    Ok(ExitCode::SUCCESS)
}

/// One rollout: its heading, how it ended, and the comparison table.
fn show(out: &Out, r: &Rollout) {
    let tone = match r.state {
        RolloutState::Running => Tone::Busy,
        RolloutState::Promoted => Tone::Good,
        RolloutState::Aborted => Tone::Bad,
    };
    println!("{} {}", out.paint(r.state.as_str(), tone), r.heading());
    if let Some(end) = r.ending() {
        println!("  {end}");
    }
    println!(
        "  automatic abort: failure rate {} points over the old version's, after {} runs",
        r.abort_margin_pct, r.min_runs
    );
    println!("  {:<20} {:>6} {:>6} {:>9} {:>9}", "VERSION", "RUNS", "FAIL%", "P50", "P99");
    for [v, runs, fail, p50, p99] in r.comparison() {
        println!("  {v:<20} {runs:>6} {fail:>6} {p50:>9} {p99:>9}");
    }
}
