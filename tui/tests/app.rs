//! The console's key handling and state updates, without a terminal:
//! keys in, actions and commands out.

mod fixtures;

use apollo_shared::protocol::{HelloResult, Role};
use apollo_shared::state::OperatorAction;
use apollo_tui::console::app::{Action, App, Cmd, Mode, News, Other, View};
use apollo_tui::console::keys;
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

fn key(app: &mut App, code: KeyCode) -> Vec<Cmd> {
    match keys::action(&app.mode, KeyEvent::new(code, KeyModifiers::NONE)) {
        Some(a) => app.update(a),
        None => Vec::new(),
    }
}

fn typed(app: &mut App, text: &str) -> Vec<Cmd> {
    text.chars().flat_map(|c| key(app, KeyCode::Char(c))).collect()
}

/// The fixtures' second instance opened at its second step.
fn step_view() -> App {
    let mut app = fixtures::app();
    key(&mut app, KeyCode::Char('j'));
    key(&mut app, KeyCode::Enter);
    key(&mut app, KeyCode::Char('j'));
    key(&mut app, KeyCode::Enter);
    assert_eq!((app.view, app.step), (View::Step, 1));
    app
}

#[test]
fn colon_switches_views_with_completion_and_esc_goes_back() {
    let mut app = fixtures::app();
    key(&mut app, KeyCode::Char(':'));
    typed(&mut app, "qu");
    key(&mut app, KeyCode::Tab);
    assert_eq!(app.mode, Mode::Command("queues".into()));
    let cmds = key(&mut app, KeyCode::Enter);
    assert_eq!(app.view, View::Queues);
    assert!(matches!(cmds[0], Cmd::Watch { .. }));
    key(&mut app, KeyCode::Esc);
    assert_eq!(app.view, View::Tasks);
    key(&mut app, KeyCode::Char(':'));
    typed(&mut app, "nonsense");
    key(&mut app, KeyCode::Enter);
    assert!(app.message.as_ref().unwrap().0.contains("unknown view \"nonsense\""));
}

#[test]
fn filters_go_to_the_agent_as_a_query_and_text_filters_locally() {
    let mut app = fixtures::app();
    key(&mut app, KeyCode::Char('/'));
    typed(&mut app, "state:failed");
    let cmds = key(&mut app, KeyCode::Enter);
    let Cmd::Watch { query, .. } = &cmds[0] else { panic!("{cmds:?}") };
    assert_eq!(query.state, Some(apollo_shared::state::TaskState::Failed));
    key(&mut app, KeyCode::Char('/'));
    for _ in 0.."state:failed".len() {
        key(&mut app, KeyCode::Backspace);
    }
    typed(&mut app, "flaky");
    key(&mut app, KeyCode::Enter);
    let shown: Vec<&str> = app.visible_tasks().iter().map(|i| i.task.as_str()).collect();
    assert_eq!(shown, ["flaky_sync"]);
}

#[test]
fn enter_drills_down_and_moves_keep_within_bounds() {
    let mut app = fixtures::app();
    for _ in 0..10 {
        key(&mut app, KeyCode::Char('j'));
    }
    assert_eq!(app.sel(View::Tasks), 2);
    key(&mut app, KeyCode::Char('g'));
    assert_eq!(app.sel(View::Tasks), 0);
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.view, View::Timeline);
    assert_eq!(app.instance.as_ref().unwrap().task, "daily_report");
    key(&mut app, KeyCode::Char('j'));
    key(&mut app, KeyCode::Enter);
    assert_eq!((app.view, app.step), (View::Step, 1));
    let before = app.step_lines().len();
    key(&mut app, KeyCode::Enter);
    assert!(app.step_lines().len() < before, "Enter folds the object under the cursor");
}

#[test]
fn destructive_actions_ask_first_and_retry_does_not() {
    let mut app = fixtures::app();
    key(&mut app, KeyCode::Char('j'));
    let cmds = key(&mut app, KeyCode::Char('b'));
    assert!(cmds.is_empty());
    assert!(matches!(&app.mode, Mode::Confirm(c) if c.action == OperatorAction::Rollback));
    assert!(key(&mut app, KeyCode::Char('n')).is_empty(), "n declines");
    key(&mut app, KeyCode::Char('c'));
    assert!(key(&mut app, KeyCode::Enter).is_empty(), "Enter alone never confirms");
    assert!(matches!(&app.mode, Mode::Confirm(_)), "and the question stays");
    let cmds = key(&mut app, KeyCode::Char('y'));
    let id = "01JAAAAAAAAAAAAAAAAAAAAAA2".to_string();
    assert_eq!(cmds, [Cmd::Act { action: OperatorAction::Cancel, id: id.clone(), reason: None }]);
    let cmds = key(&mut app, KeyCode::Char('t'));
    assert_eq!(cmds, [Cmd::Act { action: OperatorAction::Retry, id, reason: None }]);
}

