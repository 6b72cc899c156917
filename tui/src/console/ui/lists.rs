//! The list views. Only the rows that fit are built (the tasks view holds
//! one page at a time and asks the agent for the next as you scroll).

use super::super::app::{App, View};
use super::theme::Theme;
use apollo_shared::state::Tone;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};
use ratatui::Frame;

/// The first row shown so that `sel` is visible in `height` rows.
fn offset(sel: usize, height: usize) -> usize {
    if height == 0 || sel < height {
        0
    } else {
        sel + 1 - height
    }
}

/// What a list view shows besides its rows.
struct Shape<'a> {
    title: String,
    header: Vec<&'a str>,
    widths: Vec<Constraint>,
    empty: &'a str,
    /// The selected row's long value (an error, a message), shown whole
    /// under the table, wrapped: (its name, the text).
    detail: Option<(&'a str, String)>,
}

/// The most lines the selected row's long value takes under a table.
const DETAIL_LINES: usize = 6;

fn table(f: &mut Frame, area: Rect, app: &App, theme: &Theme, view: View, shape: Shape, rows: Vec<Vec<Cell>>) {
    let Shape { title, header, widths, empty, detail } = shape;
    let block = Block::default().borders(Borders::ALL).title(title);
    if rows.is_empty() {
        // Nothing to show, or a filter that hides everything: say which.
        let filter = app.filter(view);
        let text = if filter.is_empty() {
            empty.to_string()
        } else {
            format!("nothing matches the filter {filter:?} (Esc clears it)")
        };
        f.render_widget(Paragraph::new(Line::styled(text, theme.dim())).block(block), area);
        return;
    }
    // The last column's room: what the fixed columns and the gaps leave.
    let fixed: u16 = widths.iter().map(|c| if let Constraint::Length(n) = c { *n } else { 0 }).sum();
    let last = area.width.saturating_sub(2 + fixed + widths.len().saturating_sub(1) as u16) as usize;
    let cut = |text: &String| text.chars().count() > last;
    let area = match detail.filter(|(_, text)| !text.is_empty() && cut(text) && area.height >= 12) {
        Some((name, text)) => {
            let lines = super::text::wrap(&text, area.width.saturating_sub(2) as usize);
            let shown = lines.len().min(DETAIL_LINES).min(area.height as usize / 3);
            let [list, below] =
                Layout::vertical([Constraint::Min(4), Constraint::Length(shown as u16 + 2)]).areas(area);
            let more = if lines.len() > shown {
                format!(", {} more lines: open it", lines.len() - shown)
            } else {
                String::new()
            };
            let body: Vec<Line> = lines.into_iter().take(shown).map(Line::from).collect();
            let title = format!(" {name}{more} ");
            f.render_widget(Paragraph::new(body).block(Block::default().borders(Borders::ALL).title(title)), below);
            list
        }
        None => area,
    };
    let height = area.height.saturating_sub(3) as usize;
    let sel = app.sel(view).min(rows.len() - 1);
    let first = offset(sel, height);
    let shown: Vec<Row> = rows
        .into_iter()
        .enumerate()
        .skip(first)
        .take(height)
        .map(|(i, cells)| {
            let r = Row::new(cells);
            if i == sel {
                r.style(theme.selected())
            } else {
                r
            }
        })
        .collect();
    let t = Table::new(shown, widths).header(Row::new(header).style(theme.dim())).block(block);
    f.render_widget(t, area);
}

fn ago(secs: Option<f64>) -> String {
    match secs {
        None => "-".into(),
        Some(s) if s < 120.0 => format!("{s:.0}s"),
        Some(s) if s < 7200.0 => format!("{:.0}m", s / 60.0),
        Some(s) => format!("{:.0}h", s / 3600.0),
    }
}

