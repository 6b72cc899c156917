//! The vocabulary of the console: views, modes, actions in, news in, commands out.

use apollo_shared::protocol::{
    AgentInfo, AgentStatus, Alert, DefInfo, DryRunResult, Event, HelloResult, Instance, ListParams, PluginInfo,
    QueueStats,
};
use apollo_shared::state::OperatorAction;
use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum View {
    Queues,
    Tasks,
    Timeline,
    Step,
    Defs,
    Plugins,
    Alerts,
    Agents,
    /// Every context side by side (`:fleet`, `:ctx`).
    Fleet,
}

impl View {
    /// Views reachable with `:`.
    pub const NAMED: [(&'static str, View); 7] = [
        ("queues", View::Queues),
        ("tasks", View::Tasks),
        ("defs", View::Defs),
        ("plugins", View::Plugins),
        ("alerts", View::Alerts),
        ("agents", View::Agents),
        ("fleet", View::Fleet),
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
            View::Agents => "agents",
            View::Fleet => "fleet",
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
    /// The last attempt beside the one before it.
    Attempts,
    Logs,
    /// A fan-out step's items, each foldable to its params, output, error
    /// and history.
    Items,
}

impl Pane {
    /// The logs last: Shift-Tab from the first pane reaches them.
    pub const ALL: [Pane; 7] =
        [Pane::Params, Pane::Before, Pane::After, Pane::Output, Pane::Attempts, Pane::Items, Pane::Logs];
    pub fn title(self) -> &'static str {
        match self {
            Pane::Params => "params",
            Pane::Before => "context before",
            Pane::After => "context after",
            Pane::Output => "output",
            Pane::Attempts => "attempts",
            Pane::Logs => "logs",
            Pane::Items => "items",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Conn {
    Connecting,
    Connected,
    Lost { attempt: u32, reason: String },
}

/// A destructive action waiting for its confirmation. `y` confirms; Enter
/// alone never does. On a production context the task name must be typed,
/// then a reason given (recorded with the action).
#[derive(Debug, Clone, PartialEq)]
pub struct Confirm {
    pub action: OperatorAction,
    /// The instances it goes to: one, or the marked ones the table allows.
    pub ids: Vec<String>,
    /// What is typed on production: the task name, or for a batch the count.
    pub task: String,
    pub verb: &'static str,
    /// A batch's preview: a line per marked instance, what happens to it or
    /// why the transition table refuses it. Empty for one instance.
    pub plan: Vec<String>,
    pub stage: Stage,
    /// What is typed at the current stage.
    pub input: String,
    /// The task name was typed right; the reason comes next.
    pub reason: Option<String>,
    /// What is confirmed when it is not `action`: a skip, a pause, an
    /// approval (each always asks a reason).
    pub other: Option<Other>,
    /// Asked on a production context (the prompt says so, in red).
    pub production: bool,
    /// The step's name, for a skip.
    pub step: Option<String>,
}

/// A confirmation of something other than an [`OperatorAction`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Other {
    /// Skip this step (`x` in the step view).
    Skip(u32),
    /// Skip this item of the fan-out step (`x` on an item in its pane).
    SkipItem { seq: u32, item: u32 },
    /// Pause the queue named `task`, or resume it.
    Pause { resume: bool },
    /// Decide the approval the instance waits for.
    Approve { deny: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Press `y`.
    Yes,
    /// Type the task name (production).
    TaskName,
    /// Type the reason (production).
    Reason,
}

impl Confirm {
    /// Whether keys are text at this stage.
    pub fn typing(&self) -> bool {
        self.stage != Stage::Yes
    }

    pub fn batch(&self) -> bool {
        !self.plan.is_empty()
    }

    /// The question, a line each (a batch's plan first).
    pub fn prompt(&self) -> Vec<String> {
        let (what, name) = if self.batch() {
            (format!("{} {} instances", self.verb, self.ids.len()), "the number of instances")
        } else if matches!(self.other, Some(Other::Pause { .. })) {
            (format!("{} {}", self.verb, self.task), "the queue name")
        } else if let Some(Other::Skip(seq)) = self.other {
            // The step is what is skipped: its name and number, then whose.
            let step = self.step.as_deref().unwrap_or("");
            (format!("{} {step} (#{seq}) of {} {}", self.verb, self.task, self.ids.join(" ")), "the task name")
        } else if let Some(Other::SkipItem { .. }) = self.other {
            // `step` names the item and its step.
            let item = self.step.as_deref().unwrap_or("");
            (format!("{} {item} of {} {}", self.verb, self.task, self.ids.join(" ")), "the task name")
        } else {
            (format!("{} {} {}", self.verb, self.task, self.ids.join(" ")), "the task name")
        };
        let mut lines = self.plan.clone();
        match self.stage {
            Stage::Yes => {
                lines.push(format!("{what}?"));
                lines.push("y confirms, any other key cancels (Enter does not)".into());
            }
            Stage::TaskName => {
                lines.push(format!("PRODUCTION: {what}"));
                lines.push(format!("type {name} ({}) to go on, Esc cancels: {}▏", self.task, self.input));
            }
            Stage::Reason if self.other.is_some() => {
                let (then, kept) = match self.other {
                    Some(Other::Skip(_)) => {
                        ("it is recorded SKIPPED and the instance resumes after it", "with the skip")
                    }
                    Some(Other::SkipItem { .. }) => {
                        ("it is recorded SKIPPED and never runs; a retry (t) runs the items left", "with the skip")
                    }
                    Some(Other::Pause { resume: true }) => ("its waiting instances are claimed again", "in the audit"),
                    Some(Other::Pause { resume: false }) => {
                        ("nothing new is claimed from it; running instances go on", "in the audit")
                    }
                    Some(Other::Approve { deny: true }) => {
                        ("the step fails and the instance follows its on_failure", "in the audit")
                    }
                    _ => ("the instance resumes from the approval step", "in the audit"),
                };
                lines.push(format!("{what}: {then}"));
                lines.push(format!("reason, recorded {kept}, then Enter (Esc cancels): {}▏", self.input));
            }
            Stage::Reason => {
                lines.push(if self.production { format!("PRODUCTION: {what}") } else { format!("{what}?") });
                lines.push(format!("reason, recorded with the action, then Enter: {}▏", self.input));
            }
        }
        lines
    }
}

/// The run form: the task's declared params with their defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct RunForm {
    pub task: String,
    /// (name, text as typed, description).
    pub fields: Vec<(String, String, String)>,
    pub focus: usize,
    pub error: Option<String>,
    /// The declared params (`default`, `required`, `description` each).
    pub specs: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    Normal,
    Command(String),
    Filter(String),
    Confirm(Confirm),
    Form(RunForm),
    DryRun(DryRunResult),
    /// A batch's results, a line per instance; any key closes.
    Results(Vec<String>),
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
    /// The selected instance's timeline, shown and written as Markdown.
    Timeline,
    Retry,
    /// Skip the failed step shown in the step view.
    Skip,
    /// Pause the selected queue, or resume it when it is paused.
    Pause,
    /// Approve, deny the approval the selected instance waits for.
    Approve,
    Deny,
    Rollback,
    Cancel,
    Yes,
    No,
    NextPane,
    /// The previous pane (Shift-Tab); where there is none, back.
    PrevPane,
    /// Clear the line being typed (Ctrl-U).
    ClearLine,
    /// Sort the tasks view by the next column.
    Sort,
    /// Show the archive in the tasks view, or the live instances again.
    Archive,
    /// Mark the selected instance for a batch action, or unmark it.
    Mark,
    /// Mark every instance the filter shows.
    MarkAll,
    /// Clear the marks.
    Unmark,
}

/// Columns the tasks view sorts by (`s` cycles).
pub const SORTS: [&str; 5] = ["created", "task", "state", "queue", "attempt"];

/// What the agent worker reports.
#[derive(Debug, Clone)]
pub enum News {
    /// What a batch did to each instance: (id, its new state, or the refusal).
    BatchDone(&'static str, Vec<(String, Result<String, String>)>),
    /// How one context of the fleet is doing.
    Fleet(String, FleetState),
    /// What ended over the last hour, from the store (at attach).
    Stats(apollo_shared::protocol::StatsResult),
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
    Instance(Box<Instance>),
    Defs(Vec<DefInfo>),
    Plugins(Vec<PluginInfo>),
    Rollouts(Vec<apollo_shared::protocol::Rollout>),
    Alerts(Vec<Alert>),
    Agents(Vec<AgentInfo>),
    /// The open instance's fan-out step's items (its first 500).
    Items {
        id: String,
        seq: u32,
        items: Vec<apollo_shared::protocol::ItemRun>,
    },
    /// The followed instance's logs: more text, or (`reset`) all of it.
    Logs {
        id: String,
        text: String,
        reset: bool,
    },
    DryRun(DryRunResult),
    /// An instance's timeline, a line per event, and where its Markdown was
    /// written (or why it was not).
    Timeline {
        lines: Vec<String>,
        file: Result<String, String>,
    },
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
        query: ListParams,
        instance: Option<String>,
        logs: Option<u32>,
    },
    MoreTasks {
        query: ListParams,
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
    /// The instances' timeline (`tasks.timeline`), its Markdown written to a file.
    Timeline {
        ids: Vec<String>,
    },
    /// Attach to another context (the console starts over on it).
    Switch(crate::contexts::Context),
    /// One action on each of these instances, each result reported.
    Batch {
        action: OperatorAction,
        ids: Vec<String>,
        reason: Option<String>,
    },
    /// Keep every context's state coming (`News::Fleet`).
    WatchFleet,
    /// Decide the approval an instance waits for (`approvals.decide`).
    Approve {
        id: String,
        deny: bool,
        reason: String,
    },
    /// Pause a queue, or resume it (`scheduler.pause`, `scheduler.resume`).
    Pause {
        queue: String,
        resume: bool,
        reason: String,
    },
    /// Mark a FAILED instance's failed step done by hand (`steps.skip`),
    /// or one item of it.
    Skip {
        id: String,
        seq: u32,
        reason: String,
        item: Option<u32>,
    },
    Act {
        action: OperatorAction,
        id: String,
        /// Why, recorded with the action.
        reason: Option<String>,
    },
    Quit,
}

/// One context as the fleet view shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum FleetState {
    Connecting,
    Up { agent: String, counts: std::collections::BTreeMap<String, u64>, store_error: Option<String> },
    Unreachable(String),
}