#[test]
fn on_a_production_context_destructive_actions_need_the_task_name_and_a_reason() {
    let mut app = fixtures::app();
    app.context = Some(apollo_tui::contexts::Context {
        name: "prod".into(),
        socket: Some("/tmp/x.sock".into()),
        ssh: None,
        read_only: false,
        production: true,
    });
    key(&mut app, KeyCode::Char('j'));
    key(&mut app, KeyCode::Char('b'));
    let task = match &app.mode {
        Mode::Confirm(c) => c.task.clone(),
        other => panic!("{other:?}"),
    };
    assert!(key(&mut app, KeyCode::Char('y')).is_empty(), "y is text here, not a confirmation");
    assert!(key(&mut app, KeyCode::Enter).is_empty(), "a wrong name does nothing");
    key(&mut app, KeyCode::Backspace);
    typed(&mut app, &task);
    assert!(key(&mut app, KeyCode::Enter).is_empty(), "the name opens the reason prompt");
    assert!(key(&mut app, KeyCode::Enter).is_empty(), "an empty reason is refused");
    typed(&mut app, "bad deploy");
    let cmds = key(&mut app, KeyCode::Enter);
    assert_eq!(
        cmds,
        [Cmd::Act {
            action: OperatorAction::Rollback,
            id: "01JAAAAAAAAAAAAAAAAAAAAAA2".into(),
            reason: Some("bad deploy".into())
        }]
    );
}

#[test]
fn the_run_form_lists_declared_params_with_defaults_and_validates() {
    let mut app = fixtures::app();
    key(&mut app, KeyCode::Char(':'));
    typed(&mut app, "defs");
    key(&mut app, KeyCode::Enter);
    key(&mut app, KeyCode::Char('r'));
    let Mode::Form(f) = &app.mode else { panic!("{:?}", app.mode) };
    assert_eq!(f.fields[0].0, "source");
    assert_eq!(f.fields[0].1, "file://tasks/data/report.csv");
    for _ in 0..40 {
        key(&mut app, KeyCode::Backspace);
    }
    // Emptied, a param with a default is the empty text (as `-p source=`
    // is); the agent's checks decide whether it will do.
    let Mode::Form(f) = &app.mode else { panic!("{:?}", app.mode) };
    assert_eq!(App::form_params(f).unwrap()["source"], serde_json::json!(""));
    typed(&mut app, "file://x.csv");
    let cmds = key(&mut app, KeyCode::Enter);
    let Cmd::Trigger { task, params } = &cmds[0] else { panic!("{cmds:?}") };
    assert_eq!((task.as_str(), params["source"].as_str()), ("daily_report", Some("file://x.csv")));
    // The new instance opens in the timeline.
    app.on_news(News::Triggered("01JNEW".into()));
    assert_eq!(app.view, View::Timeline);
}

#[test]
fn readonly_and_observers_cannot_change_anything() {
    let mut app = fixtures::app();
    app.readonly_flag = true;
    for k in ['r', 't', 'b', 'c'] {
        assert!(key(&mut app, KeyCode::Char(k)).is_empty(), "{k}");
        assert!(app.message.as_ref().unwrap().0.contains("read-only"));
        assert_eq!(app.mode, Mode::Normal);
    }
    let mut app = fixtures::app();
    app.on_news(News::Connected(HelloResult {
        agent: "a".into(),
        version: "0".into(),
        protocol: 1,
        role: Role::Observer,
    }));
    assert!(app.readonly());
    assert!(key(&mut app, KeyCode::Char('t')).is_empty());
    // A read-only context refuses before sending, marks and batches included.
    let mut app = fixtures::app();
    app.context = Some(apollo_tui::contexts::Context {
        name: "audit".into(),
        socket: Some("/tmp/x.sock".into()),
        ssh: None,
        read_only: true,
        production: false,
    });
    key(&mut app, KeyCode::Char('*'));
    for k in ['r', 't', 'b', 'c'] {
        assert!(key(&mut app, KeyCode::Char(k)).is_empty(), "{k}");
        assert!(app.message.as_ref().unwrap().0.contains("read-only"), "{k}: {:?}", app.message);
        assert_eq!(app.mode, Mode::Normal);
    }
    // Reading still works.
    assert_eq!(app.update(Action::Enter).len(), 1);
}

