//! Overlays: help, confirmation, the run form, a dry-run's plan.

use super::super::app::{App, Mode, Stage};
use super::super::keys::HELP;
use super::Theme;
use ratatui::layout::{Constraint, Flex, Layout, Rect};
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

pub fn draw(f: &mut Frame, app: &App, theme: &Theme) {
    let area = f.area();
    match &app.mode {
        Mode::Help => {
            let mut lines: Vec<Line> = HELP.iter().map(|(k, what)| Line::from(format!("{k:<24} {what}"))).collect();
            lines.push(Line::styled("any key closes this", theme.dim()));
            boxed(f, centered(area, 90, lines.len() as u16 + 2), "keys", lines);
        }
        Mode::Results(lines) => {
            let mut lines: Vec<Line> = lines.iter().map(|l| Line::from(l.clone())).collect();
            lines.push(Line::styled("any key closes", theme.dim()));
            fitted(f, area, 110, "results", lines);
        }
        Mode::Confirm(c) => {
            let title = if c.stage == Stage::Yes { "confirm" } else { "confirm on production" };
            let style = if c.stage == Stage::Yes { Default::default() } else { theme.error() };
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
            let mut lines = vec![Line::from(format!("{}: {verdict} — nothing was executed", r.task))];
            for s in &r.steps {
                let mark = if s.valid {
                    Span::styled("ok   ", theme.state("SUCCESS"))
                } else {
                    Span::styled("error", theme.state("FAILED"))
                };
                lines.push(Line::from(vec![
                    mark,
                    Span::raw(format!(" {} {} ({} {})", s.seq, s.name, s.plugin, s.version.as_deref().unwrap_or("?"))),
                ]));
                lines.push(Line::from(format!("      params: {}", s.params)));
                if !s.unresolved.is_empty() {
                    lines.push(Line::styled(
                        format!("      resolved at run time: {}", s.unresolved.join(", ")),
                        theme.dim(),
                    ));
                }
                if let Some(e) = &s.error {
                    lines.push(Line::styled(format!("      {e}"), theme.error()));
                }
            }
            lines.push(Line::styled("Esc or Enter closes", theme.dim()));
            boxed(f, centered(area, area.width.saturating_sub(4), lines.len() as u16 + 2), "dry-run", lines);
        }
        _ => {}
    }
}
