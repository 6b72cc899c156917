//! One step: params as resolved, context before and after, output and error,
//! plugin and version, logs. JSON panes are folding trees.

use super::super::app::{App, Pane, View};
use super::super::json;
use super::Theme;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Tabs};
use ratatui::Frame;
use serde_json::{json, Value};

/// The JSON a pane shows, or `None` for the logs pane.
pub fn pane_value(app: &App) -> Option<Value> {
    let i = app.instance.as_ref()?;
    let steps = i.steps.as_ref()?;
    let s = steps.iter().find(|s| s.seq == app.step)?;
    // The context as it was before and after this step: the outputs of the
    // steps up to it.
    let upto = |last: u32| {
        let mut c = i.context.clone();
        if let Some(Value::Object(outs)) = c.get_mut("steps") {
            let keep: Vec<&str> = steps.iter().filter(|x| x.seq <= last).map(|x| x.name.as_str()).collect();
            outs.retain(|k, _| keep.contains(&k.as_str()));
        }
        c
    };
    match app.pane {
        Pane::Params => Some(s.params.clone().unwrap_or(Value::Null)),
        Pane::Before => Some(if app.step == 0 { strip_all(i.context.clone()) } else { upto(app.step - 1) }),
        Pane::After => Some(upto(app.step)),
        Pane::Output => Some(json!({"output": s.output, "error": s.error})),
        Pane::Attempts => Some(attempts(s)),
        Pane::Logs => None,
    }
}

/// The last attempt compared with the one before it: what changed in the
/// params, the error, the output; then every earlier attempt as it ended.
fn attempts(s: &apollo_shared::protocol::StepRun) -> Value {
    let Some(prev) = s.earlier.last() else {
        return json!({"attempts": s.attempts, "compared": "one attempt only: nothing to compare"});
    };
    let params = json::diff(prev.params.as_ref().unwrap_or(&Value::Null), s.params.as_ref().unwrap_or(&Value::Null));
    let mut out = serde_json::Map::new();
    out.insert(
        "compared".into(),
        json!(format!("attempt {} (failed) → attempt {} ({})", prev.attempt, s.attempts, s.state.as_str())),
    );
    out.insert("params".into(), if params.is_empty() { json!("unchanged") } else { Value::Object(params) });
    if prev.error != s.error {
        out.insert("error".into(), json!({"before": prev.error, "after": s.error}));
    }
    if s.output.is_some() {
        out.insert("output".into(), json!({"before": null, "after": s.output}));
    }
    if prev.plugin_version != s.plugin_version {
        out.insert("plugin_version".into(), json!({"before": prev.plugin_version, "after": s.plugin_version}));
    }
    out.insert(
        "earlier".into(),
        s.earlier
            .iter()
            .map(|a| json!({"attempt": a.attempt, "error": a.error, "started_at": a.started_at, "finished_at": a.finished_at}))
            .collect(),
    );
    Value::Object(out)
}

fn strip_all(mut c: Value) -> Value {
    if let Some(Value::Object(o)) = c.get_mut("steps") {
        o.clear();
    }
    c
}

pub fn draw(f: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let Some(i) = &app.instance else { return };
    let Some(s) = i.steps.as_ref().and_then(|st| st.iter().find(|s| s.seq == app.step)) else {
        f.render_widget(Paragraph::new("no such step").block(Block::default().borders(Borders::ALL)), area);
        return;
    };
    let [tabs, body] = Layout::vertical([Constraint::Length(3), Constraint::Min(3)]).areas(area);
    let title = Line::from(vec![
        Span::raw(format!(" step {} {} — {}@{} ", s.seq, s.name, s.plugin, s.plugin_version.as_deref().unwrap_or("?"))),
        Span::styled(format!("{} ", s.state.as_str()), theme.state(s.state.as_str())),
        Span::raw(format!("attempts {} ", s.attempts)),
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
    let lines: Vec<Line> = match pane_value(app) {
        Some(v) => {
            let rows: Vec<String> = json::lines(&v, &app.folds).into_iter().map(|(_, text)| text).collect();
            super::scrolled(&rows, width, height, app.sel(View::Step), false, theme)
        }
        None if app.logs.is_empty() => {
            vec![Line::styled("(no log lines yet; they show here as they are written)", theme.dim())]
        }
        None => {
            let rows: Vec<String> = app.logs.lines().map(str::to_string).collect();
            super::scrolled(&rows, width, height, app.sel(View::Step), app.logs_tail, theme)
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