#[test]
fn scrolling_near_the_end_asks_for_the_next_page() {
    let mut app = fixtures::app();
    app.on_news(News::Tasks {
        items: fixtures::app().tasks,
        next_cursor: Some("01JAAAAAAAAAAAAAAAAAAAAAA1".into()),
        append: false,
    });
    let cmds = key(&mut app, KeyCode::Char('j'));
    assert!(matches!(&cmds[0], Cmd::MoreTasks { cursor, .. } if cursor == "01JAAAAAAAAAAAAAAAAAAAAAA1"));
    let more = vec![fixtures::instance("01J0000000000000000000000Z", "older", apollo_shared::TaskState::Success)];
    app.on_news(News::Tasks { items: more, next_cursor: None, append: true });
    assert_eq!(app.tasks.len(), 4);
}

#[test]
fn a_lost_connection_is_shown_and_a_reconnect_refreshes() {
    let mut app = fixtures::app();
    app.on_news(News::Lost { attempt: 2, reason: "the agent closed the connection".into() });
    assert!(matches!(app.conn, apollo_tui::console::app::Conn::Lost { attempt: 2, .. }));
    let cmds = app.on_news(News::Connected(HelloResult {
        agent: "a".into(),
        version: "0".into(),
        protocol: 1,
        role: Role::Operator,
    }));
    assert!(matches!(cmds[0], Cmd::Watch { .. }), "reconnecting re-reads what the view shows");
}

#[test]
fn s_sorts_the_tasks_view_by_the_next_column() {
    let mut app = fixtures::app();
    let order = |app: &App| app.visible_tasks().iter().map(|i| i.task.clone()).collect::<Vec<_>>();
    assert_eq!(order(&app), ["daily_report", "db_migration", "flaky_sync"]);
    key(&mut app, KeyCode::Char('s'));
    assert_eq!(app.message.as_ref().unwrap().0, "sorted by task");
    key(&mut app, KeyCode::Char('s'));
    assert_eq!(app.message.as_ref().unwrap().0, "sorted by state");
    assert_eq!(order(&app), ["flaky_sync", "daily_report", "db_migration"], "by state: RUNNING, SUCCESS, FAILED");
}

#[test]
fn x_in_the_step_view_skips_a_failed_step_after_a_reason() {
    let mut app = step_view();
    assert!(key(&mut app, KeyCode::Char('x')).is_empty());
    assert!(!matches!(&app.mode, Mode::Confirm(_)), "a SUCCESS step is not skipped");
    let id = app.instance.as_ref().unwrap().id.clone();
    app.instance.as_mut().unwrap().steps.as_mut().unwrap()[1].state = apollo_shared::state::StepState::Failed;
    assert!(key(&mut app, KeyCode::Char('x')).is_empty());
    assert!(matches!(&app.mode, Mode::Confirm(c) if c.other == Some(Other::Skip(1))), "{:?}", app.mode);
    assert!(key(&mut app, KeyCode::Enter).is_empty(), "a skip needs a reason");
    typed(&mut app, "ran it by hand");
    let cmds = key(&mut app, KeyCode::Enter);
    assert_eq!(cmds, [Cmd::Skip { id, seq: 1, reason: "ran it by hand".into(), item: None }]);
}

