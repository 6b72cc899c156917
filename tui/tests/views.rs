//! One snapshot per console view, rendered from fixed state with ratatui's
//! TestBackend, including empty, error and narrow (80×24) cases.

mod fixtures;

use apollo_tui::console::app::{Action, App, News, View};
use apollo_tui::console::ui::{draw, Theme};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

fn render(app: &App, w: u16, h: u16) -> String {
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| draw(f, app, &Theme { color: false })).unwrap();
    format!("{}", term.backend())
}

fn at(view: View) -> App {
    let mut app = fixtures::app();
    let name = view.name();
    app.update(Action::Command);
    for c in name.chars() {
        app.update(Action::Input(c));
    }
    app.update(Action::Enter);
    app
}

#[test]
fn tasks_view() {
    insta::assert_snapshot!(render(&fixtures::app(), 120, 20));
}

#[test]
fn tasks_view_narrow() {
    insta::assert_snapshot!(render(&fixtures::app(), 80, 24));
}

#[test]
fn tasks_view_empty_and_disconnected() {
    let mut app = App::new("ssh ops@db-7".into(), false);
    app.on_news(News::Lost {
        attempt: 3,
        reason: "cannot connect to the agent at /run/apollo/agent.sock: Connection refused".into(),
    });
    insta::assert_snapshot!(render(&app, 100, 12));
}

#[test]
fn queues_view() {
    insta::assert_snapshot!(render(&at(View::Queues), 100, 12));
}

#[test]
fn queues_view_with_a_paused_queue_in_the_header_and_the_list() {
    use apollo_shared::protocol::{Pause, PauseScope};
    let mut app = at(View::Queues);
    let pause = Pause {
        id: "pause-01JB".into(),
        scope: PauseScope::Queue,
        target: Some("reports".into()),
        reason: "incident 42".into(),
        by: "ops".into(),
        since: "2026-12-02T10:00:00.000000Z".into(),
        until: None,
        freeze: None,
    };
    let mut status = app.status.clone().expect("a status");
    status.paused = vec![pause.clone()];
    app.on_news(News::Status(status));
    let mut queues = app.queues.clone();
    queues[1].paused = Some(pause.line());
    app.on_news(News::Queues(queues));
    insta::assert_snapshot!(render(&app, 100, 12));
}

#[test]
fn defs_view_with_a_load_error() {
    insta::assert_snapshot!(render(&at(View::Defs), 120, 12));
}

#[test]
fn plugins_view() {
    insta::assert_snapshot!(render(&at(View::Plugins), 100, 10));
}

#[test]
fn plugins_view_with_a_rollout_side_by_side() {
    use apollo_shared::protocol::{PluginStats, Rollout, RolloutState};
    let mut app = at(View::Plugins);
    let stats = |runs, failure_rate, p50_secs, p99_secs| {
        Some(PluginStats { runs, failure_rate, p50_secs, p99_secs, suggested_timeout_secs: p99_secs * 1.5 })
    };
    app.on_news(News::Rollouts(vec![Rollout {
        id: "rollout-01JZ".into(),
        plugin: "file_downloader".into(),
        version: "2.0.0".into(),
        base: "1.4.0".into(),
        share_pct: 25.0,
        agents: vec!["db-7".into()],
        state: RolloutState::Running,
        started_at: "2026-12-02T08:00:00.000000Z".into(),
        started_by: "ana (uid 1000)".into(),
        reason: "CHG-118".into(),
        ended_at: None,
        ended_by: None,
        end_reason: None,
        abort_margin_pct: 10.0,
        min_runs: 20,
        new: stats(12, 0.0833, 1.2, 3.4),
        old: stats(37, 0.027, 1.1, 2.9),
    }]));
    insta::assert_snapshot!(render(&app, 130, 16));
}

#[test]
fn alerts_view() {
    insta::assert_snapshot!(render(&at(View::Alerts), 110, 10));
}

#[test]
fn timeline_view() {
    let mut app = fixtures::app();
    app.update(Action::Enter);
    insta::assert_snapshot!(render(&app, 120, 30));
}

#[test]
fn timeline_view_narrow() {
    let mut app = fixtures::app();
    app.update(Action::Enter);
    insta::assert_snapshot!(render(&app, 80, 24));
}

#[test]
fn step_view_params_and_folded_context() {
    let mut app = fixtures::app();
    app.update(Action::Enter);
    app.update(Action::Down);
    app.update(Action::Enter);
    insta::assert_snapshot!("step_params", render(&app, 100, 16));
    app.update(Action::NextPane);
    app.update(Action::NextPane);
    // Fold `steps` (the sixth line) under the cursor.
    for _ in 0..5 {
        app.update(Action::Down);
    }
    app.update(Action::Enter);
    insta::assert_snapshot!("step_context_after_folded", render(&app, 100, 20));
}

