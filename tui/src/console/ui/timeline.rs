//! The timeline of one instance: every step as a bar on a time axis, one
//! segment per attempt coloured by its outcome, with durations; the history
//! underneath.

use super::super::app::{App, View};
use super::theme::Theme;
use apollo_shared::protocol::Instance;
use apollo_shared::state::{StepState, Tone};
use chrono::{DateTime, Utc};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};

/// The most lines an instance's error takes under its bars (it is whole in
/// the step's output pane and in `apollo show`).
const ERROR_LINES: usize = 6;
use ratatui::Frame;

/// One attempt of a step: when it ran and how it ended (RUNNING if it still runs).
pub struct Segment {
    pub start: DateTime<Utc>,
    pub end: Option<DateTime<Utc>>,
    pub outcome: String,
}

/// Attempts of each step, from the history.
pub fn segments(i: &Instance, seq: u32) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    for t in i.transitions.iter().flatten().filter(|t| t.step == Some(seq)) {
        match t.to.parse::<StepState>() {
            Ok(StepState::Running) => out.push(Segment { start: t.at, end: None, outcome: t.to.clone() }),
            Ok(StepState::Success | StepState::Failed) => {
                if let Some(s) = out.last_mut().filter(|s| s.end.is_none()) {
                    s.end = Some(t.at);
                    s.outcome = t.to.clone();
                }
            }
            _ => {}
        }
    }
    out
}

pub fn draw(f: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let Some(i) = &app.instance else {
        f.render_widget(Paragraph::new("no instance selected").block(Block::default().borders(Borders::ALL)), area);
        return;
    };
    let steps = i.steps.clone().unwrap_or_default();
    let operator: Vec<&apollo_shared::protocol::Transition> =
        i.transitions.iter().flatten().filter(|t| t.by_operator()).collect();
    let ops_h = if operator.is_empty() { 0 } else { (operator.len() as u16 + 2).min(6) };
    // The error in full, wrapped under the bars (at most ERROR_LINES lines).
    let error: Vec<String> = i
        .error
        .as_ref()
        .map(|e| super::text::wrap(&format!("error: {e}"), area.width.saturating_sub(2) as usize))
        .unwrap_or_default()
        .into_iter()
        .take(ERROR_LINES)
        .collect();
    let bars_h = steps.len() as u16 + 3 + error.len() as u16;
    let [bars, ops, history] =
        Layout::vertical([Constraint::Length(bars_h), Constraint::Length(ops_h), Constraint::Min(3)]).areas(area);
    let title = Line::from(vec![
        Span::raw(format!(" {} {} ", i.task, i.id)),
        Span::styled(format!("{} ", i.state.as_str()), theme.tone(i.state.tone())),
        Span::raw(format!("attempt {} ", i.attempt)),
    ]);
    let block = Block::default().borders(Borders::ALL).title(title);
    let inner = block.inner(bars);
    f.render_widget(block, bars);
    let start = i.created_at;
    let end = i.finished_at.unwrap_or_else(Utc::now).max(start + chrono::Duration::milliseconds(1));
    let span_ms = (end - start).num_milliseconds().max(1) as f64;
    let label_w = 18usize;
    let tail_w = 22usize;
    let bar_w = (inner.width as usize).saturating_sub(label_w + tail_w).max(10);
    let col = |t: DateTime<Utc>| {
        (((t - start).num_milliseconds() as f64 / span_ms) * bar_w as f64).floor().clamp(0.0, bar_w as f64 - 1.0)
            as usize
    };
    let mut lines = Vec::new();
    for (n, s) in steps.iter().enumerate() {
        let mut cells: Vec<Span> = vec![Span::raw(" ".repeat(bar_w))];
        let segs = segments(i, s.seq);
        let mut row: Vec<(char, String)> = vec![('·', String::new()); bar_w];
        for seg in &segs {
            let (a, b) = (col(seg.start), col(seg.end.unwrap_or(end)));
            for c in row.iter_mut().take(b + 1).skip(a) {
                *c = ('█', seg.outcome.clone());
            }
        }
        cells.clear();
        for (ch, outcome) in row {
            cells.push(Span::styled(
                ch.to_string(),
                if outcome.is_empty() { theme.dim() } else { theme.tone(Tone::of_name(&outcome)) },
            ));
        }
        let took = match (s.started_at, s.finished_at) {
            (Some(a), Some(b)) => format!("{:.2}s", (b - a).num_milliseconds() as f64 / 1000.0),
            (Some(_), None) => "…".into(),
            _ => "-".into(),
        };
        let name = format!(
            "{:<w$}",
            format!("{} {}", s.seq, s.name).chars().take(label_w - 1).collect::<String>(),
            w = label_w
        );
        let mut spans =
            vec![Span::styled(name, if n == app.sel(View::Timeline) { theme.selected() } else { Default::default() })];
        spans.extend(cells);
        spans.push(Span::styled(format!(" {:<11}", s.state.as_str()), theme.tone(s.state.tone())));
        spans.push(Span::raw(format!("{took:>6} ×{}", segs.len().max(s.attempts as usize))));
        lines.push(Line::from(spans));
        // A fan-out step: its items, counted.
        if let Some(n) = &s.items {
            lines.push(Line::styled(format!("{:<w$}items: {}", "", n.line(), w = label_w), theme.dim()));
        }
    }
    lines.push(Line::styled(
        format!("{:<w$}{} … {}", "", start.format("%H:%M:%S%.3f"), end.format("%H:%M:%S%.3f"), w = label_w),
        theme.dim(),
    ));
    lines.extend(error.into_iter().map(|l| Line::styled(l, theme.error())));
    f.render_widget(Paragraph::new(lines), inner);
    if ops_h > 0 {
        // Who did what to it, and why: the operator's own words first.
        let rows: Vec<Line> = operator
            .iter()
            .rev()
            .take(ops_h as usize - 2)
            .map(|t| {
                Line::from(vec![
                    Span::raw(format!("{} ", t.at.format("%m-%d %H:%M:%S"))),
                    Span::styled(format!("{:<11}", t.to), theme.tone(Tone::of_name(&t.to))),
                    Span::raw(format!("{}  — {}", t.reason, t.actor)),
                ])
            })
            .collect();
        let title = format!(" operator actions ({}, newest first) ", operator.len());
        let block = Block::default().borders(Borders::ALL).title(title);
        f.render_widget(Paragraph::new(rows).wrap(Wrap { trim: false }).block(block), ops);
    }
    let hist: Vec<Line> = i
        .transitions
        .iter()
        .flatten()
        .rev()
        .take(history.height.saturating_sub(2) as usize)
        .map(|t| {
            let what = t.step.map(|s| format!("step {s}")).unwrap_or_else(|| "instance".into());
            Line::from(vec![
                Span::raw(format!(
                    "{} {:<9} {} -> ",
                    t.at.format("%H:%M:%S%.3f"),
                    what,
                    t.from.as_deref().unwrap_or("-")
                )),
                Span::styled(t.to.clone(), theme.tone(Tone::of_name(&t.to))),
                Span::raw(format!("  {}  ({})", t.reason, t.actor)),
            ])
        })
        .collect();
    f.render_widget(
        Paragraph::new(hist)
            .wrap(Wrap { trim: false })
            .block(Block::default().borders(Borders::ALL).title(" history (newest first) ")),
        history,
    );
}
