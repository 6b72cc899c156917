//! Overlays: help, confirmation, the run form, a dry-run's plan.

use super::super::app::{App, Mode};
use super::super::keys::HELP;
use super::theme::Theme;
use apollo_shared::state::Tone;
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};
use ratatui::Frame;

fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let [r] = Layout::horizontal([Constraint::Length(w.min(area.width))]).flex(Flex::Center).areas(area);
    let [r] = Layout::vertical([Constraint::Length(h.min(area.height))]).flex(Flex::Center).areas(r);
    r
}

/// A box `w` wide (at most the screen) as tall as `lines` need once wrapped.
fn fitted(f: &mut Frame, area: Rect, w: u16, title: &str, lines: Vec<Line>) {
    let inner = w.min(area.width).saturating_sub(2).max(1) as usize;
    let h: usize = lines.iter().map(|l| l.width().max(1).div_ceil(inner)).sum();
    boxed(f, centered(area, w, (h as u16).saturating_add(2)), title, lines);
}

fn boxed(f: &mut Frame, area: Rect, title: &str, lines: Vec<Line>) {
    f.render_widget(Clear, area);
    f.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::default().borders(Borders::ALL).title(format!(" {title} "))),
        area,
    );
}

/// An overlay `w` wide of text lines, each wrapped to fit and styled whole,
/// as tall as they need up to the screen's height, scrolled by `scroll`
/// when they need more (the title says how much is left and how to scroll).
fn scrolling(f: &mut Frame, area: Rect, w: u16, title: &str, lines: Vec<(String, Style)>, scroll: usize) {
    let w = w.min(area.width);
    let inner = w.saturating_sub(2) as usize;
    let wrapped: Vec<Line> = lines
        .into_iter()
        .flat_map(|(text, style)| super::text::wrap(&text, inner).into_iter().map(move |l| Line::styled(l, style)))
        .collect();
    let room = area.height.saturating_sub(2) as usize;
    let first = scroll.min(wrapped.len().saturating_sub(room));
    let left = wrapped.len().saturating_sub(first + room);
    let title = match (first, left) {
        (0, 0) => title.to_string(),
        (_, 0) => format!("{title} (k: scroll up)"),
        _ => format!("{title} ({left} more lines: j or PgDn)"),
    };
    let shown: Vec<Line> = wrapped.into_iter().skip(first).take(room).collect();
    let h = shown.len() as u16 + 2;
    let r = centered(area, w, h);
    f.render_widget(Clear, r);
    f.render_widget(Paragraph::new(shown).block(Block::default().borders(Borders::ALL).title(format!(" {title} "))), r);
}

pub fn draw(f: &mut Frame, app: &App, theme: &Theme) {
    let area = f.area();
    match &app.mode {
        Mode::Help => {
            let mut lines: Vec<(String, Style)> =
                HELP.iter().map(|(k, what)| (format!("{k:<14} {what}"), Style::default())).collect();
            lines.push(("any other key closes this".into(), theme.dim()));
            scrolling(f, area, 84, "keys", lines, app.overlay_scroll);
        }
        Mode::Results(lines) => {
            let mut lines: Vec<(String, Style)> = lines.iter().map(|l| (l.clone(), Style::default())).collect();
            lines.push(("any other key closes".into(), theme.dim()));
            scrolling(f, area, 110, "results", lines, app.overlay_scroll);
        }
        Mode::Confirm(c) => {
            // Red and named so only on a production context.
            let title = if c.production { "confirm on production" } else { "confirm" };
            let style = if c.production { theme.error() } else { Default::default() };
            let lines: Vec<Line> = c.prompt().into_iter().map(|l| Line::styled(l, style)).collect();
            fitted(f, area, 110, title, lines)
        }
        Mode::Form(form) => {
            let mut lines = vec![Line::styled("Tab/↑↓ move, type to edit, Enter runs, Esc cancels", theme.dim())];
            for (n, (name, value, desc)) in form.fields.iter().enumerate() {
                let style = if n == form.focus { theme.selected() } else { Default::default() };
                lines.push(Line::from(vec![
                    Span::raw(format!("{name:>16}: ")),
                    Span::styled(format!("{value}▏"), style),
                ]));
                if !desc.is_empty() {
                    lines.push(Line::styled(format!("{:>18}{desc}", ""), theme.dim()));
                }
            }
            if let Some(e) = &form.error {
                lines.push(Line::styled(e.clone(), theme.error()));
            }
            boxed(f, centered(area, 76, lines.len() as u16 + 2), &format!("run {}", form.task), lines);
        }
        Mode::DryRun(r) => {
            let verdict = if r.valid { "valid" } else { "invalid" };
            let mut lines = vec![(format!("{}: {verdict} — nothing was executed", r.task), Style::default())];
            for s in &r.steps {
                let (mark, style) =
                    if s.valid { ("ok   ", theme.tone(Tone::Good)) } else { ("error", theme.tone(Tone::Bad)) };
                let version = s.version.as_deref().unwrap_or("?");
                lines.push((format!("{mark} {} {} ({} {version})", s.seq, s.name, s.plugin), style));
                // Params as a readable block: a multi-line command keeps its lines.
                let params: Vec<(String, String)> = super::super::json::lines(&s.params, &Default::default());
                lines.push(("      params:".into(), Style::default()));
                lines.extend(params.into_iter().map(|(_, l)| (format!("      {l}"), Style::default())));
                if !s.unresolved.is_empty() {
                    lines.push((format!("      resolved at run time: {}", s.unresolved.join(", ")), theme.dim()));
                }
                if let Some(e) = &s.error {
                    lines.push((format!("      {e}"), theme.error()));
                }
            }
            lines.push(("j/k scroll, any other key closes".into(), theme.dim()));
            scrolling(f, area, area.width.saturating_sub(4), "dry-run", lines, app.overlay_scroll);
        }
        _ => {}
    }
}