pub fn queues(f: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let rows = app
        .visible_queues()
        .iter()
        .map(|q| {
            vec![
                Cell::from(q.queue.clone()),
                Cell::from(format!("{}/{}", q.running, q.limit.map(|l| l.to_string()).unwrap_or_else(|| "-".into()))),
                Cell::from(q.pending.to_string()),
                Cell::from(q.retrying.to_string()),
                Cell::from(ago(q.oldest_pending_secs)),
                Cell::from(match app.rates.iter().find(|r| r.queue == q.queue) {
                    Some(r) => format!("{} ({} failed)", r.ended, r.failed),
                    None => "0".into(),
                }),
            ]
        })
        .collect();
    let widths = vec![
        Constraint::Min(12),
        Constraint::Length(12),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(15),
        Constraint::Length(18),
    ];
    table(
        f,
        area,
        app,
        theme,
        View::Queues,
        Shape {
            title: " queues ".into(),
            header: vec!["QUEUE", "RUNNING", "PENDING", "RETRYING", "OLDEST PENDING", "ENDED IN 1H"],
            widths,
            empty: "no queues yet",
            detail: None,
        },
        rows,
    );
}

pub fn tasks(f: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let visible = app.visible_tasks();
    let more = if app.next_cursor.is_some() { "+" } else { "" };
    let what = if app.archived { "archived tasks" } else { "tasks" };
    let marked = if app.marked.is_empty() { String::new() } else { format!(", {} marked", app.marked.len()) };
    let title = format!(" {what} ({}{more}{marked}) sorted by {} ", visible.len(), super::super::app::SORTS[app.sort]);
    // Narrow: the attempt and queue columns go, and times of today show
    // without their date, so what stays is whole.
    let wide = area.width >= 110;
    let today = chrono::Utc::now().date_naive();
    let rows = visible
        .iter()
        .map(|i| {
            // A marked instance's id is shown with a leading "*".
            let id = if app.marked.contains(&i.id) { format!("*{}", i.id) } else { i.id.clone() };
            let created = if wide || i.created_at.date_naive() != today {
                i.created_at.format("%m-%d %H:%M:%S")
            } else {
                i.created_at.format("%H:%M:%S")
            };
            let mut cells = vec![
                Cell::from(id),
                Cell::from(i.task.clone()),
                Cell::from(Span::styled(i.state.as_str(), theme.tone(i.state.tone()))),
            ];
            if wide {
                cells.extend([Cell::from(i.attempt.to_string()), Cell::from(i.queue.clone())]);
            }
            cells.extend([Cell::from(created.to_string()), Cell::from(i.error.clone().unwrap_or_default())]);
            cells
        })
        .collect();
    let (widths, header) = if wide {
        (
            vec![
                Constraint::Length(27),
                Constraint::Length(16),
                Constraint::Length(11),
                Constraint::Length(3),
                Constraint::Length(8),
                Constraint::Length(14),
                Constraint::Min(10),
            ],
            vec!["ID", "TASK", "STATE", "ATT", "QUEUE", "CREATED", "ERROR"],
        )
    } else {
        (
            vec![
                Constraint::Length(27),
                Constraint::Length(14),
                Constraint::Length(11),
                Constraint::Length(14),
                Constraint::Min(6),
            ],
            vec!["ID", "TASK", "STATE", "CREATED", "ERROR"],
        )
    };
    let error = visible.get(app.sel(View::Tasks)).and_then(|i| i.error.clone()).unwrap_or_default();
    table(
        f,
        area,
        app,
        theme,
        View::Tasks,
        Shape {
            title,
            header,
            widths,
            detail: Some(("error", error)),
            empty: if app.archived {
                "nothing archived yet (a: back to the live instances)"
            } else {
                "no instances (press : then defs, pick one, r to run it)"
            },
        },
        rows,
    );
}

pub fn defs(f: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let rows = app
        .visible_defs()
        .iter()
        .map(|d| {
            let detail = if let Some(e) = d.errors.first() {
                Cell::from(Span::styled(e.clone(), theme.error()))
            } else {
                Cell::from(d.steps.join(" → "))
            };
            let next = d
                .next_fire
                .map(|t| t.format("%m-%d %H:%M").to_string())
                .or(d.on_event.as_ref().map(|e| format!("on {e}")));
            vec![
                Cell::from(d.task.clone()),
                Cell::from(d.queue.clone().unwrap_or_default()),
                Cell::from(d.hash.as_deref().map(|h| h[..8.min(h.len())].to_string()).unwrap_or_else(|| "-".into())),
                Cell::from(d.schedule.clone().unwrap_or_default()),
                Cell::from(next.unwrap_or_default()),
                detail,
            ]
        })
        .collect();
    let widths = vec![
        Constraint::Length(16),
        Constraint::Length(8),
        Constraint::Length(9),
        Constraint::Length(12),
        Constraint::Length(14),
        Constraint::Min(20),
    ];
    table(
        f,
        area,
        app,
        theme,
        View::Defs,
        Shape {
            title: " defs ".into(),
            header: vec!["TASK", "QUEUE", "VERSION", "SCHEDULE", "NEXT", "STEPS / ERRORS"],
            widths,
            empty: "no definitions loaded",
            detail: app.visible_defs().get(app.sel(View::Defs)).map(|d| ("load error", d.errors.join("; "))),
        },
        rows,
    );
}