#[test]
fn p_in_the_queues_view_pauses_the_selected_queue_and_resumes_a_paused_one_after_a_reason() {
    let mut app = fixtures::app();
    assert!(key(&mut app, KeyCode::Char('p')).is_empty());
    assert!(!matches!(&app.mode, Mode::Confirm(_)), "only in the queues view");
    key(&mut app, KeyCode::Char(':'));
    typed(&mut app, "queues");
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.view, View::Queues);
    key(&mut app, KeyCode::Char('j'));
    assert!(key(&mut app, KeyCode::Char('p')).is_empty());
    assert!(
        matches!(&app.mode, Mode::Confirm(c) if c.other == Some(Other::Pause { resume: false }) && c.task == "reports"),
        "{:?}",
        app.mode
    );
    assert!(key(&mut app, KeyCode::Enter).is_empty(), "a pause needs a reason");
    typed(&mut app, "incident 42");
    let cmds = key(&mut app, KeyCode::Enter);
    assert_eq!(cmds, [Cmd::Pause { queue: "reports".into(), resume: false, reason: "incident 42".into() }]);
    // Once the agent says it is paused, p resumes it.
    let mut queues = app.queues.clone();
    queues[1].paused = Some("queue reports: paused by ops".into());
    app.on_news(News::Queues(queues));
    key(&mut app, KeyCode::Char('p'));
    typed(&mut app, "over");
    let cmds = key(&mut app, KeyCode::Enter);
    assert_eq!(cmds, [Cmd::Pause { queue: "reports".into(), resume: true, reason: "over".into() }]);
}

#[test]
fn a_and_d_decide_the_approval_the_selected_instance_waits_for_after_a_reason() {
    let mut app = fixtures::app();
    assert!(key(&mut app, KeyCode::Char('A')).is_empty());
    assert!(!matches!(&app.mode, Mode::Confirm(_)), "the selected instance waits for no approval");
    let id = app.visible_tasks()[0].id.clone();
    let first = app.tasks.iter_mut().find(|i| i.id == id).unwrap();
    first.state = apollo_shared::state::TaskState::Pending;
    first.waiting = Some("waiting for approval of step gate by any operator since …: go?".into());
    key(&mut app, KeyCode::Char('A'));
    assert!(matches!(&app.mode, Mode::Confirm(c) if c.other == Some(Other::Approve { deny: false })), "{:?}", app.mode);
    assert!(key(&mut app, KeyCode::Enter).is_empty(), "an approval needs a reason");
    typed(&mut app, "CHG-7");
    assert_eq!(key(&mut app, KeyCode::Enter), [Cmd::Approve { id: id.clone(), deny: false, reason: "CHG-7".into() }]);
    key(&mut app, KeyCode::Char('D'));
    typed(&mut app, "not now");
    assert_eq!(key(&mut app, KeyCode::Enter), [Cmd::Approve { id, deny: true, reason: "not now".into() }]);
}

#[test]
fn on_a_production_context_an_approval_needs_the_task_name_before_its_reason() {
    let mut app = fixtures::app();
    app.context = Some(apollo_tui::contexts::Context {
        name: "prod".into(),
        socket: Some("/tmp/x.sock".into()),
        ssh: None,
        read_only: false,
        production: true,
    });
    let (id, task) = {
        let first = app.visible_tasks()[0].id.clone();
        let i = app.tasks.iter_mut().find(|i| i.id == first).unwrap();
        i.state = apollo_shared::state::TaskState::Pending;
        i.waiting = Some("waiting for approval of step gate by any operator since …: go?".into());
        (i.id.clone(), i.task.clone())
    };
    key(&mut app, KeyCode::Char('A'));
    typed(&mut app, "CHG-7");
    assert!(key(&mut app, KeyCode::Enter).is_empty(), "a reason where the task name is asked does nothing");
    for _ in 0.."CHG-7".len() {
        key(&mut app, KeyCode::Backspace);
    }
    typed(&mut app, &task);
    assert!(key(&mut app, KeyCode::Enter).is_empty(), "the name opens the reason prompt");
    typed(&mut app, "CHG-7");
    assert_eq!(key(&mut app, KeyCode::Enter), [Cmd::Approve { id, deny: false, reason: "CHG-7".into() }]);
}

