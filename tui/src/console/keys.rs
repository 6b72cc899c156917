//! The one keymap: a key, in the current mode, becomes an [`Action`].

use super::app::{Action, Mode};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

/// The keys of the normal mode, for the help overlay: (keys, what they do).
pub const HELP: &[(&str, &str)] = &[
    (":", "switch view (queues, tasks, defs, plugins, alerts, agents, fleet; Tab completes)"),
    (":ctx NAME", "attach to another context (Tab completes); :ctx alone lists them"),
    ("/", "filter: text, state:failed, task:NAME, queue:NAME"),
    ("Enter", "drill down (queue → tasks, task → timeline, step → details)"),
    ("Esc", "back"),
    ("j k ↑ ↓", "move"),
    ("PgUp PgDn g G Home End", "page, first, last"),
    ("Tab", "next pane in the step view (logs follow while open)"),
    ("s", "sort the tasks view: created, task, state, queue, attempt"),
    ("a", "tasks view: the archive, or back to the live instances"),
    ("r", "run the selected task (a form for its params)"),
    ("d", "dry-run the selected task (nothing is executed)"),
    ("Space * u", "mark the instance (and move on), mark all the filter shows, clear the marks"),
    ("t", "retry the selected instance (with marks: the marked ones, after a preview)"),
    ("b", "roll back the selected instance (y confirms; production: type the task name and a reason)"),
    ("c", "cancel the selected instance (y confirms; production: type the task name and a reason)"),
    ("?", "this help"),
    ("q Ctrl-C", "quit"),
];

pub fn action(mode: &Mode, key: KeyEvent) -> Option<Action> {
    if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
        return Some(Action::Quit);
    }
    let typing = matches!(mode, Mode::Command(_) | Mode::Filter(_) | Mode::Form(_))
        || matches!(mode, Mode::Confirm(c) if c.typing());
    if typing {
        return match key.code {
            KeyCode::Esc => Some(Action::Back),
            KeyCode::Enter => Some(Action::Enter),
            KeyCode::Backspace => Some(Action::Backspace),
            KeyCode::Tab => Some(Action::Tab),
            KeyCode::Up => Some(Action::Up),
            KeyCode::Down => Some(Action::Down),
            KeyCode::Char(c) => Some(Action::Input(c)),
            _ => None,
        };
    }
    if let Mode::Confirm(_) = mode {
        // Enter alone never confirms a destructive action.
        return match key.code {
            KeyCode::Char('y') | KeyCode::Char('Y') => Some(Action::Yes),
            KeyCode::Enter => Some(Action::Enter),
            _ => Some(Action::No),
        };
    }
    if matches!(mode, Mode::Help | Mode::Results(_)) {
        return Some(Action::Back);
    }
    Some(match key.code {
        KeyCode::Char('q') => Action::Quit,
        KeyCode::Char('j') | KeyCode::Down => Action::Down,
        KeyCode::Char('k') | KeyCode::Up => Action::Up,
        KeyCode::PageDown => Action::PageDown,
        KeyCode::PageUp => Action::PageUp,
        KeyCode::Char('g') | KeyCode::Home => Action::Home,
        KeyCode::Char('G') | KeyCode::End => Action::End,
        KeyCode::Enter => Action::Enter,
        KeyCode::Esc => Action::Back,
        KeyCode::Char(':') => Action::Command,
        KeyCode::Char('/') => Action::Filter,
        KeyCode::Char('?') => Action::Help,
        KeyCode::Tab => Action::NextPane,
        KeyCode::Char('r') => Action::Run,
        KeyCode::Char('d') => Action::DryRun,
        KeyCode::Char('t') => Action::Retry,
        KeyCode::Char('b') => Action::Rollback,
        KeyCode::Char('c') => Action::Cancel,
        KeyCode::Char('s') => Action::Sort,
        KeyCode::Char('a') => Action::Archive,
        KeyCode::Char(' ') => Action::Mark,
        KeyCode::Char('*') => Action::MarkAll,
        KeyCode::Char('u') => Action::Unmark,
        _ => return None,
    })
}
