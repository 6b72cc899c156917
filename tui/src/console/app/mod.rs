//! The console's state and the only function that changes it: keys become
//! [`Action`]s, agent news becomes [`News`], and [`App::update`] /
//! [`App::on_news`] turn them into new state plus [`Cmd`]s for the agent
//! worker. Views draw `&App` and do no IO.

use apollo_shared::protocol::{
    AgentStatus, Alert, DefInfo, HelloResult, Instance, ListParams, PluginInfo, QueueStats, Role,
};
use serde_json::{Map, Value};
use std::collections::{BTreeSet, VecDeque};

mod batch;
mod fleet;
mod news;
mod panes;
mod types;
mod update;

pub use types::*;

/// The minutes of throughput the console keeps.
pub const THROUGHPUT_MINUTES: usize = 60;

pub struct App {
    pub transport: String,
    pub conn: Conn,
    pub hello: Option<HelloResult>,
    pub status: Option<AgentStatus>,
    /// When `status` and `queues` arrived: the times they hold (uptime,
    /// oldest pending) tick on from there with the clock.
    pub status_at: Option<std::time::Instant>,
    pub queues_at: Option<std::time::Instant>,
    /// `--readonly`, a read-only context, or the agent says we are an observer.
    pub readonly_flag: bool,
    /// The context attached to (`--context`), shown in the header.
    pub context: Option<crate::contexts::Context>,
    /// Every context of `contexts.yaml`, and how each is doing (`:fleet`).
    pub contexts: Vec<crate::contexts::Context>,
    pub fleet: std::collections::BTreeMap<String, FleetState>,
    /// Instances marked for a batch action (tasks view).
    pub marked: BTreeSet<String>,
    pub view: View,
    pub back: Vec<View>,
    pub mode: Mode,
    pub queues: Vec<QueueStats>,
    pub tasks: Vec<Instance>,
    pub next_cursor: Option<String>,
    pub defs: Vec<DefInfo>,
    pub plugins: Vec<PluginInfo>,
    /// The rollouts, newest first, shown under the plugins.
    pub rollouts: Vec<apollo_shared::protocol::Rollout>,
    pub alerts: Vec<Alert>,
    pub agents: Vec<apollo_shared::protocol::AgentInfo>,
    /// Selected row per list view, and the offset of the first shown row.
    pub selected: std::collections::HashMap<View, usize>,
    /// The filter of each list view (`state:failed task:x queue:y text`).
    pub filters: std::collections::HashMap<View, String>,
    pub instance: Option<Instance>,
    pub step: u32,
    pub pane: Pane,
    pub logs: String,
    /// The open instance's fan-out steps' items, by step.
    pub items: std::collections::BTreeMap<u32, Vec<apollo_shared::protocol::ItemRun>>,
    /// The items pane's keys folded once already (see `News::Items`).
    pub items_seen: BTreeSet<String>,
    /// Folded JSON paths in the step view.
    pub folds: BTreeSet<String>,
    pub message: Option<(String, bool)>,
    /// When `message` was said: a message that is not an error goes after
    /// `flash` (the state it spoke of has moved on); an error stays until
    /// the next key.
    pub message_at: Option<std::time::Instant>,
    pub flash: std::time::Duration,
    /// Instances that ended, per minute, oldest first, over the last hour
    /// (the sparkline and the header's count): `agent.stats` as last read
    /// (the worker reads it again as instances end and as minutes pass).
    pub throughput: VecDeque<u64>,
    /// Per queue, what ended over the last hour (`agent.stats`).
    pub rates: Vec<apollo_shared::protocol::QueueRate>,
    /// How far the open overlay (help, dry-run, results) is scrolled.
    pub overlay_scroll: usize,
    /// The logs pane shows the newest lines as they come (until the user
    /// scrolls up; End or G follows again).
    pub logs_tail: bool,
    /// Index into [`SORTS`].
    pub sort: usize,
    /// The tasks view lists the archive.
    pub archived: bool,
    pub quit: bool,
}

impl App {
    /// Seconds since `at` (0 before anything arrived).
    pub fn since(at: Option<std::time::Instant>) -> f64 {
        at.map_or(0.0, |t| t.elapsed().as_secs_f64())
    }

