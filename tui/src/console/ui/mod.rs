//! Drawing: pure functions of `&App`. A header (agent, transport,
//! connection, counts, throughput), the current view, a status line, and the
//! overlay of the current mode.

mod fleet;
mod lists;
mod overlay;
mod rollouts;
mod step;
mod text;
mod theme;
mod timeline;

use super::app::{App, Conn, Mode, View};
use apollo_shared::state::Tone;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Sparkline};
use ratatui::Frame;
pub use theme::Theme;

pub fn draw(f: &mut Frame, app: &App, theme: &Theme) {
    let status_h = status_height(app, f.area().width);
    let [header, body, status] =
        Layout::vertical([Constraint::Length(3), Constraint::Min(3), Constraint::Length(status_h)]).areas(f.area());
    draw_header(f, header, app, theme);
    match app.view {
        View::Queues => lists::queues(f, body, app, theme),
        View::Tasks => lists::tasks(f, body, app, theme),
        View::Defs => lists::defs(f, body, app, theme),
        View::Plugins => rollouts::plugins(f, body, app, theme),
        View::Alerts => lists::alerts(f, body, app, theme),
        View::Agents => fleet::agents(f, body, app, theme),
        View::Fleet => fleet::fleet(f, body, app, theme),
        View::Timeline => timeline::draw(f, body, app, theme),
        View::Step => step::draw(f, body, app, theme),
    }
    draw_status(f, status, app, theme);
    overlay::draw(f, app, theme);
}

fn uptime(secs: f64) -> String {
    let s = secs as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

fn draw_header(f: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    // The throughput sparkline only where there is room beside the text.
    let spark_w = if area.width >= 110 { 24 } else { 0 };
    let [text, spark] = Layout::horizontal([Constraint::Min(40), Constraint::Length(spark_w)]).areas(area);
    let conn = match &app.conn {
        Conn::Connecting => Span::styled("● connecting", theme.tone(Tone::Waiting)),
        Conn::Connected => Span::styled("● connected", theme.tone(Tone::Good)),
        Conn::Lost { attempt, reason } => {
            Span::styled(format!("● disconnected (retry {attempt}): {reason}"), theme.tone(Tone::Bad))
        }
    };
    let agent = match (&app.hello, &app.status) {
        (Some(h), Some(s)) => {
            format!("agent {} v{} up {}", h.agent, h.version, uptime(s.uptime_secs + App::since(app.status_at)))
        }
        (Some(h), None) => format!("agent {} v{}", h.agent, h.version),
        _ => "agent ?".into(),
    };
    let role = if app.readonly() { "  [read-only]" } else { "" };
    let mut line1 = vec![Span::styled("Apollo-11 ", Style::default().add_modifier(Modifier::BOLD))];
    if let Some(c) = &app.context {
        // Production stands out: red, and named so without colour too.
        let (label, style) = if c.production {
            let s = if theme.color {
                Style::default().fg(Color::White).bg(Color::Red).add_modifier(Modifier::BOLD)
            } else {
                Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED)
            };
            (format!("[{} PRODUCTION]", c.name), s)
        } else {
            let s = if theme.color { Style::default().fg(Color::Cyan) } else { Style::default() };
            (format!("[{}]", c.name), s)
        };
        line1.push(Span::styled(label, style));
        line1.push(Span::raw(" "));
    }
    // The connection's state before the transport: a long socket path
    // on a narrow terminal must not hide that the console is disconnected.
    line1.extend([
        Span::raw(format!("{agent}  ")),
        conn,
        Span::raw(role),
        Span::raw(format!("  via {}", app.transport)),
    ]);
    let line1 = Line::from(line1);
    let mut counts = Vec::new();
    if let Some(s) = &app.status {
        for (k, v) in &s.counts {
            counts.push(Span::styled(format!("{k} {v}"), theme.tone(Tone::of_name(k))));
            counts.push(Span::raw("  "));
        }
        // What is paused stands out on the counts' line: those counts wait.
        if !s.paused.is_empty() {
            let what: Vec<String> = s.paused.iter().map(|p| p.what()).collect();
            counts.push(Span::styled(format!("PAUSED: {}", what.join(", ")), theme.tone(Tone::Bad)));
        }
    }
    let hour: u64 = app.throughput.iter().sum();
    let mut view = vec![
        Span::styled(format!("<{}>", app.view.name()), Style::default().add_modifier(Modifier::BOLD)),
        Span::raw(format!("  filter: {}", app.filter(app.view))),
    ];
    if spark_w == 0 {
        // No room for the sparkline: the hour's count goes on this line.
        view.push(Span::styled(format!("  · {hour} ended in 1h"), theme.dim()));
    }
    let view = Line::from(view);
    f.render_widget(Paragraph::new(vec![line1, Line::from(counts), view]), text);
    if spark_w == 0 {
        return;
    }
    let skip = app.throughput.len().saturating_sub(spark_w as usize);
    let data: Vec<u64> = app.throughput.iter().skip(skip).copied().collect();
    let title = Paragraph::new(format!("{hour} ended in 1h")).style(theme.dim());
    let [t, s] = Layout::vertical([Constraint::Length(1), Constraint::Length(2)]).areas(spark);
    f.render_widget(title, t);
    f.render_widget(Sparkline::default().data(&data).style(theme.tone(Tone::Busy)), s);
}

fn draw_status(f: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    // A line being typed shows with the refusal of the last Enter, if any.
    let message = app.shown_message();
    let typing = |prompt: String| match message {
        Some((m, true)) => {
            Line::from(vec![Span::raw(prompt), Span::raw("   "), Span::styled(m.clone(), theme.error())])
        }
        _ => Line::from(prompt),
    };
    let line = match (&app.mode, message) {
        (Mode::Command(t), _) => typing(format!(":{t}")),
        (Mode::Filter(t), _) => typing(format!("/{t}")),
        (_, Some((m, true))) => Line::styled(m.clone(), theme.error()),
        (_, Some((m, false))) => Line::from(m.clone()),
        _ => Line::styled("? keys  : views  / filter  Enter open  Esc back  q quit", theme.dim()),
    };
    // A long message wraps onto the lines `status_height` gave it.
    f.render_widget(Paragraph::new(line).wrap(ratatui::widgets::Wrap { trim: false }), area);
}

/// The status line's height at `width`: a message longer than the line
/// gets up to three, so a refusal is read whole.
fn status_height(app: &App, width: u16) -> u16 {
    let typed = match &app.mode {
        Mode::Command(t) | Mode::Filter(t) => t.chars().count() + 4,
        _ => 0,
    };
    let said = app.shown_message().map_or(0, |(m, _)| m.chars().count());
    ((typed + said).div_ceil(width.max(1) as usize)).clamp(1, 3) as u16
}
