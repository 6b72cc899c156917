//! Watching one instance until it ends: `run --wait`, `retry --wait`,
//! `rollback --wait` (a line per step as it starts and ends) and `logs
//! --follow` (every step's output as it is written, across steps and
//! attempts). Both are woken by the agent — the subscription, and
//! `steps.logs` answering when a log grows — never by polling. Ctrl-C
//! leaves the instance running and says how to attach again.

use super::failure::Failure;
use super::render;
use crate::client::Client;
use apollo_shared::protocol::methods as m;
use apollo_shared::protocol::{EventKind, IdParams, Instance, LogsParams, StepRun};
use apollo_shared::state::{StepState, TaskState};
use serde_json::json;
use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

/// How long one `steps.logs` call may wait for a log to grow before it is
/// asked again (the agent answers at once when the step ends).
const FOLLOW_WAIT: Duration = Duration::from_secs(10);

/// The exit code of a command interrupted by Ctrl-C (128 + SIGINT).
const INTERRUPTED: u8 = 130;

/// What each step was last seen doing, to print what changed.
#[derive(Default)]
struct Seen {
    steps: HashMap<u32, (StepState, u32)>,
    state: Option<TaskState>,
    /// Why the instance waits, as last printed (an approval, a lock, a pause).
    waiting: Option<String>,
    /// The end is printed by the caller (`finish`, the whole instance), so
    /// the state line is not printed for it as well.
    end_printed_after: bool,
}

impl Seen {
    /// What `inst` already shows, so that only what changes after it is
    /// printed (a retry's watch does not replay the failed attempt).
    fn from(inst: &Instance) -> Seen {
        let steps = inst.steps.as_deref().unwrap_or_default().iter().map(|s| (s.seq, (s.state, s.attempts))).collect();
        Seen { steps, state: Some(inst.state), waiting: None, end_printed_after: true }
    }

    /// Prints (on stderr, or as JSON lines on stdout) each step that
    /// started, succeeded, failed or was rolled back since the last look,
    /// and the instance's own moves.
    fn report(&mut self, out: &render::Out, inst: &Instance, json: bool) {
        for s in inst.steps.as_deref().unwrap_or_default() {
            let now = (s.state, s.attempts);
            if self.steps.get(&s.seq) == Some(&now) || (s.state == StepState::Pending && s.attempts == 0) {
                continue;
            }
            self.steps.insert(s.seq, now);
            if json {
                let line = json!({"id": inst.id, "step": s.seq, "name": s.name, "state": s.state,
                                  "attempt": s.attempts, "error": s.error});
                println!("{line}");
            } else {
                eprintln!("{}", step_line(out, s));
            }
        }
        let waiting = inst.waiting.clone().filter(|_| inst.state.is_waiting());
        if waiting.is_some() && waiting != self.waiting && !json {
            let why = waiting.as_deref().unwrap_or_default();
            eprintln!("  {why}");
            // An approval's wait says how to end it, as `apollo approvals` does.
            if why.starts_with("waiting for approval") {
                eprintln!("  decide with: apollo approve {} --reason TEXT (--deny to refuse)", inst.id);
            }
        }
        self.waiting = waiting;
        if self.state != Some(inst.state) && !(self.end_printed_after && inst.ended()) {
            self.state = Some(inst.state);
            if json {
                println!("{}", json!({"id": inst.id, "state": inst.state, "error": inst.error}));
            } else {
                eprintln!("{} {} {}", out.paint(inst.state.as_str(), inst.state.tone()), inst.task, inst.id);
            }
        }
    }
}

/// `  step 1 migrate: FAILED (attempt 2, 0.41s): the error`
fn step_line(out: &render::Out, s: &StepRun) -> String {
    let took = match (s.started_at, s.finished_at, s.state) {
        (Some(a), Some(b), StepState::Success | StepState::Failed) => {
            format!(", {:.2}s", (b - a).num_milliseconds() as f64 / 1000.0)
        }
        _ => String::new(),
    };
    let error = match (s.state, &s.error) {
        (StepState::Failed, Some(e)) => format!(": {e}"),
        _ => String::new(),
    };
    format!(
        "  step {} {}: {} (attempt {}{took}){error}",
        s.seq,
        s.name,
        out.paint(s.state.as_str(), s.state.tone()),
        s.attempts
    )
}

/// How to attach to `id` again after Ctrl-C, with the connection flags
/// this command was given.
pub struct Reattach(pub String);

impl Reattach {
    fn say(&self, id: &str) -> ExitCode {
        eprintln!("\napollo: instance {id} keeps running; attach to it again with: {} logs {id} --follow", self.0);
        ExitCode::from(INTERRUPTED)
    }
}

/// Waits (woken by the subscription, which the caller made before the
/// instance could change) until the instance ends, printing a line per step
/// as it starts and ends, and why it waits when it does (an approval names
/// its approvers and the command that decides it). `since` is the instance
/// as the caller last showed it (after a retry or a rollback): only what
/// changes after it is printed. `None` when Ctrl-C came first.
pub async fn until_end(
    client: &Client,
    id: &str,
    json: bool,
    out: &render::Out,
    since: Option<&Instance>,
) -> Result<Option<Instance>, Failure> {
    let mut events = client.take_events().ok_or(Failure::Unreachable("event stream already taken".into()))?;
    let mut seen = since.map(Seen::from).unwrap_or(Seen { end_printed_after: true, ..Seen::default() });
    let watching = async {
        loop {
            let inst = get(client, id).await?;
            // With --json only the final instance is printed.
            if !json {
                seen.report(out, &inst, false);
            }
            if inst.ended() {
                return Ok(inst);
            }
            loop {
                let ev =
                    events.recv().await.ok_or(Failure::Unreachable("the connection to the agent closed".into()))?;
                if ev.kind() == EventKind::Resync || ev.data.instance() == Some(id) {
                    break;
                }
            }
        }
    };
    tokio::select! {
        r = watching => r.map(Some),
        _ = tokio::signal::ctrl_c() => Ok(None),
    }
}

