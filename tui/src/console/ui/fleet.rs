//! The views of the agents: the agents on this store, and every context
//! side by side.

use super::super::app::{App, View};
use super::lists::{table, Shape};
use super::theme::Theme;
use apollo_shared::state::Tone;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::Span;
use ratatui::widgets::Cell;
use ratatui::Frame;

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
                Cell::from(a.serves()),
                Cell::from(a.plugins_column()),
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
            header: vec!["NAME", "HOST", "VERSION", "RUNNING", "HEARTBEAT", "STATE", "QUEUES", "PLUGINS"],
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
