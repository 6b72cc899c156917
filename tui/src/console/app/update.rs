//! Keys in: [`App::update`] for every mode.

use super::*;
use apollo_shared::state::OperatorAction;

mod confirm;
mod items;

impl App {
    pub fn update(&mut self, a: Action) -> Vec<Cmd> {
        match std::mem::replace(&mut self.mode, Mode::Normal) {
            Mode::Normal => self.normal(a),
            // Overlays scroll; anything else closes them.
            overlay @ (Mode::Help | Mode::Results(_) | Mode::DryRun(_)) => {
                let step = match a {
                    Action::Down => 1,
                    Action::Up => -1,
                    Action::PageDown => 10,
                    Action::PageUp => -10,
                    Action::Home => isize::MIN / 2,
                    Action::End => isize::MAX / 2,
                    _ => {
                        self.overlay_scroll = 0;
                        return Vec::new();
                    }
                };
                self.overlay_scroll = self.overlay_scroll.saturating_add_signed(step);
                self.mode = overlay;
                Vec::new()
            }
            Mode::Command(mut text) => match a {
                Action::Input(c) => {
                    text.push(c);
                    self.mode = Mode::Command(text);
                    Vec::new()
                }
                Action::Backspace => {
                    text.pop();
                    self.mode = Mode::Command(text);
                    Vec::new()
                }
                Action::ClearLine => {
                    self.mode = Mode::Command(String::new());
                    Vec::new()
                }
                Action::Tab => {
                    if let Some(done) = self.complete_ctx(&text) {
                        text = done;
                    } else if let Some((name, _)) = View::NAMED.iter().find(|(n, _)| n.starts_with(text.trim())) {
                        text = name.to_string();
                    }
                    self.mode = Mode::Command(text);
                    Vec::new()
                }
                Action::Enter => {
                    let t = text.trim();
                    // `:q` quits (before `q` could complete to `queues`).
                    if matches!(t, "q" | "q!" | "quit") {
                        self.quit = true;
                        return vec![Cmd::Quit];
                    }
                    if let Some(cmds) = self.ctx_command(t) {
                        return cmds;
                    }
                    match View::NAMED.iter().find(|(n, _)| *n == t || (!t.is_empty() && n.starts_with(t))) {
                        Some((_, View::Fleet)) => self.open_fleet(),
                        Some((_, v)) => self.go(*v),
                        None => {
                            let names: Vec<&str> = View::NAMED.iter().map(|(n, _)| *n).collect();
                            self.say(format!("unknown view {t:?} (views: {}, ctx NAME)", names.join(", ")), true);
                            Vec::new()
                        }
                    }
                }
                Action::Back => Vec::new(),
                _ => {
                    self.mode = Mode::Command(text);
                    Vec::new()
                }
            },
            Mode::Filter(mut text) => match a {
                Action::Input(c) => {
                    self.message = None;
                    text.push(c);
                    self.mode = Mode::Filter(text);
                    Vec::new()
                }
                Action::Backspace => {
                    text.pop();
                    self.mode = Mode::Filter(text);
                    Vec::new()
                }
                Action::ClearLine => {
                    self.mode = Mode::Filter(String::new());
                    Vec::new()
                }
                Action::Enter => {
                    if let Err(e) = filter_check(self.view, &text) {
                        // Refused as the CLI refuses it; the line stays to be fixed.
                        self.say(e, true);
                        self.mode = Mode::Filter(text);
                        return Vec::new();
                    }
                    self.filters.insert(self.view, text.trim().to_string());
                    self.selected.insert(self.view, 0);
                    vec![self.watch()]
                }
                Action::Back => Vec::new(),
                _ => {
                    self.mode = Mode::Filter(text);
                    Vec::new()
                }
            },
            Mode::Confirm(c) => self.confirming(c, a),
            Mode::Form(mut f) => {
                let cmds = match a {
                    Action::Back => return Vec::new(),
                    Action::Tab | Action::Down => {
                        f.focus = (f.focus + 1) % f.fields.len().max(1);
                        Vec::new()
                    }
                    Action::ClearLine => {
                        if let Some(field) = f.fields.get_mut(f.focus) {
                            field.1.clear();
                        }
                        Vec::new()
                    }
                    Action::Up | Action::PrevPane => {
                        f.focus = (f.focus + f.fields.len().max(1) - 1) % f.fields.len().max(1);
                        Vec::new()
                    }
                    Action::Input(c) => {
                        if let Some(field) = f.fields.get_mut(f.focus) {
                            field.1.push(c);
                        }
                        Vec::new()
                    }
                    Action::Backspace => {
                        if let Some(field) = f.fields.get_mut(f.focus) {
                            field.1.pop();
                        }
                        Vec::new()
                    }
                    Action::Enter => match Self::form_params(&f) {
                        Ok(params) => {
                            self.say(format!("run {} requested", f.task), false);
                            return vec![Cmd::Trigger { task: f.task.clone(), params }];
                        }
                        Err(e) => {
                            f.error = Some(e);
                            Vec::new()
                        }
                    },
                    _ => Vec::new(),
                };
                self.mode = Mode::Form(f);
                cmds
            }
        }
    }

