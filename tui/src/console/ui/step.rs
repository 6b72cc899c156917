//! One step: params as resolved, context before and after, output and error,
//! plugin and version, logs. JSON panes are folding trees.

use super::super::app::{App, Pane, View};
use super::super::json;
use super::text::scrolled;
use super::theme::Theme;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Tabs};
use ratatui::Frame;

pub fn draw(f: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let Some(i) = &app.instance else { return };
    let Some(s) = i.steps.as_ref().and_then(|st| st.iter().find(|s| s.seq == app.step)) else {
        f.render_widget(Paragraph::new("no such step").block(Block::default().borders(Borders::ALL)), area);
        return;
    };
    let [tabs, body] = Layout::vertical([Constraint::Length(3), Constraint::Min(3)]).areas(area);
    let title = Line::from(vec![
        Span::raw(format!(" step {} {} — {}@{} ", s.seq, s.name, s.plugin, s.plugin_version.as_deref().unwrap_or("?"))),
        Span::styled(format!("{} ", s.state.as_str()), theme.tone(s.state.tone())),
        Span::raw(format!("attempts {} ", s.attempts)),
        // A learned timeout, as its last attempt ran under it (`timeout: auto`).
        Span::raw(match &s.timeout {
            Some(t) => format!("timeout {} (learned) ", apollo_shared::protocol::timeout_text(t.secs)),
            None => String::new(),
        }),
    ]);
    let sel = Pane::ALL.iter().position(|p| *p == app.pane).unwrap_or(0);
    let t = Tabs::new(Pane::ALL.iter().map(|p| p.title()))
        .select(sel)
        .highlight_style(theme.selected())
        .block(Block::default().borders(Borders::ALL).title(title));
    f.render_widget(t, tabs);
    let block =
        Block::default().borders(Borders::ALL).title(format!(" {} (Tab: next pane, Enter: fold) ", app.pane.title()));
    let (height, width) = (body.height.saturating_sub(2) as usize, body.width.saturating_sub(2) as usize);
    // Long values and lines wrap: nothing is cut at the pane's edge.
    let lines: Vec<Line> = match app.pane_value() {
        Some(v) => {
            let rows: Vec<String> = json::lines(&v, &app.folds).into_iter().map(|(_, text)| text).collect();
            scrolled(&rows, width, height, app.sel(View::Step), false, theme)
        }
        None if app.logs.is_empty() => {
            vec![Line::styled("(no log lines yet; they show here as they are written)", theme.dim())]
        }
        None => {
            let rows: Vec<String> = app.logs.lines().map(str::to_string).collect();
            scrolled(&rows, width, height, app.sel(View::Step), app.logs_tail, theme)
        }
    };
    let block = if app.pane == Pane::Logs {
        let follow = if app.logs_tail { "following the instance" } else { "scrolled; G follows" };
        Block::default().borders(Borders::ALL).title(format!(" logs of every step, {follow} (Tab: next pane) "))
    } else {
        block
    };
    f.render_widget(Paragraph::new(lines).block(block), body);
}
