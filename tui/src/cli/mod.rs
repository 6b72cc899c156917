//! The `apollo` command line.
//!
//! Exit codes:
//! - 0: success (with `--wait`: the instance ended SUCCESS);
//! - 1: the instance ended FAILED or ROLLED_BACK, or the agent refused the request;
//! - 2: usage error, or no agent reachable (the message names the socket tried);
//! - 130: interrupted (Ctrl-C) while waiting or following; the instance goes on.
//!
//! `--json` prints the protocol's objects as they are (see docs/protocol.md), and
//! an error as one JSON object on stdout, with the same exit code:
//! `{"error": {"kind", "message", "exit", "code", "data", "command"}}` —
//! `kind` is `usage`, `unreachable`, `refused` (by this command) or
//! `agent` (the agent's refusal, with its JSON-RPC `code` and `data`).

mod act;
mod args;
mod docs;
mod export;
mod failure;
mod items;
mod pause;
mod render;
mod rollout;
mod timeline;
mod watch;

use apollo_shared::state::Tone;
pub use args::Args;
use args::{ArchiveCmd, Cmd};
use failure::Failure;
use render::print_json;
use watch::get;

use crate::client::Client;
use crate::contexts::{Context, Contexts};
use crate::local::{self, LocalAgent};
use apollo_shared::protocol::methods as m;
use apollo_shared::protocol::{
    LimitParams, ListParams, Method, NoParams, PublishParams, TimelineParams, Topic, TriggerParams,
};
use apollo_shared::state::{OperatorAction, TaskState};
use serde_json::{json, Map, Value};
use std::process::ExitCode;

pub async fn main(args: Args) -> ExitCode {
    // These need no agent.
    match &args.command {
        Cmd::Completions { shell } => {
            let shells = clap_complete::env::Shells::builtins();
            let Some(sh) = shells.completer(shell) else {
                let known: Vec<&str> = shells.names().collect();
                eprintln!(
                    "apollo: completions: {shell:?} is not a shell this knows (expected one of: {})",
                    known.join(", ")
                );
                return ExitCode::from(2);
            };
            let mut out = std::io::stdout();
            return match sh.write_registration("COMPLETE", "apollo", "apollo", "apollo", &mut out) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("apollo: {e}");
                    ExitCode::from(2)
                }
            };
        }
        Cmd::Man { dir } => {
            use clap::CommandFactory;
            let done = match dir {
                Some(d) => apollo_shared::man::write_all(Args::command(), &docs::extra(), d).map(|_| ()),
                None => {
                    let mut cmd = Args::command();
                    cmd.build();
                    apollo_shared::man::render(cmd, "apollo", &docs::extra(), &mut std::io::stdout())
                }
            };
            return match done {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("apollo: {e}");
                    ExitCode::from(2)
                }
            };
        }
        _ => {}
    }
    let mut local_agent: Option<LocalAgent> = None;
    let json = args.json;
    let result = run(args, &mut local_agent).await;
    if let Some(a) = local_agent {
        a.stop().await;
    }
    match result {
        Ok(code) => code,
        Err(f) => {
            if json {
                let command: Vec<String> = std::env::args().skip(1).collect();
                println!("{}", f.to_json(&command));
            } else {
                eprintln!("apollo: {}", f.message());
            }
            ExitCode::from(f.exit())
        }
    }
}

/// Arguments clap refused: with `--json` anywhere among them, the error is
/// the one JSON object every other failure is (kind `usage`, exit 2) on
/// stdout, so a script reading stdout is told; otherwise clap's own words
/// (help and version are printed as asked, exit 0).
pub fn parse_failed(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let asked_json = std::env::args().skip(1).take_while(|a| a != "--").any(|a| a == "--json");
    if !asked_json || matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    let text = e.render().to_string();
    // clap's first line is the error; its usage and tip lines follow.
    let message = text.lines().next().unwrap_or_default().trim_start_matches("error: ").to_string();
    let f = Failure::Usage(format!("{message} (see `apollo --help`)"));
    let command: Vec<String> = std::env::args().skip(1).collect();
    let mut json = f.to_json(&command);
    json["error"]["usage"] = Value::String(text.trim_end().to_string());
    println!("{json}");
    ExitCode::from(f.exit())
}

