//! Human output: tables and summaries, coloured by state on a terminal
//! (never when NO_COLOR is set or stdout is not a terminal).

use apollo_shared::protocol::{
    parent_of, AgentInfo, AgentStatus, Alert, AuditEntry, DefInfo, DryRunResult, EventRecord, Instance, PluginInfo,
    PluginStats, PoolStats, QueueStats,
};
use apollo_shared::state::Tone;
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::io::IsTerminal;

pub struct Out {
    color: bool,
    /// The terminal's width when stdout is one: tables fit it. Into a pipe
    /// or a file nothing is cut.
    width: Option<usize>,
}

impl Out {
    pub fn new() -> Out {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        let tty = std::io::stdout().is_terminal();
        let width = if tty { crossterm::terminal::size().ok().map(|(w, _)| w as usize) } else { None };
        Out { color: !no_color && tty, width }
    }

    /// `text` in the colour of `state`.
    pub fn paint(&self, text: &str, tone: Tone) -> String {
        if !self.color {
            return text.to_string();
        }
        let code = match tone {
            Tone::Good => "32",
            Tone::Bad => "31",
            Tone::Busy => "36",
            Tone::Waiting => "33",
            Tone::Undone => "35",
            Tone::Quiet => "2",
            Tone::Plain => "0",
        };
        format!("\x1b[{code}m{text}\x1b[0m")
    }

    /// A table's line: on a terminal, cut at its width with `…` (colour
    /// codes take no room; the cut never splits one); whole into a pipe.
    pub fn row(&self, line: String) {
        match self.width {
            Some(w) => println!("{}", fit(&line, w)),
            None => println!("{line}"),
        }
    }

    fn state(&self, s: &str, tone: Tone, width: usize) -> String {
        self.paint(&format!("{s:<width$}"), tone)
    }
}

/// `line` in `width` visible characters: cut with `…` when longer, the
/// colour reset after a cut inside a painted span.
fn fit(line: &str, width: usize) -> String {
    let mut out = String::with_capacity(line.len().min(width * 4));
    let (mut seen, mut painted) = (0, false);
    let mut chars = line.chars().peekable();
    let visible = strip_ansi_len(line);
    if visible <= width {
        return line.to_string();
    }
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            out.push(c);
            for d in chars.by_ref() {
                out.push(d);
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
            painted = true;
            continue;
        }
        if seen + 1 == width {
            out.push('…');
            break;
        }
        out.push(c);
        seen += 1;
    }
    if painted {
        out.push_str("\x1b[0m");
    }
    out
}

/// The characters of `line` a terminal shows (colour codes left out).
fn strip_ansi_len(line: &str) -> usize {
    let (mut n, mut in_code) = (0, false);
    for c in line.chars() {
        match (in_code, c) {
            (false, '\x1b') => in_code = true,
            (true, c) if c.is_ascii_alphabetic() => in_code = false,
            (true, _) => {}
            (false, _) => n += 1,
        }
    }
    n
}

fn when(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string()).unwrap_or_else(|| "-".into())
}

pub(super) fn took(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}s", (b - a).num_milliseconds() as f64 / 1000.0),
        _ => "-".into(),
    }
}

/// The error column's least width on a terminal, before task names are cut.
const ERROR_ROOM: usize = 24;

