//! Marks and batch actions: Space marks an instance, `*` marks every one
//! the filter shows, `u` clears; `t`, `b` or `c` with marks shows a preview
//! — what the action does to each marked instance, and which the transition
//! table refuses and why — and sends nothing until it is confirmed. Each
//! instance's result is then listed.

use super::*;
use apollo_shared::state::OperatorAction;

impl App {
    pub(super) fn mark(&mut self, a: Action) -> Vec<Cmd> {
        if self.view != View::Tasks {
            self.say("marks are made in the tasks view", true);
            return Vec::new();
        }
        match a {
            Action::Mark => {
                if let Some(id) = self.focused_instance().map(|i| i.id.clone()) {
                    if !self.marked.remove(&id) {
                        self.marked.insert(id);
                    }
                    // Marking moves on, as in a file manager.
                    return self.update(Action::Down);
                }
            }
            Action::MarkAll => {
                let ids: Vec<String> = self.visible_tasks().iter().map(|i| i.id.clone()).collect();
                self.say(format!("{} marked (every instance the filter shows)", ids.len()), false);
                self.marked.extend(ids);
            }
            _ => {
                self.marked.clear();
                self.say("marks cleared", false);
            }
        }
        Vec::new()
    }

    /// The preview of `action` on the marked instances, waiting for its confirmation.
    pub(super) fn batch(&mut self, action: OperatorAction) -> Vec<Cmd> {
        let marked: Vec<&Instance> = self.tasks.iter().filter(|i| self.marked.contains(&i.id)).collect();
        let mut plan = Vec::new();
        let mut ids = Vec::new();
        for i in &marked {
            match action.plan(i.state) {
                Ok(what) => {
                    plan.push(format!("{:<10} {} {:<18} {what}", action.verb(), i.id, i.task));
                    ids.push(i.id.clone());
                }
                Err(why) => plan.push(format!("{:<10} {} {:<18} {why}", "refused", i.id, i.task)),
            }
        }
        plan.push(format!(
            "{} to {}, {} refused by the transition table",
            ids.len(),
            action.verb(),
            marked.len() - ids.len()
        ));
        if ids.is_empty() {
            self.mode = Mode::Results(plan);
            return Vec::new();
        }
        let production = self.context.as_ref().is_some_and(|c| c.production);
        self.mode = Mode::Confirm(Confirm {
            action,
            task: ids.len().to_string(),
            ids,
            verb: action.verb(),
            plan,
            stage: if production { Stage::TaskName } else { Stage::Yes },
            input: String::new(),
            reason: None,
            other: None,
            production,
            step: None,
        });
        Vec::new()
    }

    /// What a batch did, a line per instance.
    pub(super) fn batch_done(&mut self, verb: &str, results: Vec<(String, Result<String, String>)>) {
        let ok = results.iter().filter(|(_, r)| r.is_ok()).count();
        let mut lines: Vec<String> = results
            .iter()
            .map(|(id, r)| match r {
                Ok(state) => format!("done    {id}  now {state}"),
                Err(e) => format!("failed  {id}  {e}"),
            })
            .collect();
        lines.push(format!("{verb}: {ok} done, {} refused by the agent", results.len() - ok));
        self.say(lines.last().cloned().unwrap_or_default(), ok < results.len());
        self.marked.clear();
        self.mode = Mode::Results(lines);
    }
}
