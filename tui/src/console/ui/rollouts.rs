//! The plugins view with, under the plugins, the rollouts: the running
//! ones and the latest ended one of each plugin, each comparing its two
//! versions since its start (as `apollo rollout` does).

use super::super::app::App;
use super::{lists, Theme};
use apollo_shared::protocol::{Rollout, RolloutState};
use apollo_shared::state::Tone;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use ratatui::Frame;

/// The rollouts worth showing: every running one, and each plugin's latest.
fn shown(app: &App) -> Vec<&Rollout> {
    let mut seen: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for r in &app.rollouts {
        if r.state == RolloutState::Running || !seen.contains(&r.plugin.as_str()) {
            out.push(r);
        }
        seen.push(&r.plugin);
    }
    out
}

pub fn plugins(f: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let shown = shown(app);
    if shown.is_empty() {
        return lists::plugins(f, area, app, theme);
    }
    let lines: Vec<Line> = shown.iter().flat_map(|r| lines(r, theme)).collect();
    let height = (lines.len() as u16 + 2).min(area.height / 2);
    let [top, bottom] = Layout::vertical([Constraint::Min(3), Constraint::Length(height)]).areas(area);
    lists::plugins(f, top, app, theme);
    let block = Block::default().borders(Borders::ALL).title(" rollouts ");
    f.render_widget(Paragraph::new(lines).block(block), bottom);
}

fn lines<'a>(r: &Rollout, theme: &Theme) -> Vec<Line<'a>> {
    let tone = match r.state {
        RolloutState::Running => Tone::Busy,
        RolloutState::Promoted => Tone::Good,
        RolloutState::Aborted => Tone::Bad,
    };
    let mut out = vec![Line::from(vec![
        Span::styled(format!("{:<9}", r.state.as_str()), theme.tone(tone)),
        Span::raw(r.heading()),
    ])];
    if let Some(end) = r.ending() {
        out.push(Line::from(format!("          {end}")));
    }
    out.push(Line::from(format!("          {:<20} {:>6} {:>6} {:>9} {:>9}", "VERSION", "RUNS", "FAIL%", "P50", "P99")));
    for [v, runs, fail, p50, p99] in r.comparison() {
        out.push(Line::from(format!("          {v:<20} {runs:>6} {fail:>6} {p50:>9} {p99:>9}")));
    }
    out
}