/// `apollo ls`: on a terminal, the table fits its width (narrow ones drop
/// the attempt and queue columns, dates of today lose their day, and each
/// error is cut at the edge with `…`: `apollo show` has it whole); into a
/// pipe every column and every error is whole.
pub fn list(out: &Out, items: &[Instance]) {
    if items.is_empty() {
        println!("no instances");
        return;
    }
    let wide = out.width.is_none_or(|w| w >= 140);
    let task_w = items.iter().map(|i| i.task.chars().count()).max().unwrap_or(4).clamp(4, 20);
    let created_w = if wide { 19 } else { 11 };
    // The error column gets the room: on a terminal the task names give way
    // (to 4 characters, `…`-cut) before it drops under ERROR_ROOM.
    let fixed = 26 + 2 + 2 + 11 + 2 + created_w + 2 + if wide { 7 + 2 + 10 + 2 } else { 0 };
    let task_w = match out.width {
        Some(w) => task_w.min(w.saturating_sub(fixed + ERROR_ROOM)).max(4),
        None => task_w,
    };
    let today = chrono::Utc::now().date_naive();
    let created = |t: DateTime<Utc>| match (wide, t.date_naive() == today) {
        (false, true) => t.format("%H:%M:%S").to_string(),
        (false, false) => t.format("%m-%d %H:%M").to_string(),
        (true, _) => when(Some(t)),
    };
    let mut head = format!("{:<26}  {:<task_w$}  {:<11}  ", "ID", "TASK", "STATE");
    if wide {
        head.push_str(&format!("{:>7}  {:<10}  ", "ATTEMPT", "QUEUE"));
    }
    head.push_str(&format!("{:<created_w$}  ", "CREATED"));
    // Exactly what is left of the width: no line is longer than the terminal.
    let room = out.width.map(|w| w.saturating_sub(head.chars().count()));
    println!("{head}{}", apollo_shared::text::one_line("ERROR", room.unwrap_or(usize::MAX)));
    for i in items {
        let task: String = apollo_shared::text::one_line(&i.task, task_w);
        let mut line = format!("{:<26}  {task:<task_w$}  {}  ", i.id, out.state(i.state.as_str(), i.state.tone(), 11));
        if wide {
            line.push_str(&format!("{:>7}  {:<10}  ", i.attempt, i.queue));
        }
        line.push_str(&format!("{:<created_w$}  ", created(i.created_at)));
        // Why it waits, that it succeeded with failed steps, or its error.
        let note = i.note().unwrap_or_default();
        line.push_str(&apollo_shared::text::one_line(&note, room.unwrap_or(usize::MAX)));
        println!("{line}");
    }
}

pub fn instance(out: &Out, i: &Instance) {
    println!("{} {} {}", out.paint(i.state.as_str(), i.state.tone()), i.task, i.id);
    println!("  attempt {}   queue {}   priority {}   trace {}", i.attempt, i.queue, i.priority, i.trace_id);
    println!("  created {}   finished {}", when(Some(i.created_at)), when(i.finished_at));
    if let Some(e) = &i.error {
        println!("  error: {e}");
    }
    if let Some(w) = i.waiting.as_ref().filter(|_| i.state.is_waiting()) {
        println!("  {w}");
    }
    if let Some(n) = i.note().filter(|_| i.state == apollo_shared::state::TaskState::Success) {
        println!("  {n}");
    }
    if !i.locks.is_empty() {
        println!("  locks: {}", i.locks.join(", "));
    }
    if let Some((parent, seq)) = parent_of(i.dedup_key.as_deref()) {
        println!("  child of {parent} step {seq} (a sub-runbook; apollo show {parent})");
    }
    for (plugin, pin) in i.pins.iter().flatten() {
        let arm = if pin.new { "new" } else { "old" };
        println!("  rollout: {plugin} {} ({arm} arm of {})", pin.version, pin.rollout);
    }
    let Some(steps) = &i.steps else { return };
    println!("  {:<4} {:<16} {:<24} {:<11} {:>8} {:>8}  OUTPUT", "SEQ", "STEP", "PLUGIN", "STATE", "ATTEMPTS", "TOOK");
    for s in steps {
        let plugin = match &s.plugin_version {
            Some(v) if !v.is_empty() => format!("{}@{v}", s.plugin),
            _ => s.plugin.clone(),
        };
        let detail = match (&s.output, &s.error) {
            (_, Some(e)) => format!("error: {e}"),
            (Some(o), None) => match (o.get("path"), o.get("instance"), s.plugin.as_str()) {
                (_, Some(Value::String(child)), "task") => format!("→ child {child}"),
                (Some(Value::String(p)), ..) => format!("→ {p}"),
                _ => String::new(),
            },
            _ => String::new(),
        };
        println!(
            "  {:<4} {:<16} {:<24} {} {:>8} {:>8}  {}",
            s.seq,
            s.name,
            plugin,
            out.state(s.state.as_str(), s.state.tone(), 11),
            s.attempts,
            took(s.started_at, s.finished_at),
            detail
        );
        if let Some(t) = &s.timeout {
            println!("  {:<4} timeout {} ({})", "", apollo_shared::protocol::timeout_text(t.secs), t.basis);
        }
        if let Some(n) = &s.items {
            println!("  {:<4} {}  (apollo show {} --items)", "", n.line(), i.id);
        }
    }
}

