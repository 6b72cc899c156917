//! Operator actions — retry, rollback, cancel — on one instance, or on many:
//! `apollo retry --state FAILED --task T --since 1h [--dry-run] [--yes]`.
//! For a batch, the plan — what the action does to each selected instance,
//! and which the transition table refuses and why — is printed before
//! anything is sent; the action then goes to each instance the table allows,
//! and each result is reported. On a production context, destructive
//! actions need the task name (or the count) typed and a reason.

use super::failure::Failure;
use super::render::{self, print_json};
use crate::client::Client;
use crate::contexts::Context;
use apollo_shared::protocol::methods as m;
use apollo_shared::protocol::{IdParams, Instance, ListParams};
use apollo_shared::state::{OperatorAction, TaskState};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use std::io::IsTerminal;
use std::process::ExitCode;

/// One instance by id, or a batch by selection: the plan is printed first,
/// and nothing is sent without a confirmation (typed, or `--yes`).
#[derive(clap::Args)]
pub struct ActArgs {
    /// The instance (omit to select by --state, --task, --queue, --since).
    #[arg(add = clap_complete::engine::ArgValueCandidates::new(super::docs::instances))]
    id: Option<String>,
    /// Why, recorded with the action (`apollo audit`, the instance's history).
    #[arg(long)]
    reason: Option<String>,
    /// Select instances in this state.
    #[arg(long)]
    state: Option<TaskState>,
    /// Select instances of this task.
    #[arg(long, add = clap_complete::engine::ArgValueCandidates::new(super::docs::tasks))]
    task: Option<String>,
    /// Select instances in this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Select instances created within this long (90s, 30m, 1h, 2d).
    #[arg(long)]
    since: Option<String>,
    /// Print the plan and send nothing.
    #[arg(long)]
    dry_run: bool,
    /// Act without asking (needed when stdin is not a terminal).
    #[arg(long, short = 'y')]
    yes: bool,
    /// Then wait until the instance ends, a line per step as it starts and ends; exit 0 only when it ended SUCCESS (ROLLED_BACK for a rollback).
    #[arg(long)]
    wait: bool,
}

impl ActArgs {
    fn selection(&self) -> bool {
        self.state.is_some() || self.task.is_some() || self.queue.is_some() || self.since.is_some()
    }
}

/// Which instances a batch takes.
pub struct Selector {
    pub state: Option<TaskState>,
    pub task: Option<String>,
    pub queue: Option<String>,
    /// Created at or after this.
    pub since: Option<DateTime<Utc>>,
}

/// The most instances one batch takes.
const MAX_BATCH: usize = 10_000;

/// Every live instance the selector matches, newest first.
pub async fn select(client: &Client, sel: &Selector) -> Result<Vec<Instance>, Failure> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let query = ListParams {
            state: sel.state,
            task: sel.task.clone(),
            queue: sel.queue.clone(),
            limit: Some(500),
            cursor: cursor.take(),
            archived: false,
            // The agent bounds the listing by it (an index range), and the
            // page is still checked below.
            since: sel.since,
        };
        let page = client.request::<m::TasksList>(query).await?;
        let mut older = false;
        for i in page.items {
            if sel.since.is_some_and(|s| i.created_at < s) {
                older = true;
                break;
            }
            out.push(i);
        }
        if out.len() > MAX_BATCH {
            return Err(Failure::Usage(format!(
                "more than {MAX_BATCH} instances match; narrow the selection (--task, --state, --since)"
            )));
        }
        match page.next_cursor {
            Some(c) if !older => cursor = Some(c),
            _ => return Ok(out),
        }
    }
}

/// Parses `--since`: `90s`, `30m`, `1h`, `2d`.
pub fn since(text: &str) -> Result<DateTime<Utc>, Failure> {
    let secs = apollo_shared::def::parse_duration(&Value::String(text.to_string()))
        .map_err(|e| Failure::Usage(format!("--since {text:?}: {e}")))?;
    Ok(Utc::now() - chrono::Duration::milliseconds((secs * 1000.0) as i64))
}

/// What the action does to each instance, or why it is refused.
pub fn plan(action: OperatorAction, items: &[Instance]) -> Vec<(&Instance, Result<String, String>)> {
    items.iter().map(|i| (i, action.plan(i.state))).collect()
}

fn print_plan(action: OperatorAction, planned: &[(&Instance, Result<String, String>)]) {
    for (i, p) in planned {
        match p {
            Ok(what) => println!("{:<10} {}  {:<20} {what}", action.verb(), i.id, i.task),
            Err(why) => println!("{:<10} {}  {:<20} {why}", "refused", i.id, i.task),
        }
    }
    let ok = planned.iter().filter(|(_, p)| p.is_ok()).count();
    println!("{ok} to {}, {} refused by the transition table", action.verb(), planned.len() - ok);
}

/// How the operator confirms.
pub struct Confirm {
    pub yes: bool,
    pub dry_run: bool,
    /// The context is production: the count must be typed and a reason given.
    pub production: bool,
    pub reason: Option<String>,
}

pub(super) fn ask(prompt: &str) -> Result<String, Failure> {
    use std::io::Write;
    eprint!("{prompt}");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).map_err(|e| Failure::Usage(e.to_string()))?;
    Ok(line.trim().to_string())
}

/// What the operator must type to go on.
struct Typed<'a> {
    expected: &'a str,
    prompt: String,
    /// The refusal when there is no terminal to ask on (and no --yes).
    off_terminal: String,
}