#[test]
fn t_asks_for_the_timeline_of_the_selected_the_marked_or_the_filtered_instances() {
    let mut app = fixtures::app();
    let ids = |cmds: Vec<Cmd>| match cmds.as_slice() {
        [Cmd::Timeline { ids }] => ids.clone(),
        other => panic!("{other:?}"),
    };
    let all: Vec<String> = app.visible_tasks().iter().map(|i| i.id.clone()).collect();
    assert!(all.len() > 2, "{all:?}");
    // The selected instance alone.
    assert_eq!(ids(key(&mut app, KeyCode::Char('T'))), vec![all[0].clone()]);
    // A filter: every instance it keeps.
    key(&mut app, KeyCode::Char('/'));
    typed(&mut app, "flaky");
    key(&mut app, KeyCode::Enter);
    let kept: Vec<String> = app.visible_tasks().iter().map(|i| i.id.clone()).collect();
    assert!(!kept.is_empty() && kept.len() < all.len(), "{kept:?}");
    assert_eq!(ids(key(&mut app, KeyCode::Char('T'))), kept);
    // Marks win over the filter.
    key(&mut app, KeyCode::Char('/'));
    for _ in 0.."flaky".len() {
        key(&mut app, KeyCode::Backspace);
    }
    key(&mut app, KeyCode::Enter);
    key(&mut app, KeyCode::Char(' '));
    key(&mut app, KeyCode::Down);
    key(&mut app, KeyCode::Char(' '));
    assert_eq!(app.marked.len(), 2);
    let marked: Vec<String> = app.marked.iter().cloned().collect();
    assert_eq!(ids(key(&mut app, KeyCode::Char('T'))), marked);
}

#[test]
fn in_the_items_pane_slash_filters_the_items_and_x_skips_the_one_under_the_cursor_after_a_reason() {
    use apollo_shared::protocol::{ItemCounts, ItemRun};
    use apollo_shared::state::{StepState, TaskState};
    use apollo_tui::console::app::Pane;
    let mut app = step_view();
    let inst = app.instance.as_mut().unwrap();
    inst.state = TaskState::Failed;
    let id = inst.id.clone();
    let step = &mut inst.steps.as_mut().unwrap()[1];
    step.state = StepState::Failed;
    step.items =
        Some(ItemCounts { total: 3, ok: 1, failed: 1, not_started: 1, batches: 1, batch: 1, ..Default::default() });
    let item = |index: u32, label: &str, state: StepState, error: Option<&str>| ItemRun {
        index,
        label: label.into(),
        value: serde_json::json!(label),
        batch: 1,
        state,
        attempts: u32::from(state != StepState::Pending),
        params: None,
        output: None,
        error: error.map(str::to_string),
        started_at: None,
        finished_at: None,
        done: None,
        history: Vec::new(),
        holder: None,
    };
    let items = vec![
        item(0, "web-00", StepState::Success, None),
        item(1, "web-01", StepState::Failed, Some("exit 1")),
        item(2, "web-02", StepState::Pending, Some("not started: over the budget")),
    ];
    app.on_news(News::Items { id: id.clone(), seq: 1, items });
    app.pane = Pane::Items;
    let lines = |app: &App| app.step_lines().into_iter().map(|(_, t)| t).collect::<Vec<_>>().join("\n");
    assert!(lines(&app).contains("#0 web-00: SUCCESS") && lines(&app).contains("#2 web-02: NOT STARTED"));
    // A filter keeps the items whose line holds its words.
    key(&mut app, KeyCode::Char('/'));
    typed(&mut app, "failed");
    key(&mut app, KeyCode::Enter);
    let shown = lines(&app);
    assert!(shown.contains("#1 web-01: FAILED") && !shown.contains("web-00") && !shown.contains("web-02"), "{shown}");
    // x on a succeeded item is refused; on the failed one it asks why.
    key(&mut app, KeyCode::Esc);
    let at = |app: &App, what: &str| app.step_lines().iter().position(|(_, t)| t.contains(what)).unwrap();
    let n = at(&app, "#0 web-00");
    app.selected.insert(View::Step, n);
    assert!(key(&mut app, KeyCode::Char('x')).is_empty());
    assert!(!matches!(&app.mode, Mode::Confirm(_)), "a succeeded item is not skipped");
    let n = at(&app, "#1 web-01");
    app.selected.insert(View::Step, n);
    key(&mut app, KeyCode::Char('x'));
    let Mode::Confirm(c) = &app.mode else { panic!("{:?}", app.mode) };
    assert_eq!(c.other, Some(Other::SkipItem { seq: 1, item: 1 }));
    assert!(c.prompt().iter().any(|l| l.contains("skip item web-01 (#1) of step")), "{:?}", c.prompt());
    typed(&mut app, "decommissioned");
    let cmds = key(&mut app, KeyCode::Enter);
    assert_eq!(cmds, [Cmd::Skip { id, seq: 1, reason: "decommissioned".into(), item: Some(1) }]);
}
