//! Contexts and the fleet: `:ctx NAME` (Tab completes) attaches to another
//! context; `:ctx` and `:fleet` show every context side by side, live, and
//! Enter on one attaches to it.

use super::*;

impl App {
    /// The contexts in the order of the file, as the fleet view lists them.
    pub fn visible_fleet(&self) -> Vec<&crate::contexts::Context> {
        self.contexts.iter().filter(|c| self.keep(View::Fleet, &format!("{} {}", c.name, c.describe()))).collect()
    }

    pub fn fleet_state(&self, name: &str) -> &FleetState {
        self.fleet.get(name).unwrap_or(&FleetState::Connecting)
    }

    /// `ctx` and `ctx NAME` from the command line; `None` when `text` is
    /// not a context command.
    pub(super) fn ctx_command(&mut self, text: &str) -> Option<Vec<Cmd>> {
        let rest = text.strip_prefix("ctx").filter(|r| r.is_empty() || r.starts_with(' '))?;
        let name = rest.trim();
        if name.is_empty() {
            return Some(self.open_fleet());
        }
        let found = self.contexts.iter().find(|c| c.name == name).or_else(|| {
            let mut m = self.contexts.iter().filter(|c| c.name.starts_with(name));
            m.next().filter(|_| m.next().is_none())
        });
        Some(match found.cloned() {
            Some(c) => self.switch(c),
            None => {
                let known: Vec<&str> = self.contexts.iter().map(|c| c.name.as_str()).collect();
                let msg = if known.is_empty() {
                    format!("no contexts: write them in {}", crate::contexts::path().display())
                } else {
                    format!("no context {name:?} (contexts: {})", known.join(", "))
                };
                self.say(msg, true);
                Vec::new()
            }
        })
    }

    /// Tab after `ctx `: the first context name that starts with what is typed.
    pub(super) fn complete_ctx(&self, text: &str) -> Option<String> {
        let typed = text.strip_prefix("ctx ")?.trim();
        self.contexts.iter().find(|c| c.name.starts_with(typed)).map(|c| format!("ctx {}", c.name))
    }

    pub(super) fn open_fleet(&mut self) -> Vec<Cmd> {
        let mut cmds = self.go(View::Fleet);
        cmds.push(Cmd::WatchFleet);
        if self.contexts.is_empty() {
            self.say(format!("no contexts: write them in {}", crate::contexts::path().display()), true);
        }
        cmds
    }

    /// Enter on a fleet row.
    pub(super) fn switch_to_selected(&mut self) -> Vec<Cmd> {
        match self.visible_fleet().get(self.sel(View::Fleet)).map(|c| (*c).clone()) {
            Some(c) => self.switch(c),
            None => Vec::new(),
        }
    }

    fn switch(&mut self, c: crate::contexts::Context) -> Vec<Cmd> {
        if self.context.as_ref().is_some_and(|cur| cur.name == c.name) {
            self.say(format!("already on {}", c.name), false);
            return Vec::new();
        }
        self.say(format!("attaching to {} ({})", c.name, c.describe()), false);
        vec![Cmd::Switch(c)]
    }

    /// The state to start over with on another context: what belongs to
    /// the console (contexts, the fleet, the flags) is kept.
    pub fn for_context(&self, c: crate::contexts::Context, transport: String) -> App {
        let mut next = App::new(transport, self.readonly_flag);
        next.context = Some(c);
        next.contexts = self.contexts.clone();
        next.fleet = self.fleet.clone();
        next
    }
}