/// Asks for `typed` on a terminal unless `yes`, and on production for a
/// reason when none was given; returns the reason to send. Refuses (nothing
/// sent) on a wrong answer, without a terminal, or on production without a
/// reason.
fn confirmed(typed: Typed, yes: bool, production: bool, mut reason: Option<String>) -> Result<Option<String>, Failure> {
    if !yes {
        if !std::io::stdin().is_terminal() {
            return Err(Failure::Usage(typed.off_terminal));
        }
        let answer = ask(&typed.prompt)?;
        if answer != typed.expected {
            return Err(Failure::Usage(format!("{answer:?} is not {:?}; nothing was sent", typed.expected)));
        }
        if production && reason.is_none() {
            reason = Some(ask("reason (recorded with the action): ")?).filter(|r| !r.is_empty());
        }
    }
    if production && reason.is_none() {
        return Err(Failure::Usage(
            "this context is production: give --reason (it is recorded with the action); nothing was sent".into(),
        ));
    }
    Ok(reason)
}

/// Prints the plan, asks, acts; exit 1 when any instance was refused by the agent.
pub async fn run(
    client: &Client,
    action: OperatorAction,
    sel: &Selector,
    confirm: Confirm,
    json: bool,
) -> Result<ExitCode, Failure> {
    let items = select(client, sel).await?;
    let planned = plan(action, &items);
    let todo: Vec<&Instance> = planned.iter().filter(|(_, p)| p.is_ok()).map(|(i, _)| *i).collect();
    if json && confirm.dry_run {
        let rows: Vec<Value> = planned
            .iter()
            .map(|(i, p)| match p {
                Ok(what) => {
                    json!({"id": i.id, "task": i.task, "state": i.state, "action": action.verb(), "plan": what})
                }
                Err(why) => json!({"id": i.id, "task": i.task, "state": i.state, "refused": why}),
            })
            .collect();
        print_json(&rows);
        return Ok(ExitCode::SUCCESS);
    }
    if !json {
        print_plan(action, &planned);
    }
    if confirm.dry_run || todo.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let n = todo.len().to_string();
    let typed = Typed {
        expected: &n,
        prompt: format!("type {n} to {} {n} instances: ", action.verb()),
        off_terminal: format!("{n} instances would be changed; confirm with --yes (nothing was sent)"),
    };
    let reason = confirmed(typed, confirm.yes, confirm.production, confirm.reason.clone())?;
    let mut failed = 0;
    let mut results = Vec::new();
    for i in todo {
        match client.operate(action, &i.id, reason.as_deref()).await {
            Ok(now) => {
                if !json {
                    println!("{:<10} {}  {:<20} now {}", "done", i.id, i.task, now.state);
                }
                results.push(json!({"id": i.id, "ok": true, "state": now.state}));
            }
            Err(e) => {
                failed += 1;
                if !json {
                    println!("{:<10} {}  {:<20} {e}", "failed", i.id, i.task);
                }
                results.push(json!({"id": i.id, "ok": false, "error": e.to_string()}));
            }
        }
    }
    if json {
        print_json(&results);
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

pub async fn act(
    client: &Client,
    action: OperatorAction,
    a: &ActArgs,
    context: Option<&Context>,
    json: bool,
    out: &render::Out,
    again: &super::watch::Reattach,
) -> Result<ExitCode, Failure> {
    let production = context.is_some_and(|c| c.production);
    if a.wait && (a.id.is_none() || action == OperatorAction::Cancel) {
        return Err(Failure::Usage(format!(
            "--wait follows one instance: give its ID{}",
            if action == OperatorAction::Cancel { " (and retry or roll it back: a cancel ends it)" } else { "" }
        )));
    }
    let Some(id) = &a.id else {
        if !a.selection() {
            return Err(Failure::Usage(format!(
                "{}: give an instance ID, or select instances with --state, --task, --queue or --since",
                action.verb()
            )));
        }
        let since = a.since.as_deref().map(since).transpose()?;
        let sel = Selector { state: a.state, task: a.task.clone(), queue: a.queue.clone(), since };
        let confirm = Confirm { yes: a.yes, dry_run: a.dry_run, production, reason: a.reason.clone() };
        return run(client, action, &sel, confirm, json).await;
    };
    if a.selection() {
        return Err(Failure::Usage("give an instance ID or a selection (--state, --task, …), not both".into()));
    }
    let mut reason = a.reason.clone();
    if a.dry_run || (production && action.destructive()) {
        let inst = client.request::<m::TasksGet>(IdParams { id: id.clone(), reason: None }).await?;
        let plan = action.plan(inst.state);
        if a.dry_run {
            match plan {
                Ok(what) => println!("{} {id}  {}  {what}", action.verb(), inst.task),
                Err(why) => println!("refused {id}  {}  {why}", inst.task),
            }
            return Ok(ExitCode::SUCCESS);
        }
        let typed = Typed {
            expected: &inst.task,
            prompt: format!("production: type the task name ({}) to {} {id}: ", inst.task, action.verb()),
            off_terminal: "this context is production: confirm with --yes and --reason (nothing was sent)".into(),
        };
        reason = confirmed(typed, a.yes, true, reason)?;
    }
    if a.wait {
        client.subscribe(&[apollo_shared::protocol::Topic::Tasks]).await?;
    }
    let inst = client.operate(action, id, reason.as_deref()).await?;
    if a.wait {
        if !json {
            eprintln!("{} {id}: now {}; waiting for it to end (Ctrl-C leaves it running)", action.verb(), inst.state);
        }
        let done = super::watch::until_end(client, id, json, out, Some(&inst)).await?;
        let goal = if action == OperatorAction::Rollback { TaskState::RolledBack } else { TaskState::Success };
        return Ok(super::watch::finish(done, goal, id, json, out, again));
    }
    if json {
        print_json(&inst);
    } else {
        render::instance(out, &inst);
    }
    Ok(ExitCode::SUCCESS)
}
