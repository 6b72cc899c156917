//! The console's state and the only function that changes it: keys become
//! [`Action`]s, agent news becomes [`News`], and [`App::update`] /
//! [`App::on_news`] turn them into new state plus [`Cmd`]s for the agent
//! worker. Views draw `&App` and do no IO.

use apollo_shared::protocol::{
    AgentStatus, Alert, DefInfo, DryRunResult, Event, HelloResult, Instance, PluginInfo, QueueStats, Role,
};
use apollo_shared::state::TaskState;
use serde_json::{Map, Value};
use std::collections::{BTreeSet, VecDeque};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum View {
    Queues,
    Tasks,
    Timeline,
    Step,
    Defs,
    Plugins,
    Alerts,
}

impl View {
    /// Views reachable with `:`.
    pub const NAMED: [(&'static str, View); 5] = [
        ("queues", View::Queues),
        ("tasks", View::Tasks),
        ("defs", View::Defs),
        ("plugins", View::Plugins),
        ("alerts", View::Alerts),
    ];
    pub fn name(self) -> &'static str {
        match self {
            View::Queues => "queues",
            View::Tasks => "tasks",
            View::Timeline => "timeline",
            View::Step => "step",
            View::Defs => "defs",
            View::Plugins => "plugins",
            View::Alerts => "alerts",
        }
    }
}

/// The panes of the step view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pane {
    Params,
    Before,
    After,
    Output,
    Logs,
}

impl Pane {
    pub const ALL: [Pane; 5] = [Pane::Params, Pane::Before, Pane::After, Pane::Output, Pane::Logs];
    pub fn title(self) -> &'static str {
        match self {
            Pane::Params => "params",
            Pane::Before => "context before",
            Pane::After => "context after",
            Pane::Output => "output",
            Pane::Logs => "logs",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Conn {
    Connecting,
    Connected,
    Lost { attempt: u32, reason: String },
}

/// An action waiting for y/n.
#[derive(Debug, Clone, PartialEq)]
pub struct Confirm {
    pub method: &'static str,
    pub id: String,
    pub question: String,
}

/// The run form: the task's declared params with their defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct RunForm {
    pub task: String,
    /// (name, text as typed, description).
    pub fields: Vec<(String, String, String)>,
    pub focus: usize,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    Normal,
    Command(String),
    Filter(String),
    Confirm(Confirm),
    Form(RunForm),
    DryRun(DryRunResult),
    Help,
}

/// What the user asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Quit,
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
    Enter,
    Back,
    Command,
    Filter,
    Help,
    Input(char),
    Backspace,
    Tab,
    Run,
    DryRun,
    Retry,
    Rollback,
    Cancel,
    Yes,
    No,
    NextPane,
    /// Sort the tasks view by the next column.
    Sort,
}

/// Columns the tasks view sorts by (`s` cycles).
pub const SORTS: [&str; 5] = ["created", "task", "state", "queue", "attempt"];

/// What the agent worker reports.
#[derive(Debug, Clone)]
pub enum News {
    Connecting,
    Connected(HelloResult),
    Lost {
        attempt: u32,
        reason: String,
    },
    Status(AgentStatus),
    Queues(Vec<QueueStats>),
    /// A page of instances; `append` adds it after what is loaded.
    Tasks {
        items: Vec<Instance>,
        next_cursor: Option<String>,
        append: bool,
    },
    Instance(Instance),
    Defs(Vec<DefInfo>),
    Plugins(Vec<PluginInfo>),
    Alerts(Vec<Alert>),
    Logs(String),
    DryRun(DryRunResult),
    /// An action's outcome, as the agent worded it.
    Done(Result<String, String>),
    /// A triggered instance to open.
    Triggered(String),
    Event(Event),
}

/// What the agent worker should do.
#[derive(Debug, Clone, PartialEq)]
pub enum Cmd {
    /// What to keep fresh: the tasks query and the open instance (and step log).
    Watch {
        query: Map<String, Value>,
        instance: Option<String>,
        logs: Option<u32>,
    },
    MoreTasks {
        query: Map<String, Value>,
        cursor: String,
    },
    Trigger {
        task: String,
        params: Map<String, Value>,
    },
    DryRun {
        task: String,
        params: Map<String, Value>,
    },
    Act {
        method: &'static str,
        id: String,
    },
    Quit,
}