/// The end of a watched instance: printed, with its exit code (0 only when
/// it ended in `goal`: SUCCESS for a run or a retry, ROLLED_BACK for a
/// rollback), or the re-attach hint after Ctrl-C.
pub fn finish(
    inst: Option<Instance>,
    goal: TaskState,
    id: &str,
    json: bool,
    out: &render::Out,
    again: &Reattach,
) -> ExitCode {
    let Some(inst) = inst else { return again.say(id) };
    if json {
        render::print_json(&inst);
    } else {
        render::instance(out, &inst);
    }
    if inst.state == goal {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Prints the instance's logs — every step, every attempt, each opened by
/// the agent's `[apollo: step NAME, attempt N]` line — and, with `follow`,
/// goes on printing as they are written until the instance ends, exiting
/// with its outcome. With `only`, just that step's log.
pub async fn logs(
    client: &Client,
    id: &str,
    only: Option<u32>,
    follow: bool,
    json: bool,
    out: &render::Out,
    again: &Reattach,
) -> Result<ExitCode, Failure> {
    let mut offsets: HashMap<u32, u64> = HashMap::new();
    let mut seen = Seen::default();
    let mut events = if follow { client.take_events() } else { None };
    let printing = async {
        loop {
            let inst = get(client, id).await?;
            let steps: Vec<StepRun> = inst
                .steps
                .clone()
                .unwrap_or_default()
                .into_iter()
                .filter(|s| only.is_none_or(|o| o == s.seq))
                .collect();
            for s in steps.iter().filter(|s| s.attempts > 0 || only.is_some()) {
                drain(client, id, s, &mut offsets, json, Duration::ZERO).await?;
            }
            if !follow {
                return Ok(ExitCode::SUCCESS);
            }
            seen.report(out, &inst, json);
            if inst.ended() {
                return Ok(if inst.state == TaskState::Success { ExitCode::SUCCESS } else { ExitCode::from(1) });
            }
            match steps.iter().find(|s| s.state == StepState::Running) {
                // The agent answers when the log grows or the attempt ends;
                // while the step runs, the instance need not be read again.
                Some(s) => {
                    while drain(client, id, s, &mut offsets, json, FOLLOW_WAIT).await? == Some(StepState::Running) {}
                }
                // Between steps (a retry's backoff, a queue): the next move.
                None => {
                    let events = events.as_mut().ok_or(Failure::Unreachable("no event stream".into()))?;
                    let _ = tokio::time::timeout(FOLLOW_WAIT, async {
                        while let Some(ev) = events.recv().await {
                            if ev.kind() == EventKind::Resync || ev.data.instance() == Some(id) {
                                return;
                            }
                        }
                    })
                    .await;
                }
            }
        }
    };
    tokio::select! {
        r = printing => r,
        _ = tokio::signal::ctrl_c(), if follow => Ok(again.say(id)),
    }
}

/// Prints what step `s`'s log holds past its offset (with `wait`, waiting
/// that long for it to grow when there is nothing yet); returns the step's
/// state as the agent's last answer left it.
async fn drain(
    client: &Client,
    id: &str,
    s: &StepRun,
    offsets: &mut HashMap<u32, u64>,
    json: bool,
    wait: Duration,
) -> Result<Option<StepState>, Failure> {
    use std::io::Write;
    let mut wait_ms = (!wait.is_zero()).then_some(wait.as_millis() as u64);
    loop {
        let offset = offsets.get(&s.seq).copied().unwrap_or(0);
        let p =
            LogsParams { id: id.into(), step: s.seq.into(), offset: Some(offset), wait_ms: wait_ms.take(), item: None };
        let r = client.request::<m::StepsLogs>(p).await?;
        offsets.insert(s.seq, r.next_offset);
        if json {
            // A JSON line is a whole line of the log: a part not yet ended
            // with its newline is read again next time.
            let whole = if r.text.ends_with('\n') { r.text.len() } else { r.text.rfind('\n').map_or(0, |i| i + 1) };
            if whole < r.text.len() && !(r.eof && wait.is_zero() && s.state != StepState::Running) {
                offsets.insert(s.seq, r.next_offset - (r.text.len() - whole) as u64);
            }
            let text = if offsets[&s.seq] == r.next_offset { &r.text[..] } else { &r.text[..whole] };
            for line in text.lines() {
                println!("{}", json!({"id": id, "step": s.seq, "name": s.name, "line": line}));
            }
            if whole < r.text.len() && offsets[&s.seq] != r.next_offset {
                return Ok(r.step_state);
            }
        } else {
            print!("{}", r.text);
        }
        let _ = std::io::stdout().flush();
        if r.eof {
            return Ok(r.step_state);
        }
    }
}

/// Instance `id`, whole.
pub async fn get(client: &Client, id: &str) -> Result<Instance, Failure> {
    Ok(client.request::<m::TasksGet>(IdParams { id: id.to_string(), reason: None }).await?)
}