async fn connect_context(c: &Context) -> Result<Client, Failure> {
    crate::client::Target::of(c)
        .connect()
        .await
        .map_err(|e| Failure::Unreachable(format!("context {:?} ({}): {e}", c.name, c.describe())))
}

async fn connect(args: &Args, local_agent: &mut Option<LocalAgent>) -> Result<Client, Failure> {
    if let Some(target) = &args.ssh {
        let remote = args.socket.as_ref().map(|p| p.display().to_string());
        return Client::connect_ssh(target, remote.as_deref()).await.map_err(|e| Failure::Unreachable(e.to_string()));
    }
    if args.local {
        let dir = std::env::current_dir().map_err(|e| Failure::Usage(e.to_string()))?;
        let (client, started) = local::attach(&dir).await.map_err(|e| Failure::Unreachable(e.to_string()))?;
        *local_agent = started;
        return Ok(client);
    }
    crate::client::connect_default(args.socket.as_deref()).await.map_err(|e| Failure::Unreachable(e.to_string()))
}

fn parse_params(raw: &[String]) -> Result<Map<String, Value>, Failure> {
    let mut out = Map::new();
    for p in raw {
        let (k, v) = p.split_once('=').ok_or_else(|| Failure::Usage(format!("-p {p:?}: expected KEY=VALUE")))?;
        let v = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()));
        out.insert(k.trim().to_string(), v);
    }
    Ok(out)
}

/// Whether the command changes state (refused on a read-only context).
fn mutating(cmd: &Cmd) -> Option<&'static str> {
    match cmd {
        Cmd::Run { .. } => Some("run"),
        Cmd::Retry { .. } => Some("retry"),
        Cmd::Skip { .. } => Some("skip"),
        Cmd::Rollback { .. } => Some("rollback"),
        Cmd::Cancel { .. } => Some("cancel"),
        Cmd::Emit { .. } => Some("emit"),
        Cmd::Rollout { action: Some(_) } => Some("rollout"),
        Cmd::Pause { .. } => Some("pause"),
        Cmd::Approve { .. } => Some("approve"),
        Cmd::Resume { .. } => Some("resume"),
        _ => None,
    }
}

/// The `--context` named, checked against the command.
fn context(args: &Args) -> Result<Option<Context>, Failure> {
    let Some(name) = &args.context else { return Ok(None) };
    let ctx = Contexts::find(name).map_err(Failure::Usage)?;
    if let (true, Some(what)) = (ctx.read_only, mutating(&args.command)) {
        return Err(Failure::Refused(format!(
            "context {name:?} is read-only: `{what}` would change state; nothing was sent"
        )));
    }
    Ok(Some(ctx))
}

