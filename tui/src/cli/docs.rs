//! What `apollo man` and `apollo completions` print: the man pages, with
//! their exit statuses and examples, and the shell registration of the
//! dynamic completion, whose task names and instance ids come from the
//! running agent (nothing is offered, quietly, when none answers).

use apollo_shared::man::Extra;
use clap_complete::engine::CompletionCandidate;
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::time::Duration;

/// `apollo`'s exit statuses, on every page.
pub const EXIT_STATUS: &[(&str, &str)] = &[
    ("0", "Success; with --wait or --follow, the instance ended SUCCESS."),
    ("1", "The instance ended FAILED or ROLLED_BACK, a definition failed to load (defs), or the agent refused the request (its words on stderr, or as JSON with --json)."),
    ("2", "A usage error, or no agent could be reached (the message says why: no socket, permission denied, no answer)."),
    ("130", "Interrupted with Ctrl-C while waiting or following; the instance goes on."),
];

/// The examples of each command, by its path.
pub fn examples(path: &str) -> Vec<(&'static str, &'static str)> {
    match path {
        "apollo" => vec![
            ("Run a task and wait for its end, a line per step:", "apollo run daily_report --wait"),
            ("The failed instances of the last hour:", "apollo ls --state failed"),
            ("Drive an agent on another host through SSH:", "apollo --ssh ops@db-7 ls"),
        ],
        "apollo run" => vec![
            ("Run with a parameter and wait:", "apollo run restart_service -p service=nginx --wait"),
            (
                "At most once for a key, with a reason for the audit:",
                "apollo run backup --dedup-key nightly-2026-12-01 --reason \"before the upgrade\"",
            ),
        ],
        "apollo dry-run" => {
            vec![("Validate and describe every step; nothing runs:", "apollo dry-run db_migration -p target=v42")]
        }
        "apollo ls" => vec![
            ("The newest 20 instances:", "apollo ls"),
            ("Failed instances of one task, as JSON:", "apollo ls --state failed --task db_migration --json"),
            ("The archive:", "apollo ls --archived --limit 100"),
        ],
        "apollo show" => vec![("One instance with its steps and history:", "apollo show 01JD7W2J8Q6Y6M3ZB3K5J8X4TQ")],
        "apollo logs" => vec![
            ("Follow every step's output until the instance ends:", "apollo logs 01JD7W2J8Q6Y6M3ZB3K5J8X4TQ --follow"),
            ("One step's log, as JSON lines:", "apollo logs 01JD7W2J8Q6Y6M3ZB3K5J8X4TQ --step migrate --json"),
        ],
        "apollo retry" => vec![
            (
                "Retry one instance from its failed step and wait:",
                "apollo retry 01JD7W2J8Q6Y6M3ZB3K5J8X4TQ --reason \"disk freed\" --wait",
            ),
            (
                "Preview, then retry every failed instance of a task:",
                "apollo retry --state failed --task sync --since 1h --dry-run",
            ),
        ],
        "apollo rollback" => vec![(
            "Roll back an instance and wait:",
            "apollo rollback 01JD7W2J8Q6Y6M3ZB3K5J8X4TQ --reason \"bad deploy\" --wait",
        )],
        "apollo cancel" => vec![(
            "Cancel a running or queued instance:",
            "apollo cancel 01JD7W2J8Q6Y6M3ZB3K5J8X4TQ --reason \"wrong host\"",
        )],
        "apollo emit" => vec![(
            "Publish an event that definitions with on_event start on:",
            "apollo emit sales.uploaded --data '{\"region\": \"eu\"}'",
        )],
        "apollo events" => vec![("The received events and the instances each created:", "apollo events --limit 50")],
        "apollo defs" => vec![("The loaded definitions, and those that failed to load:", "apollo defs")],
        "apollo plugins" => vec![("Plugins with their runs, failure rate and durations:", "apollo plugins")],
        "apollo queues" => vec![("Running, pending and retrying per queue:", "apollo queues")],
        "apollo alerts" => vec![("The latest alerts:", "apollo alerts --limit 50")],
        "apollo status" => vec![("The agent's version, store and counts:", "apollo status")],
        "apollo metrics" => vec![("The agent's metrics, linted:", "apollo metrics | promtool check metrics")],
        "apollo completions" => vec![
            ("Completion for bash, task names and instance ids from the agent:", "source <(apollo completions bash)"),
            ("For zsh:", "apollo completions zsh > ~/.zfunc/_apollo"),
        ],
        "apollo man" => vec![("Write every page into a directory:", "apollo man --dir /usr/local/share/man/man1")],
        "apollo agents" => vec![("Every agent on a shared store:", "apollo agents")],
        "apollo audit" => vec![("What operators did, and why:", "apollo audit --limit 100")],
        _ => Vec::new(),
    }
}

/// The pages' extra sections.
pub fn extra() -> Extra<'static> {
    Extra { exit_status: EXIT_STATUS, examples: &examples }
}

/// Asks the agent of the default socket one question, within a short time;
/// `None` when no agent answers (completion then offers nothing).
fn ask(method: &str, params: Value) -> Option<Value> {
    let socket = crate::client::socket_candidates(None).into_iter().find(|p| p.exists())?;
    let mut s = std::os::unix::net::UnixStream::connect(socket).ok()?;
    let limit = Some(Duration::from_millis(500));
    s.set_read_timeout(limit).ok()?;
    s.set_write_timeout(limit).ok()?;
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    writeln!(s, "{req}").ok()?;
    let mut line = String::new();
    std::io::BufReader::new(s).read_line(&mut line).ok()?;
    serde_json::from_str::<Value>(&line).ok()?.get("result").cloned()
}

/// Task names, for `run TASK`, `--task`, …
pub fn tasks() -> Vec<CompletionCandidate> {
    let Some(Value::Array(defs)) = ask("defs.list", json!({})) else { return Vec::new() };
    defs.iter()
        .filter(|d| d["hash"].is_string())
        .filter_map(|d| d["task"].as_str())
        .map(|t| CompletionCandidate::new(t.to_string()))
        .collect()
}

/// The newest instances' ids, with their task and state as help.
pub fn instances() -> Vec<CompletionCandidate> {
    let Some(r) = ask("tasks.list", json!({"limit": 50})) else { return Vec::new() };
    r["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| {
            let id = i["id"].as_str()?;
            let help = format!("{} {}", i["task"].as_str().unwrap_or(""), i["state"].as_str().unwrap_or(""));
            Some(CompletionCandidate::new(id.to_string()).help(Some(help.into())))
        })
        .collect()
}