pub struct App {
    pub transport: String,
    pub conn: Conn,
    pub hello: Option<HelloResult>,
    pub status: Option<AgentStatus>,
    /// `--readonly`, or the agent says we are an observer.
    pub readonly_flag: bool,
    pub view: View,
    pub back: Vec<View>,
    pub mode: Mode,
    pub queues: Vec<QueueStats>,
    pub tasks: Vec<Instance>,
    pub next_cursor: Option<String>,
    pub defs: Vec<DefInfo>,
    pub plugins: Vec<PluginInfo>,
    pub alerts: Vec<Alert>,
    /// Selected row per list view, and the offset of the first shown row.
    pub selected: std::collections::HashMap<View, usize>,
    /// The filter of each list view (`state:failed task:x queue:y text`).
    pub filters: std::collections::HashMap<View, String>,
    pub instance: Option<Instance>,
    pub step: u32,
    pub pane: Pane,
    pub logs: String,
    /// Folded JSON paths in the step view.
    pub folds: BTreeSet<String>,
    pub message: Option<(String, bool)>,
    /// Instances that ended, per minute, oldest first (the sparkline).
    pub throughput: VecDeque<u64>,
    pub minute: i64,
    /// Index into [`SORTS`].
    pub sort: usize,
    pub quit: bool,
}

impl App {
    pub fn new(transport: String, readonly: bool) -> App {
        App {
            transport,
            conn: Conn::Connecting,
            hello: None,
            status: None,
            readonly_flag: readonly,
            view: View::Tasks,
            back: Vec::new(),
            mode: Mode::Normal,
            queues: Vec::new(),
            tasks: Vec::new(),
            next_cursor: None,
            defs: Vec::new(),
            plugins: Vec::new(),
            alerts: Vec::new(),
            selected: Default::default(),
            filters: Default::default(),
            instance: None,
            step: 0,
            pane: Pane::Params,
            logs: String::new(),
            folds: BTreeSet::new(),
            message: None,
            throughput: VecDeque::from(vec![0; 30]),
            minute: 0,
            sort: 0,
            quit: false,
        }
    }

    pub fn readonly(&self) -> bool {
        self.readonly_flag || self.hello.as_ref().is_some_and(|h| h.role == Role::Observer)
    }

    pub fn filter(&self, v: View) -> &str {
        self.filters.get(&v).map(String::as_str).unwrap_or("")
    }

    pub fn sel(&self, v: View) -> usize {
        self.selected.get(&v).copied().unwrap_or(0)
    }

    /// The query of the tasks view: `state:`, `task:`, `queue:` go to the agent.
    pub fn tasks_query(&self) -> Map<String, Value> {
        let mut q = Map::new();
        q.insert("limit".into(), Value::from(200));
        for word in self.filter(View::Tasks).split_whitespace() {
            if let Some((k, v)) = word.split_once(':') {
                if ["state", "task", "queue"].contains(&k) {
                    let v = if k == "state" { v.to_ascii_uppercase() } else { v.to_string() };
                    q.insert(k.into(), Value::String(v));
                }
            }
        }
        q
    }

    /// Free-text words of a filter (the `key:value` ones are queries).
    fn text_words(&self, v: View) -> Vec<String> {
        self.filter(v)
            .split_whitespace()
            .filter(|w| !(w.contains(':') && v == View::Tasks))
            .map(|w| w.to_lowercase())
            .collect()
    }

    fn keep(&self, v: View, hay: &str) -> bool {
        let hay = hay.to_lowercase();
        self.text_words(v).iter().all(|w| {
            // On other views `state:x` style words match their text too.
            let w = w.split_once(':').map(|(_, x)| x.to_string()).unwrap_or_else(|| w.clone());
            hay.contains(&w)
        })
    }

