//! The `apollo` command's arguments: the global flags and every subcommand,
//! with their help and completion candidates (clap).

use super::{act, docs};
use apollo_shared::state::TaskState;
use clap::{Parser, Subcommand};
use clap_complete::engine::ArgValueCandidates;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "apollo", version, about = "Drive an Apollo-11 agent from scripts and the shell")]
pub struct Args {
    /// The agent's socket (default: $APOLLO_SOCKET, ./.apollo/agent.sock, /run/apollo/agent.sock).
    #[arg(long, global = true)]
    pub(super) socket: Option<PathBuf>,
    /// Reach the agent through SSH: [user@]host[:port] (runs `apollo-agent dial-stdio` there).
    #[arg(long, global = true, conflicts_with = "local")]
    pub(super) ssh: Option<String>,
    /// Use the agent of the current directory, starting one (and stopping it after) if none runs.
    #[arg(long, global = true)]
    pub(super) local: bool,
    /// Use a context from $XDG_CONFIG_HOME/apollo/contexts.yaml (its socket or SSH target, read-only and
    /// production flags).
    #[arg(long, global = true, conflicts_with_all = ["local", "ssh", "socket"])]
    pub(super) context: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub(super) json: bool,
    #[command(subcommand)]
    pub(super) command: Cmd,
}