    pub fn new(transport: String, readonly: bool) -> App {
        App {
            transport,
            conn: Conn::Connecting,
            hello: None,
            status: None,
            status_at: None,
            queues_at: None,
            readonly_flag: readonly,
            context: None,
            contexts: Vec::new(),
            fleet: Default::default(),
            marked: BTreeSet::new(),
            view: View::Tasks,
            back: Vec::new(),
            mode: Mode::Normal,
            queues: Vec::new(),
            tasks: Vec::new(),
            next_cursor: None,
            defs: Vec::new(),
            plugins: Vec::new(),
            rollouts: Vec::new(),
            alerts: Vec::new(),
            agents: Vec::new(),
            selected: Default::default(),
            filters: Default::default(),
            instance: None,
            step: 0,
            pane: Pane::Params,
            logs: String::new(),
            items: Default::default(),
            items_seen: Default::default(),
            folds: BTreeSet::new(),
            message: None,
            message_at: None,
            // APOLLO_TUI_FLASH_SECS: how long news stays on the status line.
            flash: std::time::Duration::from_secs_f64(
                std::env::var("APOLLO_TUI_FLASH_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(8.0),
            ),
            throughput: VecDeque::from(vec![0; THROUGHPUT_MINUTES]),
            rates: Vec::new(),
            overlay_scroll: 0,
            logs_tail: true,
            sort: 0,
            archived: false,
            quit: false,
        }
    }

    pub fn readonly(&self) -> bool {
        self.readonly_flag
            || self.context.as_ref().is_some_and(|c| c.read_only)
            || self.hello.as_ref().is_some_and(|h| h.role == Role::Observer)
    }

    pub fn filter(&self, v: View) -> &str {
        self.filters.get(&v).map(String::as_str).unwrap_or("")
    }

    pub fn sel(&self, v: View) -> usize {
        self.selected.get(&v).copied().unwrap_or(0)
    }

    /// The query of the tasks view: `state:`, `task:`, `queue:` go to the agent.
    pub fn tasks_query(&self) -> ListParams {
        let mut q = ListParams { limit: Some(200), archived: self.archived, ..Default::default() };
        for word in self.filter(View::Tasks).split_whitespace() {
            match word.split_once(':') {
                // A state that is not one matches nothing locally, and is not sent.
                Some(("state", v)) => q.state = v.to_ascii_uppercase().parse().ok(),
                Some(("task", v)) => q.task = Some(v.to_string()),
                Some(("queue", v)) => q.queue = Some(v.to_string()),
                _ => {}
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
            // Free text matches every column the table shows, the error (or
            // why it waits) too, as k9s's filter does.
            .filter(|i| {
                let note = i.note().unwrap_or_default();
                self.keep(View::Tasks, &format!("{} {} {} {} {note}", i.id, i.task, i.state, i.queue))
            })
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
    /// Every queue with work now (`queues.stats`) or with instances that
    /// ended in the last hour (`agent.stats`), by name.
    pub fn visible_queues(&self) -> Vec<QueueStats> {
        let mut all = self.queues.clone();
        for r in &self.rates {
            if !all.iter().any(|q| q.queue == r.queue) {
                all.push(QueueStats {
                    queue: r.queue.clone(),
                    running: 0,
                    limit: None,
                    pending: 0,
                    retrying: 0,
                    oldest_pending_secs: None,
                    paused: None,
                });
            }
        }
        all.sort_by(|a, b| a.queue.cmp(&b.queue));
        all.retain(|q| self.keep(View::Queues, &q.queue));
        all
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

    pub fn visible_agents(&self) -> Vec<&apollo_shared::protocol::AgentInfo> {
        self.agents
            .iter()
            .filter(|a| self.keep(View::Agents, &format!("{} {} {}", a.name, a.host, a.serves())))
            .collect()
    }

    fn rows(&self, v: View) -> usize {
        match v {
            View::Queues => self.visible_queues().len(),
            View::Tasks => self.visible_tasks().len(),
            View::Defs => self.visible_defs().len(),
            View::Plugins => self.visible_plugins().len(),
            View::Alerts => self.visible_alerts().len(),
            View::Agents => self.visible_agents().len(),
            View::Fleet => self.visible_fleet().len(),
            View::Timeline => self.instance.as_ref().and_then(|i| i.steps.as_ref()).map_or(0, Vec::len),
            View::Step if self.pane == Pane::Logs => self.logs.lines().count(),
            View::Step => self.step_lines().len(),
        }
    }

    /// The lines of the step view's JSON pane: (path, text).
    pub fn step_lines(&self) -> Vec<(String, String)> {
        self.pane_value().map(|v| super::json::lines(&v, &self.folds)).unwrap_or_default()
    }

    fn watch(&self) -> Cmd {
        let logs = (self.view == View::Step && self.pane == Pane::Logs).then_some(self.step);
        let instance = matches!(self.view, View::Timeline | View::Step)
            .then(|| self.instance.as_ref().map(|i| i.id.clone()))
            .flatten();
        Cmd::Watch { query: self.tasks_query(), instance, logs }
    }

    pub fn say(&mut self, text: impl Into<String>, error: bool) {
        self.message = Some((text.into(), error));
        self.message_at = Some(std::time::Instant::now());
    }

    /// The status line's message, while it holds: an error, or news younger
    /// than `flash`.
    pub fn shown_message(&self) -> Option<&(String, bool)> {
        let fresh = self.message_at.is_none_or(|t| t.elapsed() < self.flash);
        self.message.as_ref().filter(|(_, error)| *error || fresh)
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
        // The logs pane: from the tail when it follows; at the last line it
        // follows again.
        let logs = v == View::Step && self.pane == Pane::Logs;
        let cur = if logs && self.logs_tail { n as isize - 1 } else { self.sel(v) as isize };
        let next = (cur + delta).clamp(0, n as isize - 1) as usize;
        self.selected.insert(v, next);
        if logs {
            self.logs_tail = next + 1 == n;
        }
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

    /// The instances `T` shows in one timeline: in the tasks view the
    /// marked ones, else every one the filter keeps when a filter is set
    /// (an incident's instances, found by `state:failed queue:x`), else the
    /// selected one; elsewhere the instance open.
    fn timeline_ids(&self) -> Vec<String> {
        if self.view == View::Tasks && !self.marked.is_empty() {
            return self.marked.iter().cloned().collect();
        }
        if self.view == View::Tasks && !self.filter(View::Tasks).trim().is_empty() {
            return self.visible_tasks().iter().map(|i| i.id.clone()).collect();
        }
        self.focused_instance().map(|i| vec![i.id.clone()]).unwrap_or_default()
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
        let specs = self.defs.iter().find(|d| d.task == task).and_then(|d| d.params.as_object().cloned());
        let specs = specs.unwrap_or_default();
        let fields = specs
            .iter()
            .map(|(name, spec)| {
                let default = match &spec["default"] {
                    Value::Null => String::new(),
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (name.clone(), default, spec["description"].as_str().unwrap_or("").to_string())
            })
            .collect();
        RunForm { task: task.to_string(), fields, focus: 0, error: None, specs }
    }

    /// The form's params; a value that parses as JSON is taken as JSON. An
    /// empty field is the empty text for a param with a default (as `-p
    /// title=` is), left out for an optional one without (the definition
    /// decides), and refused for a required one, with its description.
    pub fn form_params(form: &RunForm) -> Result<Map<String, Value>, String> {
        let mut out = Map::new();
        for (name, text, desc) in &form.fields {
            if text.trim().is_empty() {
                let spec = form.specs.get(name).cloned().unwrap_or_default();
                if spec["required"] == Value::Bool(true) && spec["default"].is_null() {
                    let what = if desc.is_empty() { String::new() } else { format!(" ({desc})") };
                    return Err(format!("{name}: required{what}: give it a value"));
                }
                if !spec["default"].is_null() {
                    out.insert(name.clone(), Value::String(String::new()));
                }
                continue;
            }
            let v = serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.clone()));
            out.insert(name.clone(), v);
        }
        Ok(out)
    }
}