pub fn history(out: &Out, i: &Instance) {
    let Some(ts) = &i.transitions else { return };
    println!("  history:");
    for t in ts {
        let what = t.step.map(|s| format!("step {s}")).unwrap_or_else(|| "instance".into());
        println!(
            "    {}  {:<9} {} -> {}  {}  ({})",
            when(Some(t.at)),
            what,
            t.from.as_deref().unwrap_or("-"),
            out.paint(&t.to, Tone::of_name(&t.to)),
            t.reason,
            t.actor
        );
    }
}

pub fn dry_run(out: &Out, r: &DryRunResult) {
    let verdict = if r.valid { out.paint("valid", Tone::Good) } else { out.paint("invalid", Tone::Bad) };
    println!("dry-run {}: {verdict} (nothing was executed)", r.task);
    for s in &r.steps {
        let mark = if s.valid { out.paint("ok", Tone::Good) } else { out.paint("error", Tone::Bad) };
        println!("  {} {} ({} {})  {mark}", s.seq, s.name, s.plugin, s.version.as_deref().unwrap_or("?"));
        if let Some(f) = &s.fanout {
            println!("      {} (params below: the first item's)", f.line());
        }
        params_text(&s.params, "      ");
        if let Some(t) = &s.timeout {
            // 0: none (an approval that waits until decided).
            let secs = if t.secs > 0.0 { apollo_shared::protocol::timeout_text(t.secs) } else { "none".into() };
            println!("      timeout: {secs} ({})", t.basis);
        }
        if !s.unresolved.is_empty() {
            println!("      resolved at run time: {}", s.unresolved.join(", "));
        }
        if let Some(e) = &s.error {
            println!("      {e}");
        }
    }
}

/// A step's params as the text they are, one a line under `indent`: a
/// value of several lines (a script) as its lines, indented; other values
/// as JSON.
fn params_text(params: &serde_json::Value, indent: &str) {
    let Some(map) = params.as_object().filter(|m| !m.is_empty()) else {
        println!("{indent}params: {params}");
        return;
    };
    println!("{indent}params:");
    for (k, v) in map {
        match v.as_str() {
            Some(text) if text.contains('\n') => {
                println!("{indent}  {k}: |");
                for line in text.trim_end_matches('\n').lines() {
                    println!("{indent}    {line}");
                }
            }
            Some(text) => println!("{indent}  {k}: {text}"),
            None => println!("{indent}  {k}: {v}"),
        }
    }
}

pub fn defs(out: &Out, defs: &[DefInfo]) {
    for d in defs {
        if d.hash.is_some() {
            let next = d.next_fire.map(|n| format!("   next fire {}", rfc3339(n))).unwrap_or_default();
            out.row(format!(
                "{:<20} {:<10} steps: {}   {}{next}",
                d.task,
                d.queue.as_deref().unwrap_or(""),
                d.steps.join(" → "),
                d.file
            ));
        }
        for e in &d.errors {
            out.row(format!("{} {e}", out.paint("error", Tone::Bad)));
        }
    }
}

pub fn plugins(out: &Out, plugins: &[PluginInfo]) {
    out.row(format!(
        "{:<18} {:<8} {:>8} {:>6} {:>6} {:>6} {:>8} {:>8} {:>9} {:>11} {:>12}  CLASS / COMMAND",
        "NAME", "VERSION", "TIMEOUT", "RETRY", "RUNS", "FAIL%", "P50", "P99", "SUGGESTED", "WORKERS", "WAIT p50/99"
    ));
    for p in plugins {
        let [runs, fail, p50, p99, suggested] = PluginStats::columns(p.stats.as_ref());
        let [workers, wait] = PoolStats::columns(p.pool.as_ref());
        // `auto` shows what applies now; its basis is in `--json`.
        let timeout = p.timeout_column();
        out.row(format!(
            "{:<18} {:<8} {:>8} {:>6} {runs:>6} {fail:>6} {p50:>8} {p99:>8} {suggested:>9} {workers:>11} {wait:>12}  {}",
            p.name,
            p.version,
            timeout,
            p.retry,
            p.class.as_deref().or(p.command.as_deref()).unwrap_or("")
        ));
        // On a shared store: which live agents have this version.
        if !p.agents.is_empty() {
            out.row(format!("{:<18} on {}", "", p.agents.join(", ")));
        }
    }
}