pub fn plugins(f: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    // The pool columns only when a plugin has a pool (worker mode).
    let pools = app.visible_plugins().iter().any(|p| p.pool.is_some());
    let rows = app
        .visible_plugins()
        .iter()
        .map(|p| {
            let params: Vec<String> = p.describe["params"]
                .as_array()
                .map(|a| a.iter().filter_map(|x| x["name"].as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            let last = match &p.error {
                Some(e) => Cell::from(Span::styled(e.clone(), theme.error())),
                None => Cell::from(params.join(", ")),
            };
            let [runs, fail, p50, p99, suggested] = apollo_shared::protocol::PluginStats::columns(p.stats.as_ref());
            let [workers, wait] = apollo_shared::protocol::PoolStats::columns(p.pool.as_ref());
            let mut cells = vec![
                Cell::from(p.name.clone()),
                Cell::from(p.version.clone()),
                Cell::from(format!("{}s", p.timeout_secs)),
                Cell::from(suggested),
                Cell::from(runs),
                Cell::from(fail),
                Cell::from(p50),
                Cell::from(p99),
                Cell::from(p.retry.to_string()),
                Cell::from(if p.idempotent { "yes" } else { "no" }),
            ];
            if pools {
                cells.extend([Cell::from(workers), Cell::from(wait)]);
            }
            cells.push(last);
            cells
        })
        .collect();
    let mut widths = vec![
        Constraint::Length(16),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(9),
        Constraint::Length(6),
        Constraint::Length(5),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(5),
        Constraint::Length(4),
    ];
    let mut header = vec!["NAME", "VERSION", "TIMEOUT", "SUGGESTED", "RUNS", "FAIL%", "P50", "P99", "RETRY", "IDEM"];
    if pools {
        widths.extend([Constraint::Length(11), Constraint::Length(11)]);
        header.extend(["WORKERS", "WAIT"]);
    }
    widths.push(Constraint::Min(16));
    header.push("PARAMS / ERROR");
    table(
        f,
        area,
        app,
        theme,
        View::Plugins,
        Shape {
            title: " plugins ".into(),
            header,
            widths,
            empty: "no plugins",
            detail: app
                .visible_plugins()
                .get(app.sel(View::Plugins))
                .and_then(|p| p.error.clone())
                .map(|e| ("why it is not usable", e)),
        },
        rows,
    );
}

pub fn alerts(f: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let rows = app
        .visible_alerts()
        .iter()
        .map(|a| {
            vec![
                Cell::from(a.at.format("%m-%d %H:%M:%S").to_string()),
                Cell::from(Span::styled(a.kind.as_str(), theme.error())),
                Cell::from(a.instance.clone().unwrap_or_default()),
                Cell::from(a.message.clone()),
            ]
        })
        .collect();
    let widths = vec![Constraint::Length(14), Constraint::Length(18), Constraint::Length(26), Constraint::Min(20)];
    table(
        f,
        area,
        app,
        theme,
        View::Alerts,
        Shape {
            title: " alerts ".into(),
            header: vec!["AT", "KIND", "INSTANCE", "MESSAGE"],
            widths,
            empty: "no alerts",
            detail: app.visible_alerts().get(app.sel(View::Alerts)).map(|a| ("message", a.message.clone())),
        },
        rows,
    );
}

pub fn agents(f: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let rows = app
        .visible_agents()
        .iter()
        .map(|a| {
            let state = if a.stopped {
                Span::styled("stopped", theme.dim())
            } else if a.late {
                Span::styled("late", theme.error())
            } else {
                Span::styled("live", theme.tone(Tone::Good))
            };
            vec![
                Cell::from(a.name.clone()),
                Cell::from(a.host.clone()),
                Cell::from(a.version.clone()),
                Cell::from(a.running.to_string()),
                Cell::from(format!("{:.1}s ago", a.heartbeat_age_secs)),
                Cell::from(state),
                Cell::from(a.queues.join(", ")),
            ]
        })
        .collect();
    let widths = vec![
        Constraint::Length(16),
        Constraint::Length(16),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(12),
        Constraint::Length(8),
        Constraint::Min(10),
    ];
    table(
        f,
        area,
        app,
        theme,
        View::Agents,
        Shape {
            title: format!(" agents ({}) ", app.visible_agents().len()),
            header: vec!["NAME", "HOST", "VERSION", "RUNNING", "HEARTBEAT", "STATE", "QUEUES"],
            widths,
            empty: "no agent has recorded a heartbeat yet",
            detail: None,
        },
        rows,
    );
}

/// Every context side by side: its connection and its agent's counts. A
/// narrow terminal drops the target, the agent and the reason it is down.
pub fn fleet(f: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    use super::super::app::FleetState;
    let wide = area.width >= 110;
    let count =
        |counts: &std::collections::BTreeMap<String, u64>, k: &str| counts.get(k).copied().unwrap_or(0).to_string();
    let rows = app
        .visible_fleet()
        .iter()
        .map(|c| {
            let current = app.context.as_ref().is_some_and(|cur| cur.name == c.name);
            let mut flags = Vec::new();
            if current {
                flags.push(if wide { "attached" } else { "*" });
            }
            if c.production {
                flags.push(if wide { "production" } else { "prod" });
            }
            if c.read_only {
                flags.push(if wide { "read-only" } else { "ro" });
            }
            let name =
                if c.production { Span::styled(c.name.clone(), theme.error()) } else { Span::raw(c.name.clone()) };
            let mut cells = vec![Cell::from(name)];
            if wide {
                cells.push(Cell::from(c.describe()));
            }
            let (state, agent, counts) = match app.fleet_state(&c.name) {
                FleetState::Connecting => (Span::styled("connecting", theme.tone(Tone::Waiting)), String::new(), None),
                FleetState::Unreachable(why) => (Span::styled("unreachable", theme.error()), why.clone(), None),
                FleetState::Up { agent, counts, store_error: Some(_) } => {
                    (Span::styled("store error", theme.error()), agent.clone(), Some(counts))
                }
                FleetState::Up { agent, counts, store_error: None } => {
                    (Span::styled("connected", theme.tone(Tone::Good)), agent.clone(), Some(counts))
                }
            };
            cells.push(Cell::from(state));
            if wide {
                cells.push(Cell::from(Span::styled(agent, theme.dim())));
            }
            for k in ["RUNNING", "PENDING", "FAILED", "SUCCESS"] {
                let n = counts.map(|c| count(c, k)).unwrap_or_default();
                cells.push(Cell::from(Span::styled(n, theme.tone(Tone::of_name(k)))));
            }
            cells.push(Cell::from(flags.join(", ")));
            cells
        })
        .collect();
    let (widths, header) = if wide {
        (
            vec![
                Constraint::Length(14),
                Constraint::Min(16),
                Constraint::Length(12),
                Constraint::Length(20),
                Constraint::Length(8),
                Constraint::Length(8),
                Constraint::Length(7),
                Constraint::Length(8),
                Constraint::Length(22),
            ],
            vec!["CONTEXT", "TARGET", "STATE", "AGENT", "RUNNING", "PENDING", "FAILED", "SUCCESS", "FLAGS"],
        )
    } else {
        (
            vec![
                Constraint::Min(12),
                Constraint::Length(12),
                Constraint::Length(5),
                Constraint::Length(5),
                Constraint::Length(5),
                Constraint::Length(7),
                Constraint::Length(12),
            ],
            vec!["CONTEXT", "STATE", "RUN", "PEND", "FAIL", "OK", "FLAGS"],
        )
    };
    table(
        f,
        area,
        app,
        theme,
        View::Fleet,
        Shape {
            title: format!(" fleet ({} contexts) — Enter attaches ", app.visible_fleet().len()),
            header,
            widths,
            empty: "no contexts: write them in $XDG_CONFIG_HOME/apollo/contexts.yaml",
            detail: None,
        },
        rows,
    );
}