async fn run(args: Args, local_agent: &mut Option<LocalAgent>) -> Result<ExitCode, Failure> {
    // An export's instance is read from its file: no agent is asked.
    if let Cmd::Show { id, file: Some(file), .. } = &args.command {
        return export::show(file, id, args.json, &render::Out::new());
    }
    let context = context(&args)?;
    let client = match &context {
        Some(c) => connect_context(c).await?,
        None => connect(&args, local_agent).await?,
    };
    client.hello("apollo").await?;
    let json = args.json;
    let out = render::Out::new();
    match &args.command {
        Cmd::Run { task, params, wait, dedup_key, reason } => {
            let params = parse_params(params)?;
            if *wait {
                client.subscribe(&[Topic::Tasks]).await?;
            }
            let p = TriggerParams { task: task.clone(), params, dedup_key: dedup_key.clone(), reason: reason.clone() };
            let r = client.request::<m::TasksTrigger>(p).await?;
            if !*wait {
                if json {
                    print_json(&r);
                } else {
                    let note = if r.created { "" } else { " (already existed for this dedup key)" };
                    println!("{} {task} {}{note}", out.paint("created", Tone::Quiet), r.id);
                }
                return Ok(ExitCode::SUCCESS);
            }
            if !json {
                let note = if r.created { "" } else { " (already existed for this dedup key)" };
                eprintln!("created {task} {}{note}; waiting for it to end (Ctrl-C leaves it running)", r.id);
            }
            let inst = watch::until_end(&client, &r.id, json, &out, None).await?;
            Ok(watch::finish(inst, TaskState::Success, &r.id, json, &out, &reattach(&args)))
        }
        Cmd::DryRun { task, params } => {
            let params = parse_params(params)?;
            let p = TriggerParams { task: task.clone(), params, dedup_key: None, reason: None };
            let r = client.request::<m::TasksDryRun>(p).await?;
            if json {
                print_json(&r);
            } else {
                render::dry_run(&out, &r);
            }
            Ok(if r.valid { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Cmd::Ls { state, task, queue, limit, archived, ids } => {
            let p = ListParams {
                state: *state,
                task: task.clone(),
                queue: queue.clone(),
                limit: Some(*limit),
                cursor: None,
                archived: *archived,
                since: None,
            };
            let r = client.request::<m::TasksList>(p).await?;
            if json {
                print_json(&r.items);
            } else if *ids {
                r.items.iter().for_each(|i| println!("{}", i.id));
            } else {
                render::list(&out, &r.items);
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Timeline { ids, since, until, queue, task, trace, md } => {
            let p = TimelineParams {
                ids: ids.clone(),
                since: since.as_deref().map(|s| timeline::when("--since", s)).transpose()?,
                until: until.as_deref().map(|s| timeline::when("--until", s)).transpose()?,
                queue: queue.clone(),
                task: task.clone(),
                trace: trace.clone(),
                from_event: None,
            };
            timeline::run(&client, p, *md, json).await
        }
        Cmd::Show { id, items: true, .. } => items::show(&client, id, json, &out).await,
        Cmd::Show { id, items: false, .. } => {
            let inst = get(&client, id).await?;
            if json {
                print_json(&inst);
            } else {
                render::instance(&out, &inst);
                render::history(&out, &inst);
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Logs { id, step: Some(step), item: Some(item), follow } => {
            items::logs(&client, id, step, item, *follow, json).await
        }
        Cmd::Logs { id, step, follow, .. } => {
            let only = match step {
                Some(s) => Some(step_seq(&client, id, s).await?),
                None => None,
            };
            if *follow {
                client.subscribe(&[Topic::Tasks]).await?;
            }
            watch::logs(&client, id, only, *follow, json, &out, &reattach(&args)).await
        }
        Cmd::Retry { act: a } | Cmd::Rollback { act: a } | Cmd::Cancel { act: a } => {
            let action = match &args.command {
                Cmd::Retry { .. } => OperatorAction::Retry,
                Cmd::Rollback { .. } => OperatorAction::Rollback,
                _ => OperatorAction::Cancel,
            };
            act::act(&client, action, a, context.as_ref(), json, &out, &reattach(&args)).await
        }
        Cmd::Skip { id, step, reason, item } => {
            let p = apollo_shared::protocol::SkipParams {
                id: id.clone(),
                step: step.clone(),
                reason: reason.clone(),
                item: item.clone(),
            };
            let inst = client.request::<m::StepsSkip>(p).await?;
            if json {
                print_json(&inst);
            } else if let Some(item) = item {
                println!(
                    "{} step {step}: item {item} skipped; `apollo retry {}` runs the items left ({})",
                    inst.id, inst.id, inst.state
                );
            } else {
                println!("{} step {step} skipped; the instance resumes from the next step ({})", inst.id, inst.state);
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Emit { name, data, dedup_key } => {
            let data: Option<Value> = match data {
                Some(d) => Some(serde_json::from_str(d).map_err(|e| Failure::Usage(format!("--data: not JSON: {e}")))?),
                None => None,
            };
            let p = PublishParams { name: name.clone(), data, dedup_key: dedup_key.clone() };
            let r = client.request::<m::EventsPublish>(p).await?;
            if json {
                print_json(&r);
            } else {
                println!("event {} published; instances created: {}", r.event_id, json!(r.instances));
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Defs => {
            let defs = client.request::<m::DefsList>(NoParams {}).await?;
            if json {
                print_json(&defs);
            } else if defs.is_empty() {
                let status = client.request::<m::AgentStatus>(NoParams {}).await?;
                println!(
                    "no definitions: write one as a YAML file in {} (the agent loads it at once); \
                     README.md \"Your first runbook\" shows one",
                    status.tasks_dir
                );
            } else {
                render::defs(&out, &defs);
            }
            // A definition that did not load is a failure a script must see.
            Ok(if defs.iter().any(|d| !d.errors.is_empty()) { ExitCode::from(1) } else { ExitCode::SUCCESS })
        }
        Cmd::Plugins => simple::<m::PluginsList>(&client, NoParams {}, json, |v| render::plugins(&out, v)).await,
        Cmd::Queues => simple::<m::QueuesStats>(&client, NoParams {}, json, |v| render::queues(&out, v)).await,
        Cmd::Status => simple::<m::AgentStatus>(&client, NoParams {}, json, |v| render::status(&out, v)).await,
        Cmd::Agents => simple::<m::AgentsList>(&client, NoParams {}, json, |v| render::agents(&out, v)).await,
        Cmd::Rollout { action } => rollout::run(&client, action.as_ref(), json, &out).await,
        Cmd::Archive { action: ArchiveCmd::Export { before, file } } => {
            export::export(&client, before, file, json).await
        }
        Cmd::Pause { scope, until, reason } => pause::pause(&client, scope, until.as_deref(), reason, json).await,
        Cmd::Resume { scope, reason } => pause::resume(&client, scope, reason, json).await,
        Cmd::Pauses => simple::<m::PausesList>(&client, NoParams {}, json, |v| pause::list(&out, v)).await,
        Cmd::Locks => simple::<m::LocksList>(&client, NoParams {}, json, |v| pause::locks(&out, v)).await,
        Cmd::Approvals => simple::<m::ApprovalsList>(&client, NoParams {}, json, |v| pause::approvals(&out, v)).await,
        Cmd::Approve { id, deny, reason } => {
            let p = apollo_shared::protocol::ApprovalDecide { id: id.clone(), deny: *deny, reason: reason.clone() };
            let a = client.request::<m::ApprovalsDecide>(p).await?;
            if json {
                print_json(&a);
            } else {
                let then = if *deny { "the step fails" } else { "the instance resumes" };
                println!("step {} of {id} {}: {then}", a.step, a.decision.as_deref().unwrap_or("decided"));
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Completions { .. } | Cmd::Man { .. } => Ok(ExitCode::SUCCESS),
        Cmd::Audit { limit } => {
            let p = LimitParams { limit: Some(*limit) };
            simple::<m::AuditList>(&client, p, json, |v| render::audit(&out, v)).await
        }
        Cmd::Metrics => simple::<m::AgentMetrics>(&client, NoParams {}, json, |v| print!("{}", v.text)).await,
        Cmd::Events { limit } => {
            let p = LimitParams { limit: Some(*limit) };
            simple::<m::EventsList>(&client, p, json, |v| render::events(&out, v)).await
        }
        Cmd::Alerts { limit } => {
            let p = LimitParams { limit: Some(*limit) };
            simple::<m::AlertsList>(&client, p, json, |v| render::alerts(&out, v)).await
        }
    }
}

/// One request; its result printed as JSON or for a person.
async fn simple<M: Method>(
    client: &Client,
    params: M::Params,
    json: bool,
    human: impl FnOnce(&M::Result),
) -> Result<ExitCode, Failure> {
    let r = client.request::<M>(params).await?;
    if json {
        print_json(&r);
    } else {
        human(&r);
    }
    Ok(ExitCode::SUCCESS)
}

/// The seq of `step` (a name or a seq) of instance `id`.
async fn step_seq(client: &Client, id: &str, step: &str) -> Result<u32, Failure> {
    let inst = get(client, id).await?;
    let steps = inst.steps.unwrap_or_default();
    steps.iter().find(|s| s.name == step || s.seq.to_string() == step).map(|s| s.seq).ok_or_else(|| {
        let names: Vec<String> = steps.iter().map(|s| format!("{} ({})", s.name, s.seq)).collect();
        Failure::Refused(format!("instance {id} has no step {step:?} (steps: {})", names.join(", ")))
    })
}

/// The command that attaches to an instance again, with the connection
/// flags this one was given.
fn reattach(args: &Args) -> watch::Reattach {
    let mut cmd = String::from("apollo");
    if let Some(c) = &args.context {
        cmd.push_str(&format!(" --context {c}"));
    }
    if let Some(t) = &args.ssh {
        cmd.push_str(&format!(" --ssh {t}"));
    }
    if let Some(p) = &args.socket {
        cmd.push_str(&format!(" --socket {}", p.display()));
    }
    if args.local {
        cmd.push_str(" --local");
    }
    watch::Reattach(cmd)
}
