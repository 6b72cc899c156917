//! `x` on an item of a fan-out step's items pane.

use super::super::*;
use apollo_shared::state::{StepState, TaskState};

impl App {
    /// `x` on an item in the items pane: asks why, then skips that item
    /// (a FAILED one, or one never started, of a FAILED instance).
    pub(in crate::console::app) fn skip_item(&mut self) {
        let Some(i) = self.instance.as_ref() else { return };
        let line = self.step_lines().get(self.sel(View::Step)).map(|(p, _)| p.clone()).unwrap_or_default();
        let items = self.items.get(&self.step).cloned().unwrap_or_default();
        let under = items.iter().find(|it| {
            let p = format!("$.{}", super::super::panes::item_key(it));
            line == p || line.starts_with(&format!("{p}."))
        });
        let Some(it) = under else {
            self.say("put the cursor on an item (#N label: STATE) to skip it", true);
            return;
        };
        if !(it.state == StepState::Failed || it.not_started()) || i.state != TaskState::Failed {
            self.say("only a FAILED or never started item of a FAILED instance can be skipped", true);
            return;
        }
        let step = i.steps.iter().flatten().find(|s| s.seq == self.step).map(|s| s.name.clone()).unwrap_or_default();
        let what = format!("item {} (#{}) of step {step}", it.label, it.index);
        let (ids, task) = (vec![i.id.clone()], i.task.clone());
        self.ask_why(Other::SkipItem { seq: self.step, item: it.index }, ids, task, "skip");
        if let Mode::Confirm(c) = &mut self.mode {
            c.step = Some(what);
        }
    }
}