    fn normal(&mut self, a: Action) -> Vec<Cmd> {
        let mutating = matches!(a, Action::Run | Action::Retry | Action::Rollback | Action::Cancel);
        if mutating && self.readonly() {
            self.say("read-only: actions that change state are disabled", true);
            return Vec::new();
        }
        match a {
            Action::Quit => {
                self.quit = true;
                vec![Cmd::Quit]
            }
            Action::Up => self.move_sel(-1),
            Action::Down => self.move_sel(1),
            Action::PageUp => self.move_sel(-20),
            Action::PageDown => self.move_sel(20),
            Action::Home => self.move_sel(isize::MIN / 2),
            Action::End => self.move_sel(isize::MAX / 2),
            Action::Command => {
                self.mode = Mode::Command(String::new());
                Vec::new()
            }
            Action::Filter => {
                self.mode = Mode::Filter(self.filter(self.view).to_string());
                Vec::new()
            }
            Action::Help => {
                self.mode = Mode::Help;
                Vec::new()
            }
            // Esc clears this view's filter first, then goes back.
            Action::Back if !self.filter(self.view).is_empty() => {
                self.filters.remove(&self.view);
                self.selected.insert(self.view, 0);
                self.say("filter cleared (Esc again goes back)", false);
                vec![self.watch()]
            }
            Action::Back => self.go_back(),
            Action::Enter => match self.view {
                View::Tasks => match self.focused_instance().cloned() {
                    Some(i) => {
                        self.instance = Some(i);
                        self.selected.insert(View::Timeline, 0);
                        self.step = 0;
                        self.go(View::Timeline)
                    }
                    None => Vec::new(),
                },
                View::Timeline if self.instance.is_some() => {
                    self.pane = Pane::Params;
                    self.logs.clear();
                    self.selected.insert(View::Step, 0);
                    self.go(View::Step)
                }
                View::Step => {
                    // Fold or unfold the object or list under the cursor.
                    if let Some((path, _)) = self.step_lines().get(self.sel(View::Step)) {
                        let path = path.clone();
                        if !self.folds.remove(&path) {
                            self.folds.insert(path);
                        }
                    }
                    Vec::new()
                }
                View::Fleet => self.switch_to_selected(),
                View::Queues => {
                    let q = self.visible_queues().get(self.sel(View::Queues)).map(|q| q.queue.clone());
                    if let Some(q) = q {
                        self.filters.insert(View::Tasks, format!("queue:{q}"));
                        self.selected.insert(View::Tasks, 0);
                    }
                    self.go(View::Tasks)
                }
                View::Defs => {
                    let task = self.focused_task();
                    if let Some(t) = task {
                        self.filters.insert(View::Tasks, format!("task:{t}"));
                        self.selected.insert(View::Tasks, 0);
                    }
                    self.go(View::Tasks)
                }
                _ => Vec::new(),
            },
            Action::NextPane | Action::Tab if self.view == View::Step => self.next_pane(1),
            Action::PrevPane if self.view == View::Step => self.next_pane(Pane::ALL.len() - 1),
            Action::PrevPane => self.go_back(),
            Action::Archive if self.view == View::Tasks => {
                self.archived = !self.archived;
                self.selected.insert(View::Tasks, 0);
                self.say(
                    if self.archived { "showing the archive (a: live instances)" } else { "showing live instances" },
                    false,
                );
                vec![self.watch()]
            }
            Action::Sort if self.view == View::Tasks => {
                self.sort = (self.sort + 1) % SORTS.len();
                self.say(format!("sorted by {}", SORTS[self.sort]), false);
                Vec::new()
            }
            Action::Run => match self.focused_task() {
                Some(task) => {
                    let form = self.form_for(&task);
                    if form.fields.is_empty() {
                        self.say(format!("run {task} requested"), false);
                        return vec![Cmd::Trigger { task, params: Map::new() }];
                    }
                    self.mode = Mode::Form(form);
                    Vec::new()
                }
                None => {
                    self.say("select a definition (:defs) or an instance to run its task", true);
                    Vec::new()
                }
            },
            Action::Timeline => {
                let ids = self.timeline_ids();
                if ids.is_empty() {
                    self.say("select an instance (:tasks) to see its timeline", true);
                    return Vec::new();
                }
                vec![Cmd::Timeline { ids }]
            }
            Action::DryRun => match self.focused_task() {
                Some(task) => vec![Cmd::DryRun { task, params: Map::new() }],
                None => {
                    self.say("select a definition (:defs) or an instance to dry-run its task", true);
                    Vec::new()
                }
            },
            Action::Mark | Action::MarkAll | Action::Unmark => self.mark(a),
            Action::Retry if !self.marked.is_empty() => self.batch(OperatorAction::Retry),
            Action::Rollback if !self.marked.is_empty() => self.batch(OperatorAction::Rollback),
            Action::Cancel if !self.marked.is_empty() => self.batch(OperatorAction::Cancel),
            Action::Approve | Action::Deny => match self.focused_instance().cloned() {
                Some(i) if i.waiting.as_deref().is_some_and(|w| w.starts_with("waiting for approval")) => {
                    let deny = a == Action::Deny;
                    let verb = if deny { "deny the approval of" } else { "approve" };
                    self.ask_why(Other::Approve { deny }, vec![i.id.clone()], i.task.clone(), verb)
                }
                _ => {
                    self.say("select an instance that waits for approval (apollo approvals lists them)", true);
                    Vec::new()
                }
            },
            Action::Pause => match self.visible_queues().get(self.sel(View::Queues)) {
                Some(q) if self.view == View::Queues => {
                    let resume = q.paused.is_some();
                    let (queue, verb) = (q.queue.clone(), if resume { "resume queue" } else { "pause queue" });
                    self.ask_why(Other::Pause { resume }, Vec::new(), queue, verb)
                }
                _ => {
                    self.say("select a queue in the queues view (:queues) to pause or resume it", true);
                    Vec::new()
                }
            },
            Action::Skip if self.view == View::Step && self.pane == Pane::Items => {
                self.skip_item();
                Vec::new()
            }
            Action::Skip => match (&self.instance, self.view) {
                (Some(i), View::Step) => {
                    let step = i.steps.iter().flatten().find(|s| s.seq == self.step);
                    match step {
                        Some(s) if s.state == apollo_shared::state::StepState::Failed => {
                            let (ids, task, step) = (vec![i.id.clone()], i.task.clone(), s.name.clone());
                            self.ask_why(Other::Skip(s.seq), ids, task, "skip step");
                            if let Mode::Confirm(c) = &mut self.mode {
                                c.step = Some(step);
                            }
                        }
                        _ => self.say("only a FAILED step can be skipped", true),
                    }
                    Vec::new()
                }
                _ => {
                    self.say("open a failed step (Enter on the timeline) to skip it", true);
                    Vec::new()
                }
            },
            Action::Retry => match self.focused_instance().map(|i| i.id.clone()) {
                Some(id) => {
                    self.say(format!("retry requested for {id}"), false);
                    vec![Cmd::Act { action: OperatorAction::Retry, id, reason: None }]
                }
                None => Vec::new(),
            },
            Action::Rollback | Action::Cancel => {
                match self.focused_instance().map(|i| (i.id.clone(), i.task.clone(), i.state)) {
                    Some((id, task, state)) => {
                        let action =
                            if a == Action::Rollback { OperatorAction::Rollback } else { OperatorAction::Cancel };
                        let production = self.context.as_ref().is_some_and(|c| c.production);
                        // Undoing a success always says why (the agent requires it).
                        let why =
                            action == OperatorAction::Rollback && state == apollo_shared::state::TaskState::Success;
                        self.mode = Mode::Confirm(Confirm {
                            action,
                            ids: vec![id],
                            task,
                            verb: action.verb(),
                            plan: Vec::new(),
                            stage: match (production, why) {
                                (true, _) => Stage::TaskName,
                                (false, true) => Stage::Reason,
                                (false, false) => Stage::Yes,
                            },
                            input: String::new(),
                            reason: None,
                            other: None,
                            production,
                            step: None,
                        });
                        Vec::new()
                    }
                    None => Vec::new(),
                }
            }
            _ => Vec::new(),
        }
    }

