//! Confirmations: what a destructive action, a skip, a pause or an approval asks before it is sent, and what it sends.

use super::*;

impl App {
    /// Asks the reason for `other` (a pause, an approval) of `task` (the
    /// queue, for a pause): on a production context, `task` typed first.
    pub(super) fn ask_why(&mut self, other: Other, ids: Vec<String>, task: String, verb: &'static str) -> Vec<Cmd> {
        let production = self.context.as_ref().is_some_and(|c| c.production);
        self.mode = Mode::Confirm(Confirm {
            action: OperatorAction::Retry,
            ids,
            task,
            verb,
            plan: Vec::new(),
            stage: if production { Stage::TaskName } else { Stage::Reason },
            input: String::new(),
            reason: None,
            other: Some(other),
            production,
            step: None,
        });
        Vec::new()
    }

    /// A key while a destructive action waits for its confirmation.
    pub(super) fn confirming(&mut self, mut c: Confirm, a: Action) -> Vec<Cmd> {
        let cancel = |app: &mut Self| {
            app.say("cancelled; nothing was sent", false);
            Vec::new()
        };
        match (c.stage, a) {
            (Stage::Yes, Action::Yes) => self.confirmed(c, None),
            (Stage::Yes, Action::Enter) => {
                self.say("Enter does not confirm: press y, or any other key to cancel", true);
                self.mode = Mode::Confirm(c);
                Vec::new()
            }
            (Stage::Yes, _) | (_, Action::Back | Action::Quit) => cancel(self),
            (_, Action::Input(ch)) => {
                c.input.push(ch);
                self.mode = Mode::Confirm(c);
                Vec::new()
            }
            (_, Action::Backspace) => {
                c.input.pop();
                self.mode = Mode::Confirm(c);
                Vec::new()
            }
            (Stage::TaskName, Action::Enter) if c.input == c.task => {
                c.stage = Stage::Reason;
                c.input.clear();
                self.mode = Mode::Confirm(c);
                Vec::new()
            }
            (Stage::TaskName, Action::Enter) => {
                let what = if c.batch() { "the number of instances" } else { "the task name" };
                self.say(format!("{:?} is not {what} {:?}; type it exactly, or Esc", c.input, c.task), true);
                self.mode = Mode::Confirm(c);
                Vec::new()
            }
            (Stage::Reason, Action::Enter) if !c.input.trim().is_empty() => {
                let reason = c.input.trim().to_string();
                self.confirmed(c, Some(reason))
            }
            (Stage::Reason, Action::Enter) => {
                let what = match c.other {
                    Some(Other::Skip(_) | Other::SkipItem { .. }) => "for a skip",
                    Some(Other::Pause { .. }) => "for a pause or resume",
                    Some(Other::Approve { .. }) => "for an approval or a denial",
                    None => "on a production context",
                };
                self.say(format!("a reason is needed {what}"), true);
                self.mode = Mode::Confirm(c);
                Vec::new()
            }
            _ => {
                self.mode = Mode::Confirm(c);
                Vec::new()
            }
        }
    }

    /// Sends a confirmed action: to one instance, or to each of a batch.
    pub(super) fn confirmed(&mut self, c: Confirm, reason: Option<String>) -> Vec<Cmd> {
        let why = reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default();
        let first = c.ids.first().cloned().unwrap_or_default();
        match c.other {
            Some(Other::Approve { deny }) => {
                let verb = if deny { "denial" } else { "approval" };
                self.say(format!("{verb} of {first} requested{why}"), false);
                return vec![Cmd::Approve { id: first, deny, reason: reason.unwrap_or_default() }];
            }
            Some(Other::Pause { resume }) => {
                let verb = if resume { "resume" } else { "pause" };
                self.say(format!("{verb} of queue {} requested{why}", c.task), false);
                return vec![Cmd::Pause { queue: c.task, resume, reason: reason.unwrap_or_default() }];
            }
            Some(Other::Skip(seq)) => {
                self.say(format!("skip of step #{seq} requested for {first}{why}"), false);
                return vec![Cmd::Skip { id: first, seq, reason: reason.unwrap_or_default(), item: None }];
            }
            Some(Other::SkipItem { seq, item }) => {
                self.say(format!("skip of item #{item} of step #{seq} requested for {first}{why}"), false);
                return vec![Cmd::Skip { id: first, seq, reason: reason.unwrap_or_default(), item: Some(item) }];
            }
            None => {}
        }
        if c.batch() {
            self.say(format!("{} requested for {} instances{why}", c.verb, c.ids.len()), false);
            return vec![Cmd::Batch { action: c.action, ids: c.ids, reason }];
        }
        let id = c.ids.into_iter().next().unwrap_or_default();
        self.say(format!("{} requested for {id}{why}", c.verb), false);
        vec![Cmd::Act { action: c.action, id, reason }]
    }
}