    pub fn visible_tasks(&self) -> Vec<&Instance> {
        let mut v: Vec<&Instance> = self
            .tasks
            .iter()
            .filter(|i| self.keep(View::Tasks, &format!("{} {} {} {}", i.id, i.task, i.state, i.queue)))
            .collect();
        // Stable sorts keep newest-first within equal keys.
        match SORTS[self.sort] {
            "task" => v.sort_by(|a, b| a.task.cmp(&b.task)),
            "state" => v.sort_by_key(|i| i.state),
            "queue" => v.sort_by(|a, b| a.queue.cmp(&b.queue)),
            "attempt" => v.sort_by_key(|i| std::cmp::Reverse(i.attempt)),
            _ => {}
        }
        v
    }
    pub fn visible_queues(&self) -> Vec<&QueueStats> {
        self.queues.iter().filter(|q| self.keep(View::Queues, &q.queue)).collect()
    }
    pub fn visible_defs(&self) -> Vec<&DefInfo> {
        self.defs
            .iter()
            .filter(|d| self.keep(View::Defs, &format!("{} {} {}", d.task, d.file, d.errors.join(" "))))
            .collect()
    }
    pub fn visible_plugins(&self) -> Vec<&PluginInfo> {
        self.plugins.iter().filter(|p| self.keep(View::Plugins, &format!("{} {}", p.name, p.version))).collect()
    }
    pub fn visible_alerts(&self) -> Vec<&Alert> {
        self.alerts.iter().filter(|a| self.keep(View::Alerts, &format!("{} {}", a.kind, a.message))).collect()
    }

    fn rows(&self, v: View) -> usize {
        match v {
            View::Queues => self.visible_queues().len(),
            View::Tasks => self.visible_tasks().len(),
            View::Defs => self.visible_defs().len(),
            View::Plugins => self.visible_plugins().len(),
            View::Alerts => self.visible_alerts().len(),
            View::Timeline => self.instance.as_ref().and_then(|i| i.steps.as_ref()).map_or(0, Vec::len),
            View::Step => self.step_lines().len(),
        }
    }

    /// The lines of the step view's JSON pane: (path, text).
    pub fn step_lines(&self) -> Vec<(String, String)> {
        super::ui::step_pane_value(self).map(|v| super::json::lines(&v, &self.folds)).unwrap_or_default()
    }

    fn watch(&self) -> Cmd {
        let logs = (self.view == View::Step && self.pane == Pane::Logs).then_some(self.step);
        let instance = matches!(self.view, View::Timeline | View::Step)
            .then(|| self.instance.as_ref().map(|i| i.id.clone()))
            .flatten();
        Cmd::Watch { query: self.tasks_query(), instance, logs }
    }

    fn say(&mut self, text: impl Into<String>, error: bool) {
        self.message = Some((text.into(), error));
    }

    fn go(&mut self, v: View) -> Vec<Cmd> {
        if v != self.view {
            self.back.push(self.view);
            self.view = v;
        }
        vec![self.watch()]
    }

    fn move_sel(&mut self, delta: isize) -> Vec<Cmd> {
        let v = self.view;
        let n = self.rows(v);
        if n == 0 {
            return Vec::new();
        }
        let cur = self.sel(v) as isize;
        let next = (cur + delta).clamp(0, n as isize - 1) as usize;
        self.selected.insert(v, next);
        if v == View::Timeline {
            self.step = next as u32;
        }
        // Near the end of what is loaded, ask for the next page.
        if v == View::Tasks && next + 20 >= n {
            if let Some(cursor) = self.next_cursor.take() {
                return vec![Cmd::MoreTasks { query: self.tasks_query(), cursor }];
            }
        }
        Vec::new()
    }

    /// The instance the current view is about, if any.
    fn focused_instance(&self) -> Option<&Instance> {
        match self.view {
            View::Tasks => self.visible_tasks().get(self.sel(View::Tasks)).copied(),
            View::Timeline | View::Step => self.instance.as_ref(),
            _ => None,
        }
    }

    /// The task the current view is about, for run and dry-run.
    fn focused_task(&self) -> Option<String> {
        match self.view {
            View::Defs => {
                self.visible_defs().get(self.sel(View::Defs)).filter(|d| d.hash.is_some()).map(|d| d.task.clone())
            }
            _ => self.focused_instance().map(|i| i.task.clone()),
        }
    }