#[test]
fn overlays() {
    let mut app = at(View::Defs);
    app.update(Action::Run);
    insta::assert_snapshot!("run_form", render(&app, 100, 14));
    let mut app = fixtures::app();
    app.update(Action::Down);
    app.update(Action::Rollback);
    insta::assert_snapshot!("confirm", render(&app, 100, 14));
    // A production context: its name in red in the header, and a typed confirmation.
    let mut app = fixtures::app();
    app.context = Some(apollo_tui::contexts::Context {
        name: "prod-eu".into(),
        socket: None,
        ssh: Some("ops@db7".into()),
        read_only: false,
        production: true,
    });
    app.update(Action::Down);
    app.update(Action::Rollback);
    insta::assert_snapshot!("confirm_production_80x24", render(&app, 80, 24));
    insta::assert_snapshot!("confirm_production_wide", render(&app, 140, 24));
    let mut app = fixtures::app();
    app.update(Action::Help);
    insta::assert_snapshot!("help", render(&app, 100, 24));
}

#[test]
fn fleet_view() {
    use apollo_tui::console::app::FleetState;
    use apollo_tui::contexts::Context;
    let ctx = |name: &str, socket: &str, production: bool, read_only: bool| Context {
        name: name.into(),
        socket: Some(socket.into()),
        ssh: None,
        read_only,
        production,
    };
    let mut app = fixtures::app();
    app.contexts = vec![
        ctx("prod-eu", "/run/apollo/agent.sock", true, false),
        ctx("staging", "/srv/staging/agent.sock", false, false),
        ctx("audit", "/srv/audit/agent.sock", false, true),
    ];
    app.context = Some(app.contexts[1].clone());
    let counts = [("RUNNING", 2), ("PENDING", 5), ("FAILED", 1), ("SUCCESS", 940)].map(|(k, v)| (k.to_string(), v));
    app.on_news(News::Fleet(
        "prod-eu".into(),
        FleetState::Up { agent: "db7:311".into(), counts: counts.into_iter().collect(), store_error: None },
    ));
    app.on_news(News::Fleet("staging".into(), FleetState::Unreachable("connection refused".into())));
    let mut app = {
        app.update(Action::Command);
        for c in "fleet".chars() {
            app.update(Action::Input(c));
        }
        app.update(Action::Enter);
        app
    };
    insta::assert_snapshot!("fleet_80x24", render(&app, 80, 24));
    insta::assert_snapshot!("fleet_wide", render(&app, 140, 24));
    // Enter attaches to the selected context.
    let cmds = app.update(Action::Enter);
    assert!(matches!(&cmds[..], [apollo_tui::console::app::Cmd::Switch(c)] if c.name == "prod-eu"), "{cmds:?}");
}

#[test]
fn batch_preview() {
    let mut app = fixtures::app();
    app.update(Action::MarkAll);
    app.update(Action::Retry);
    insta::assert_snapshot!("batch_preview_80x24", render(&app, 80, 24));
    insta::assert_snapshot!("batch_preview_wide", render(&app, 140, 24));
}

#[test]
fn timeline_with_operator_actions() {
    let mut app = fixtures::app();
    app.update(Action::Enter);
    let i = app.instance.as_mut().unwrap();
    let t = |at: &str, from: &str, to: &str, reason: &str| apollo_shared::protocol::Transition {
        at: at.parse().unwrap(),
        step: None,
        from: Some(from.into()),
        to: to.into(),
        reason: reason.into(),
        actor: "alice (uid 1000)".into(),
    };
    let ts = i.transitions.as_mut().unwrap();
    ts.push(t("2026-11-29T11:00:00Z", "FAILED", "RETRYING", "retry requested: disk cleaned"));
    ts.push(t("2026-11-29T11:05:00Z", "FAILED", "FAILED", "rollback requested: bad deploy"));
    insta::assert_snapshot!(render(&app, 100, 30));
}

#[test]
fn step_attempts_compared() {
    let mut app = fixtures::app();
    app.update(Action::Enter);
    app.update(Action::Down);
    app.update(Action::Enter);
    for _ in 0..4 {
        app.update(Action::NextPane);
    }
    insta::assert_snapshot!("step_attempts_80x24", render(&app, 80, 24));
    insta::assert_snapshot!("step_attempts_wide", render(&app, 140, 24));
}
