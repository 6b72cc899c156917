//! Agent news in: [`App::on_news`].

use super::*;
use apollo_shared::state::TaskState;

impl App {
    pub fn on_news(&mut self, n: News) -> Vec<Cmd> {
        match n {
            News::Connecting => self.conn = Conn::Connecting,
            News::Connected(h) => {
                self.conn = Conn::Connected;
                self.hello = Some(h);
                return vec![self.watch()];
            }
            News::Lost { attempt, reason } => self.conn = Conn::Lost { attempt, reason },
            News::Status(s) => (self.status, self.status_at) = (Some(s), Some(std::time::Instant::now())),
            News::Queues(q) => (self.queues, self.queues_at) = (q, Some(std::time::Instant::now())),
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
                    if self.instance.as_ref().is_some_and(|cur| cur.id != i.id) {
                        self.items.clear();
                    }
                    self.instance = Some(*i);
                }
            }
            News::Items { id, seq, items } => {
                if self.instance.as_ref().is_some_and(|i| i.id == id) {
                    // Each item shows folded, one line, until Enter opens it
                    // (once: a fold the operator opened stays open).
                    for i in &items {
                        let path = format!("$.{}", super::panes::item_key(i));
                        if self.items_seen.insert(path.clone()) {
                            self.folds.insert(path);
                        }
                    }
                    self.items.insert(seq, items);
                }
            }
            News::Defs(d) => self.defs = d,
            News::Plugins(p) => self.plugins = p,
            News::Rollouts(r) => self.rollouts = r,
            News::Alerts(a) => self.alerts = a,
            News::Agents(a) => self.agents = a,
            News::Logs { id, text, reset } => {
                if self.instance.as_ref().is_some_and(|i| i.id == id) {
                    if reset {
                        self.logs = text;
                    } else {
                        self.logs.push_str(&text);
                    }
                }
            }
            News::DryRun(r) => self.mode = Mode::DryRun(r),
            News::Timeline { lines, file } => {
                match &file {
                    Ok(path) => self.say(format!("timeline written to {path} (Markdown)"), false),
                    Err(e) => self.say(e.clone(), true),
                }
                self.mode = Mode::Results(lines);
            }
            News::Done(Ok(m)) => self.say(m, false),
            News::Done(Err(m)) => self.say(m, true),
            News::Triggered(id) => {
                // Open the new instance's timeline; the watch fills it in.
                self.instance = Some(placeholder(&id));
                self.selected.insert(View::Timeline, 0);
                self.step = 0;
                return self.go(View::Timeline);
            }
            News::Event(_) => {}
            News::BatchDone(verb, results) => self.batch_done(verb, results),
            News::Fleet(name, state) => {
                self.fleet.insert(name, state);
            }
            News::Stats(st) => {
                // The store's counts, as a fresh read says them.
                self.throughput = st.ended.iter().rev().take(THROUGHPUT_MINUTES).rev().copied().collect();
                while self.throughput.len() < THROUGHPUT_MINUTES {
                    self.throughput.push_front(0);
                }
                self.rates = st.queues;
            }
        }
        Vec::new()
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
        lease_owner: None,
        lease_expires_at: None,
        waiting: None,
        failed_steps: 0,
        pins: None,
        locks: Vec::new(),
        context: Value::Null,
        steps: Some(Vec::new()),
        transitions: Some(Vec::new()),
    }
}