#[derive(Subcommand)]
pub(super) enum Cmd {
    /// Create an instance of TASK.
    Run {
        #[arg(add = ArgValueCandidates::new(docs::tasks))]
        task: String,
        /// A parameter, KEY=VALUE (VALUE is read as JSON when it parses, else as text).
        #[arg(short = 'p', long = "param")]
        params: Vec<String>,
        /// Wait until the instance ends; exit 0 only when it ended SUCCESS.
        #[arg(long)]
        wait: bool,
        /// Create at most one instance for this key.
        #[arg(long)]
        dedup_key: Option<String>,
        /// Why, for the history and `apollo audit`.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Validate and describe every step of TASK without running anything.
    DryRun {
        #[arg(add = ArgValueCandidates::new(docs::tasks))]
        task: String,
        #[arg(short = 'p', long = "param")]
        params: Vec<String>,
    },
    /// List instances, newest first.
    Ls {
        #[arg(long)]
        state: Option<TaskState>,
        #[arg(long, add = ArgValueCandidates::new(docs::tasks))]
        task: Option<String>,
        #[arg(long)]
        queue: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// List the archive (instances past the retention window) instead.
        #[arg(long)]
        archived: bool,
        /// Print only the ids, one a line (for scripts: `ID=$(apollo ls --ids --limit 1)`).
        #[arg(long, conflicts_with = "json")]
        ids: bool,
    },
    /// Show one instance with its steps and history.
    Show {
        #[arg(add = ArgValueCandidates::new(docs::instances))]
        id: String,
        /// List each fan-out step's items: batch, state, attempts, error (or why it never started).
        #[arg(long)]
        items: bool,
        /// Read the instance from an archive export (`apollo archive export`), not from an agent.
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
    },
    /// The instances' history as one time-ordered list: every step attempt with its duration
    /// and error, every operator action with actor and reason (`+HH:MM:SS` beside UTC).
    /// Without ids, the instances created in a window (default: the last 24 h), hot and archived.
    Timeline {
        #[arg(add = ArgValueCandidates::new(docs::instances))]
        ids: Vec<String>,
        /// The window's start: `2h`, `30m`, `7d` ago, or an RFC 3339 time.
        #[arg(long, conflicts_with = "ids")]
        since: Option<String>,
        /// The window's end (default: now), as --since.
        #[arg(long, conflicts_with = "ids")]
        until: Option<String>,
        #[arg(long, conflicts_with = "ids")]
        queue: Option<String>,
        #[arg(long, conflicts_with = "ids")]
        task: Option<String>,
        /// Only the instances of this trace id (in the window).
        #[arg(long, conflicts_with = "ids")]
        trace: Option<String>,
        /// A Markdown section for a postmortem: a summary (what started it, how long, the
        /// outcome, who acted), then every event.
        #[arg(long)]
        md: bool,
    },
    /// Print an instance's logs: every step's, each attempt opened by a line naming it.
    Logs {
        #[arg(add = ArgValueCandidates::new(docs::instances))]
        id: String,
        /// Only this step's log (its name or seq).
        #[arg(long)]
        step: Option<String>,
        /// Only this item's log of a fan-out step (its label, e.g. web-07, or its index); needs --step.
        #[arg(long, requires = "step")]
        item: Option<String>,
        /// Keep printing as the logs grow, across steps, until the instance ends; exit with its outcome.
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Retry a FAILED instance from its failed step, or every instance a selection matches.
    Retry {
        #[command(flatten)]
        act: act::ActArgs,
    },
    /// Mark a FAILED instance's failed step done by hand; the instance resumes from the next step. With --item, one item of a failed fan-out step: it never runs, the instance stays FAILED until `apollo retry` runs the rest.
    Skip {
        id: String,
        /// The step, by name or seq.
        step: String,
        /// Why (required: the history and the audit keep it).
        #[arg(long)]
        reason: String,
        /// One item of the fan-out step, by label or 0-based index.
        #[arg(long)]
        item: Option<String>,
    },
    /// Roll back a FAILED instance, or every instance a selection matches.
    Rollback {
        #[command(flatten)]
        act: act::ActArgs,
    },
    /// Cancel a PENDING, RETRYING or RUNNING instance, or every instance a selection matches.
    Cancel {
        #[command(flatten)]
        act: act::ActArgs,
    },
    /// Publish an event; matching definitions get one instance each.
    Emit {
        name: String,
        #[arg(long)]
        data: Option<String>,
        #[arg(long)]
        dedup_key: Option<String>,
    },
    /// Received events, newest first, with the instances each created.
    Events {
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Loaded definitions and load errors.
    Defs,
    /// Registered plugins.
    Plugins,
    /// Queues: running, limit, pending, retrying.
    Queues,
    /// Alerts, newest first.
    Alerts {
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// The agent's status.
    Status,
    /// The agent's Prometheus metrics, as text (the same as its /metrics).
    Metrics,
    /// Print the shell's completion registration (task names and instance ids come from the running agent):
    /// `source <(apollo completions bash)`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: String,
    },
    /// Print this command's man page (roff), or with --dir write every page (apollo.1, apollo-run.1, …) there.
    Man {
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Every agent on the store: name, host, version, queues, running, last heartbeat, late or not.
    Agents,
    /// Plugin version rollouts, each comparing its two versions since its start (runs, failure rate, p50,
    /// p99); `start`, `promote` and `abort` one.
    Rollout {
        #[command(subcommand)]
        action: Option<RolloutCmd>,
    },
    /// The archive: `export --before DATE FILE` writes the archived instances that ended before DATE as
    /// JSON lines (one instance each, as `show --json` has it), before `scheduler.archive_retention` deletes them.
    Archive {
        #[command(subcommand)]
        action: ArchiveCmd,
    },
    /// Claim nothing new in a scope until `apollo resume` (or --until): running instances go on; what triggers,
    /// events and schedules create waits. Cluster-wide on PostgreSQL; audited.
    Pause {
        #[command(flatten)]
        scope: ScopeArgs,
        /// When it ends by itself: an RFC 3339 time, or a duration from now ("30m", "2h").
        #[arg(long)]
        until: Option<String>,
        /// Why (required: operators read it while the pause holds; the audit keeps it).
        #[arg(long)]
        reason: String,
    },
    /// End the pauses of a scope (a freeze window ends with its window).
    Resume {
        #[command(flatten)]
        scope: ScopeArgs,
        #[arg(long)]
        reason: String,
    },
    /// The pauses and freeze windows in force: what is not claimed now, by whom, since and until when.
    Pauses,
    /// Approve the approval step an instance waits at (or deny it with --deny); only its approvers may.
    Approve {
        #[arg(add = ArgValueCandidates::new(docs::instances))]
        id: String,
        /// Deny instead: the step fails and the instance follows its on_failure.
        #[arg(long)]
        deny: bool,
        /// Why (required: the history and the audit keep it).
        #[arg(long)]
        reason: String,
    },
    /// Approvals waiting for a decision (who may decide, since when, until when), then the latest decided.
    Approvals,
    /// Every lock held or waited for: its holder (instance, task, since, agent) and how many instances wait.
    Locks,
    /// What operators did (run, retry, rollback, cancel), who, and why; newest first.
    Audit {
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

/// What `pause` and `resume` cover: exactly one of these.
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
pub(super) struct ScopeArgs {
    /// One queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// One task.
    #[arg(long)]
    pub task: Option<String>,
    /// Everything.
    #[arg(long)]
    pub all: bool,
}

#[derive(Subcommand)]
pub(super) enum ArchiveCmd {
    /// Write the archived instances that ended before DATE to FILE (which must not exist), one JSON line each.
    Export {
        /// A date (2026-11-01) or an RFC 3339 time (2026-11-01T00:00:00Z), UTC.
        #[arg(long)]
        before: String,
        file: PathBuf,
    },
}

#[derive(Subcommand)]
pub(super) enum RolloutCmd {
    /// Send a share of new instances whose steps accept both versions to PLUGIN's VERSION.
    Start {
        plugin: String,
        version: String,
        /// Only these agents run the new version (default: every live agent that has it).
        #[arg(long, num_args = 1..)]
        agents: Vec<String>,
        /// Percent of new instances sent to the new version (default scheduler.rollout.share_pct, 10).
        #[arg(long)]
        share: Option<f64>,
        /// Abort by itself when the new version's failure rate exceeds the old one's by more than this many
        /// points (default scheduler.rollout.abort_margin_pct, 10)…
        #[arg(long)]
        abort_margin: Option<f64>,
        /// …over at least this many of its runs (default scheduler.rollout.min_runs, 20).
        #[arg(long)]
        min_runs: Option<u32>,
        /// Why (required: the audit keeps it).
        #[arg(long)]
        reason: String,
    },
    /// Make the running rollout's version the one for every step that accepts it.
    Promote {
        plugin: String,
        #[arg(long)]
        reason: String,
    },
    /// Send everything back to the version the running rollout replaces.
    Abort {
        plugin: String,
        #[arg(long)]
        reason: String,
    },
}
