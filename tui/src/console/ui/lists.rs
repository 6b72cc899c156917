//! The list views. Only the rows that fit are built (the tasks view holds
//! one page at a time and asks the agent for the next as you scroll).

use super::super::app::{App, View};
use super::theme::Theme;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};
use ratatui::Frame;

/// The first row shown so that `sel` is visible in `height` rows.
pub(super) fn offset(sel: usize, height: usize) -> usize {
    if height == 0 || sel < height {
        0
    } else {
        sel + 1 - height
    }
}

/// What a list view shows besides its rows.
pub(super) struct Shape<'a> {
    pub title: String,
    pub header: Vec<&'a str>,
    pub widths: Vec<Constraint>,
    pub empty: &'a str,
    /// The selected row's long value (an error, a message), shown whole
    /// under the table, wrapped: (its name, the text).
    pub detail: Option<(&'a str, String)>,
}

/// The most lines the selected row's long value takes under a table.
const DETAIL_LINES: usize = 6;

pub(super) fn table(
    f: &mut Frame,
    area: Rect,
    app: &App,
    theme: &Theme,
    view: View,
    shape: Shape,
    rows: Vec<Vec<Cell>>,
) {
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

/// `text` in a column of `width`: cut with `…` when longer, never silently.
pub(super) fn fit(text: &str, width: usize) -> String {
    apollo_shared::text::one_line(text, width)
}

pub(super) fn ago(secs: Option<f64>) -> String {
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
                match &q.paused {
                    Some(_) => {
                        Cell::from(format!("{} PAUSED", q.queue)).style(theme.tone(apollo_shared::state::Tone::Bad))
                    }
                    None => Cell::from(q.queue.clone()),
                },
                Cell::from(format!("{}/{}", q.running, q.limit.map(|l| l.to_string()).unwrap_or_else(|| "-".into()))),
                Cell::from(q.pending.to_string()),
                Cell::from(q.retrying.to_string()),
                // The oldest still waiting has waited on since it was read.
                Cell::from(ago(q.oldest_pending_secs.map(|s| s + App::since(app.queues_at)))),
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
                Cell::from(fit(&i.task, if wide { 16 } else { 14 })),
                Cell::from(Span::styled(i.state.as_str(), theme.tone(i.state.tone()))),
            ];
            if wide {
                cells.extend([Cell::from(i.attempt.to_string()), Cell::from(i.queue.clone())]);
            }
            cells.extend([Cell::from(created.to_string()), Cell::from(i.note().unwrap_or_default())]);
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
    let error = visible.get(app.sel(View::Tasks)).and_then(|i| i.note()).unwrap_or_default();
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
                Cell::from(fit(&d.task, 16)),
                Cell::from(fit(d.queue.as_deref().unwrap_or_default(), 8)),
                Cell::from(d.hash.as_deref().map(|h| h[..8.min(h.len())].to_string()).unwrap_or_else(|| "-".into())),
                Cell::from(fit(d.schedule.as_deref().unwrap_or_default(), 12)),
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
        // "%m-%d %H:%M"; the fixed columns leave the last its least at 80.
        Constraint::Length(11),
        Constraint::Min(10),
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
                Cell::from(p.timeout_column()),
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