    fn form_for(&self, task: &str) -> RunForm {
        let fields = self
            .defs
            .iter()
            .find(|d| d.task == task)
            .and_then(|d| d.params.as_object().cloned())
            .unwrap_or_default()
            .into_iter()
            .map(|(name, spec)| {
                let default = match &spec["default"] {
                    Value::Null => String::new(),
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (name, default, spec["description"].as_str().unwrap_or("").to_string())
            })
            .collect();
        RunForm { task: task.to_string(), fields, focus: 0, error: None }
    }

    /// The form's params; a value that parses as JSON is taken as JSON.
    pub fn form_params(form: &RunForm) -> Result<Map<String, Value>, String> {
        let mut out = Map::new();
        for (name, text, _) in &form.fields {
            if text.trim().is_empty() {
                return Err(format!("{name}: needs a value"));
            }
            let v = serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.clone()));
            out.insert(name.clone(), v);
        }
        Ok(out)
    }

    pub fn update(&mut self, a: Action) -> Vec<Cmd> {
        match std::mem::replace(&mut self.mode, Mode::Normal) {
            Mode::Normal => self.normal(a),
            Mode::Help => Vec::new(),
            Mode::DryRun(r) => {
                if !matches!(a, Action::Back | Action::Enter | Action::Quit) {
                    self.mode = Mode::DryRun(r);
                }
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
                Action::Tab => {
                    if let Some((name, _)) = View::NAMED.iter().find(|(n, _)| n.starts_with(text.trim())) {
                        text = name.to_string();
                    }
                    self.mode = Mode::Command(text);
                    Vec::new()
                }
                Action::Enter => match View::NAMED
                    .iter()
                    .find(|(n, _)| *n == text.trim() || (!text.trim().is_empty() && n.starts_with(text.trim())))
                {
                    Some((_, v)) => self.go(*v),
                    None if matches!(text.trim(), "q" | "quit") => {
                        self.quit = true;
                        vec![Cmd::Quit]
                    }
                    None => {
                        let names: Vec<&str> = View::NAMED.iter().map(|(n, _)| *n).collect();
                        self.say(format!("unknown view {:?} (views: {})", text.trim(), names.join(", ")), true);
                        Vec::new()
                    }
                },
                Action::Back => Vec::new(),
                _ => {
                    self.mode = Mode::Command(text);
                    Vec::new()
                }
            },
            Mode::Filter(mut text) => match a {
                Action::Input(c) => {
                    text.push(c);
                    self.mode = Mode::Filter(text);
                    Vec::new()
                }
                Action::Backspace => {
                    text.pop();
                    self.mode = Mode::Filter(text);
                    Vec::new()
                }
                Action::Enter => {
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
            Mode::Confirm(c) => match a {
                Action::Yes | Action::Enter => {
                    self.say(format!("{} requested for {}", c.method.trim_start_matches("tasks."), c.id), false);
                    vec![Cmd::Act { method: c.method, id: c.id }]
                }
                Action::No | Action::Back | Action::Quit => {
                    self.say("cancelled", false);
                    Vec::new()
                }
                _ => {
                    self.mode = Mode::Confirm(c);
                    Vec::new()
                }
            },
            Mode::Form(mut f) => {
                let cmds = match a {
                    Action::Back => return Vec::new(),
                    Action::Tab | Action::Down => {
                        f.focus = (f.focus + 1) % f.fields.len().max(1);
                        Vec::new()
                    }
                    Action::Up => {
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
            Action::Back => match self.back.pop() {
                Some(v) => {
                    self.view = v;
                    vec![self.watch()]
                }
                None => Vec::new(),
            },
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
            Action::NextPane | Action::Tab if self.view == View::Step => {
                let i = Pane::ALL.iter().position(|p| *p == self.pane).unwrap_or(0);
                self.pane = Pane::ALL[(i + 1) % Pane::ALL.len()];
                self.selected.insert(View::Step, 0);
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
            Action::DryRun => match self.focused_task() {
                Some(task) => vec![Cmd::DryRun { task, params: Map::new() }],
                None => {
                    self.say("select a definition (:defs) or an instance to dry-run its task", true);
                    Vec::new()
                }
            },
            Action::Retry => match self.focused_instance().map(|i| i.id.clone()) {
                Some(id) => {
                    self.say(format!("retry requested for {id}"), false);
                    vec![Cmd::Act { method: "tasks.retry", id }]
                }
                None => Vec::new(),
            },
            Action::Rollback | Action::Cancel => {
                match self.focused_instance().map(|i| (i.id.clone(), i.task.clone())) {
                    Some((id, task)) => {
                        let (method, verb) = if a == Action::Rollback {
                            ("tasks.rollback", "roll back")
                        } else {
                            ("tasks.cancel", "cancel")
                        };
                        self.mode = Mode::Confirm(Confirm {
                            method,
                            id: id.clone(),
                            question: format!("{verb} {task} {id}? (y/n)"),
                        });
                        Vec::new()
                    }
                    None => Vec::new(),
                }
            }
            _ => Vec::new(),
        }
    }

    pub fn on_news(&mut self, n: News) -> Vec<Cmd> {
        match n {
            News::Connecting => self.conn = Conn::Connecting,
            News::Connected(h) => {
                self.conn = Conn::Connected;
                self.hello = Some(h);
                return vec![self.watch()];
            }
            News::Lost { attempt, reason } => self.conn = Conn::Lost { attempt, reason },
            News::Status(s) => self.status = Some(s),
            News::Queues(q) => self.queues = q,
            News::Tasks { items, next_cursor, append } => {
                if append {
                    self.tasks.extend(items);
                } else {
                    self.tasks = items;
                }
                self.next_cursor = next_cursor;
                let n = self.visible_tasks().len();
                if self.sel(View::Tasks) >= n {
                    self.selected.insert(View::Tasks, n.saturating_sub(1));
                }
            }
            News::Instance(i) => {
                if self.instance.as_ref().is_none_or(|cur| cur.id == i.id) {
                    self.instance = Some(i);
                }
            }
            News::Defs(d) => self.defs = d,
            News::Plugins(p) => self.plugins = p,
            News::Alerts(a) => self.alerts = a,
            News::Logs(text) => self.logs = text,
            News::DryRun(r) => self.mode = Mode::DryRun(r),
            News::Done(Ok(m)) => self.say(m, false),
            News::Done(Err(m)) => self.say(m, true),
            News::Triggered(id) => {
                // Open the new instance's timeline; the watch fills it in.
                self.instance = Some(placeholder(&id));
                self.selected.insert(View::Timeline, 0);
                self.step = 0;
                return self.go(View::Timeline);
            }
            News::Event(e) => self.count(&e),
        }
        Vec::new()
    }

    /// Counts ended instances into per-minute buckets for the sparkline.
    fn count(&mut self, e: &Event) {
        let ended = ["SUCCESS", "FAILED", "ROLLED_BACK"];
        if e.topic != "tasks"
            || e.data.get("step").is_some()
            || !e.data["state"].as_str().is_some_and(|s| ended.contains(&s))
        {
            return;
        }
        let minute = chrono::Utc::now().timestamp() / 60;
        if self.minute != minute {
            let gap = if self.minute == 0 { 1 } else { (minute - self.minute).clamp(1, 30) };
            for _ in 0..gap {
                self.throughput.push_back(0);
                if self.throughput.len() > 30 {
                    self.throughput.pop_front();
                }
            }
            self.minute = minute;
        }
        if let Some(last) = self.throughput.back_mut() {
            *last += 1;
        }
    }
}

fn placeholder(id: &str) -> Instance {
    Instance {
        id: id.to_string(),
        task: String::new(),
        def_hash: String::new(),
        state: TaskState::Pending,
        attempt: 1,
        trace_id: String::new(),
        priority: 0,
        queue: String::new(),
        trigger: String::new(),
        dedup_key: None,
        params: Value::Null,
        created_at: chrono::Utc::now(),
        started_at: None,
        finished_at: None,
        next_run_at: None,
        error: None,
        context: Value::Null,
        steps: Some(Vec::new()),
        transitions: Some(Vec::new()),
    }
}
