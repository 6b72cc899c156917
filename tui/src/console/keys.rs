//! The one keymap: a key, in the current mode, becomes an [`Action`].

use super::app::{Action, Mode};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

/// Every key, for the help overlay: (keys, what they do). Each fits one
/// line of an 80-column terminal, and all of them its 24 rows.
pub const HELP: &[(&str, &str)] = &[
    (":", "switch view: queues tasks defs plugins alerts agents fleet"),
    (":ctx NAME", "attach to another context (:ctx alone lists them); :q quits"),
    ("", "(Tab completes a view's or a context's name)"),
    ("/", "filter: words, state:failed, task:T, queue:Q (Ctrl-U clears)"),
    ("Enter", "open: queue → tasks → timeline → step; in JSON, fold or unfold"),
    ("Esc", "clear this view's filter, else go back"),
    ("j k ↑ ↓", "move (in an overlay or the logs pane: scroll)"),
    ("PgUp PgDn g G", "page up and down, first, last (G: follow the logs)"),
    ("Tab Shift-Tab", "next and previous pane of the step view or field of a form"),
    ("s", "sort tasks: created, task, state, queue, attempt"),
    ("a", "tasks: the archive, or back to the live instances"),
    ("r", "run the selected task (a form for its params)"),
    ("d T", "dry-run the selected task; the selected instance's timeline"),
    ("Space * u", "mark and move on, mark all the filter shows, clear the marks"),
    ("t", "retry the selected instance, or the marked ones after a preview"),
    ("b c", "roll back, cancel the selected instance (confirmed with y)"),
    ("x p", "skip a failed step or item (step view); pause, resume (queues)"),
    ("A D", "approve, deny what the selected instance waits for (asks why)"),
    ("y", "confirm a roll back or cancel; any other key cancels it"),
    ("", "(production: type the task name, then a reason)"),
    ("? q Ctrl-C", "this help; quit"),
];

pub fn action(mode: &Mode, key: KeyEvent) -> Option<Action> {
    if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
        return Some(Action::Quit);
    }
    let typing = matches!(mode, Mode::Command(_) | Mode::Filter(_) | Mode::Form(_))
        || matches!(mode, Mode::Confirm(c) if c.typing());
    if typing {
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('u') {
            return Some(Action::ClearLine);
        }
        return match key.code {
            KeyCode::Esc => Some(Action::Back),
            KeyCode::BackTab => Some(Action::PrevPane),
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
    if matches!(mode, Mode::Help | Mode::Results(_) | Mode::DryRun(_)) {
        // Overlays scroll; any other key closes them.
        return Some(match key.code {
            KeyCode::Char('j') | KeyCode::Down => Action::Down,
            KeyCode::Char('k') | KeyCode::Up => Action::Up,
            KeyCode::PageDown | KeyCode::Char(' ') => Action::PageDown,
            KeyCode::PageUp => Action::PageUp,
            KeyCode::Char('g') | KeyCode::Home => Action::Home,
            KeyCode::Char('G') | KeyCode::End => Action::End,
            _ => Action::Back,
        });
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
        KeyCode::BackTab => Action::PrevPane,
        KeyCode::Char('r') => Action::Run,
        KeyCode::Char('d') => Action::DryRun,
        KeyCode::Char('T') => Action::Timeline,
        KeyCode::Char('t') => Action::Retry,
        KeyCode::Char('b') => Action::Rollback,
        KeyCode::Char('c') => Action::Cancel,
        KeyCode::Char('x') => Action::Skip,
        KeyCode::Char('p') => Action::Pause,
        KeyCode::Char('A') => Action::Approve,
        KeyCode::Char('D') => Action::Deny,
        KeyCode::Char('s') => Action::Sort,
        KeyCode::Char('a') => Action::Archive,
        KeyCode::Char(' ') => Action::Mark,
        KeyCode::Char('*') => Action::MarkAll,
        KeyCode::Char('u') => Action::Unmark,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::HELP;

    /// The help overlay shows every key at once on an 80×24 terminal: each
    /// entry on one line of its 78 inner columns, all of them in its rows.
    #[test]
    fn every_key_fits_an_80_by_24_terminal() {
        for (k, what) in HELP {
            let line = format!("{k:<14} {what}");
            assert!(line.chars().count() <= 78, "{} characters: {line}", line.chars().count());
        }
        assert!(HELP.len() + 1 + 2 <= 24, "{} entries", HELP.len());
    }
}