pub fn agents(out: &Out, agents: &[AgentInfo]) {
    out.row(format!(
        "{:<16} {:<22} {:<16} {:<8} {:>7} {:>10}  {:<10} QUEUES",
        "NAME", "ID", "HOST", "VERSION", "RUNNING", "HEARTBEAT", "STATE"
    ));
    for a in agents {
        let state = if a.stopped {
            out.paint("stopped", Tone::Quiet)
        } else if a.late {
            out.paint("late", Tone::Bad)
        } else {
            out.paint("live", Tone::Good)
        };
        out.row(format!(
            "{:<16} {:<22} {:<16} {:<8} {:>7} {:>9.1}s  {:<10} {}",
            a.name,
            a.id,
            a.host,
            a.version,
            a.running,
            a.heartbeat_age_secs,
            state,
            a.serves()
        ));
        if !a.plugins.is_empty() {
            out.row(format!("  plugins: {}", a.plugins_column()));
        }
    }
}

pub fn queues(out: &Out, queues: &[QueueStats]) {
    out.row(format!(
        "{:<12} {:>8} {:>6} {:>8} {:>9}  OLDEST PENDING",
        "QUEUE", "RUNNING", "LIMIT", "PENDING", "RETRYING"
    ));
    for q in queues {
        let limit = q.limit.map(|l| l.to_string()).unwrap_or_else(|| "-".into());
        let oldest = q.oldest_pending_secs.map(|s| format!("{s:.0}s")).unwrap_or_else(|| "-".into());
        let paused = q.paused.as_deref().map(|p| format!("  PAUSED {p}")).unwrap_or_default();
        out.row(format!(
            "{:<12} {:>8} {:>6} {:>8} {:>9}  {oldest}{paused}",
            q.queue, q.running, limit, q.pending, q.retrying
        ));
    }
}

pub fn alerts(out: &Out, alerts: &[Alert]) {
    if alerts.is_empty() {
        out.row("no alerts".to_string());
    }
    for a in alerts {
        out.row(format!("{}  {:<20} {}  {}", rfc3339(a.at), a.kind, a.instance.as_deref().unwrap_or("-"), a.message));
    }
}

pub fn status(out: &Out, s: &AgentStatus) {
    println!("agent {} (version {}, pid {})", s.agent, s.version, s.pid);
    println!("  up {:.0}s   store {}   socket {}", s.uptime_secs, s.store, s.socket);
    let why = s.cores.map(|c| format!(" (2 × {c} core{})", if c == 1 { "" } else { "s" })).unwrap_or_default();
    println!(
        "  tasks {}   definitions {} ({} with errors)   concurrency {}{why}",
        s.tasks_dir, s.definitions, s.definition_errors, s.concurrency
    );
    let counts: Vec<String> = s.counts.iter().map(|(k, n)| format!("{} {n}", out.paint(k, Tone::of_name(k)))).collect();
    println!("  {}", counts.join("   "));
    for p in &s.paused {
        println!("  {}  {}", out.paint("PAUSED", Tone::Waiting), p.line());
    }
}

pub fn events(out: &Out, events: &[EventRecord]) {
    if events.is_empty() {
        out.row("no events".to_string());
    }
    for e in events {
        let created = e.instances.as_array().map(|a| a.len()).unwrap_or(0);
        let data = e.data.clone().unwrap_or(Value::Null);
        out.row(format!("{}  {:<24} created {created}  data {data}", e.received_at, e.name));
    }
}

pub fn audit(out: &Out, entries: &[AuditEntry]) {
    for r in entries {
        let step = r.step.map(|s| format!(" step {s}")).unwrap_or_default();
        out.row(format!(
            "{}  {}  {} {}{}  {} -> {}  {}",
            r.at,
            r.actor,
            r.task.as_deref().unwrap_or("?"),
            r.instance,
            step,
            r.from.as_deref().unwrap_or("-"),
            r.to,
            r.reason
        ));
    }
}

/// A time as the protocol carries it.
fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// A value as `--json` prints it.
pub fn print_json(v: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}