    fn go_back(&mut self) -> Vec<Cmd> {
        match self.back.pop() {
            Some(v) => {
                self.view = v;
                vec![self.watch()]
            }
            None => Vec::new(),
        }
    }

    /// The step view's pane `by` places on (wrapping round).
    fn next_pane(&mut self, by: usize) -> Vec<Cmd> {
        let i = Pane::ALL.iter().position(|p| *p == self.pane).unwrap_or(0);
        self.pane = Pane::ALL[(i + by) % Pane::ALL.len()];
        self.selected.insert(View::Step, 0);
        self.logs_tail = true;
        vec![self.watch()]
    }
}

/// A filter the view can apply, or why not: the tasks view sends `state:`,
/// `task:` and `queue:` to the agent, and a state must be one.
pub fn filter_check(view: View, text: &str) -> Result<(), String> {
    if view != View::Tasks {
        return Ok(());
    }
    for word in text.split_whitespace() {
        if let Some(("state", v)) = word.split_once(':') {
            if v.to_ascii_uppercase().parse::<apollo_shared::state::TaskState>().is_err() {
                let states: Vec<String> =
                    apollo_shared::state::TaskState::ALL.iter().map(|s| s.as_str().to_ascii_lowercase()).collect();
                return Err(format!("state:{v} is not a state (expected one of: {})", states.join(", ")));
            }
        }
    }
    Ok(())
}
