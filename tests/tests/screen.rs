//! What the console shows fits the terminal, at 80×24 and at 120×40:
//! long values wrap (an error in full, a multi-line command as its lines,
//! a dry-run's every step), the help lists every key, filters belong to
//! their view and clear as k9s's and lazygit's do, and the logs pane follows
//! an instance across its steps. `apollo ls` fits its terminal.

use apollo_tests::console::{cli_on_terminal, Console};
use apollo_tests::*;

const SIZES: [(u16, u16); 2] = [(24, 80), (40, 120)];

/// A step whose command is several lines and whose error ends far past any
/// terminal's edge, with a word at its very end.
const LONG: &str = r#"task: long
on_failure: stop
steps:
  - name: write
    plugin: shell
    retry: 0
    params:
      command: |
        echo one
        echo two
        echo "the disk holding /var/lib/postgresql/15/main is full and the write ahead log cannot grow any further TAILTOKEN" >&2
        exit 1
"#;

fn five_steps() -> String {
    let mut t = String::from("task: five\nsteps:\n");
    for n in ["alpha", "bravo", "charlie", "delta", "echo"] {
        t.push_str(&format!(
            "  - name: {n}\n    plugin: shell\n    params:\n      command: |\n        echo {n} starts\n        echo {n} ends\n"
        ));
    }
    t
}

fn started(agent: &Agent, size: (u16, u16)) -> Console {
    let sock = agent.socket.display().to_string();
    let c = Console::start_sized(agent.path(), &["--socket", &sock], None, &[], size);
    c.wait_for(&["connected"]);
    c
}

#[test]
fn long_values_wrap_and_every_key_is_listed_at_80x24_and_120x40() {
    let agent = Agent::builder().task("long.yaml", LONG).task("five.yaml", &five_steps()).start();
    let (code, inst) = agent.cli_json(&["run", "long", "--wait"]);
    assert_eq!(code, 1, "{inst:#}");
    for size in SIZES {
        let mut c = started(&agent, size);
        // The selected instance's error, whole, under the list.
        c.wait_for(&["<tasks>", "TAILTOKEN"]);
        // The timeline wraps it too.
        c.keys("\r");
        c.wait_for(&["<timeline>", "TAILTOKEN"]);
        // The step's params: the command as its lines, not one escaped line.
        c.keys("\r");
        let screen = c.wait_for(&["<step>", "command: |", "echo one", "echo two"]);
        assert!(!screen.contains("\\n"), "{screen}");
        // One Esc at a time (two at once read as Alt-Esc).
        c.keys("\x1b");
        c.wait_for(&["<timeline>"]);
        c.keys("\x1b");
        c.wait_for(&["<tasks>"]);
        // Every key in the help, without scrolling.
        c.keys("?");
        let help = c.wait_for(&["keys", "this help"]);
        for key in ["Shift-Tab", "Space * u", "confirm a roll back", "cancel the selected", "q Ctrl-C", ":ctx NAME"] {
            assert!(help.contains(key), "{key} at {size:?}:\n{help}");
        }
        assert!(!help.contains("more lines"), "{help}");
        c.keys("x");
        c.wait_until("the help to close", |s| !s.contains("this help"));
        // A dry-run of five steps: its last step is reached by scrolling.
        c.keys(":defs\r/five\r");
        c.wait_for(&["<defs>", "five"]);
        c.keys("d");
        let plan = c.wait_for(&["dry-run", "five: valid"]);
        if plan.contains("more lines") {
            c.keys("G");
        }
        c.wait_for(&["4 echo (shell", "echo ends"]);
        c.keys("q");
        c.wait_until("the dry-run to close", |s| !s.contains("five: valid"));
        // :q quits.
        c.keys(":q\r");
        assert_eq!(c.wait_exit(), 0, "{size:?}");
    }
}

#[test]
fn filters_belong_to_their_view_and_clear_with_ctrl_u_and_esc() {
    let agent = Agent::builder().task("long.yaml", LONG).start();
    agent.cli(&["run", "long", "--wait"]);
    let mut c = started(&agent, (24, 80));
    // Times of today are whole at 80 columns.
    let screen = c.wait_for(&["<tasks>", "long"]);
    let row = screen.lines().find(|l| l.contains("│") && l.contains(" long ")).unwrap_or_default();
    assert!(row.split_whitespace().any(|w| w.len() == 8 && w.chars().filter(|c| *c == ':').count() == 2), "{row}");
    // A state that is not one is refused, as the CLI refuses it.
    c.keys("/state:bogus\r");
    c.wait_for(&["state:bogus is not a state (expected one of: pending, running"]);
    // Ctrl-U clears the line.
    c.keys("\x15task:nosuch\r");
    c.wait_for(&["filter: task:nosuch", "nothing matches the filter \"task:nosuch\" (Esc clears it)"]);
    // Another view's filter is its own.
    c.keys(":agents\r");
    let agents = c.wait_for(&["<agents>", "live"]);
    assert!(agents.contains("filter:  "), "{agents}");
    c.keys("/nomatch\r");
    c.wait_for(&["nothing matches the filter \"nomatch\" (Esc clears it)"]);
    // Esc clears the filter first, then goes back.
    c.keys("\x1b");
    c.wait_for(&["<agents>", "live", "filter cleared"]);
    c.keys("\x1b");
    c.wait_for(&["<tasks>", "filter: task:nosuch"]);
    c.keys("\x1b");
    c.wait_for(&["<tasks>", "long", "FAILED"]);
    // Shift-Tab goes to the previous pane of the step view.
    c.keys("\r\r");
    c.wait_for(&["<step>", "params (Tab"]);
    c.keys("\x1b[Z");
    c.wait_for(&["logs of every step"]);
    c.keys("\x1b[Z");
    c.wait_for(&["items (Tab"]);
    c.keys("\x1b[Z");
    c.wait_for(&["attempts (Tab"]);
    assert_eq!(c.quit(), 0);
}

#[test]
fn apollo_ls_fits_its_terminal_and_a_pipe_gets_everything() {
    // A task name of 18 characters leaves an 80-column table 6 for its
    // error unless the name gives way.
    let named = LONG.replacen("task: long", "task: health_restart_eu", 1);
    let agent = Agent::builder().task("long.yaml", LONG).task("named.yaml", &named).start();
    agent.cli(&["run", "long", "--wait"]);
    agent.cli(&["run", "health_restart_eu", "--wait"]);
    let sock = agent.socket.display().to_string();
    let lines = cli_on_terminal(agent.path(), &["--socket", &sock, "ls"], (24, 80));
    assert!(lines.len() >= 2, "{lines:#?}");
    for l in &lines {
        assert!(l.chars().count() <= 80, "{} columns: {l}", l.chars().count());
    }
    for l in &lines[1..] {
        assert!(l.ends_with('…'), "the error is cut at the edge: {lines:?}");
        assert!(l.chars().count() == 80, "the error column gets the room: {lines:?}");
    }
    let piped = String::from_utf8_lossy(&agent.cli(&["ls"]).stdout).to_string();
    assert!(piped.contains("TAILTOKEN"), "{piped}");
}

#[test]
fn the_logs_pane_follows_the_instance_across_its_steps() {
    let gated = |name: &str| {
        format!(
            "  - name: {name}\n    plugin: shell\n    params:\n      command: |\n        echo {name}-1\n        \
             while [ ! -e ../../gate-{name} ]; do sleep 0.02; done\n        echo {name}-2\n"
        )
    };
    let agent = Agent::builder().task("two.yaml", &format!("task: two\nsteps:\n{}{}", gated("a"), gated("b"))).start();
    let out = agent.cli(&["run", "two"]);
    assert!(out.status.success());
    let mut c = started(&agent, (40, 120));
    c.wait_for(&["<tasks>", "two", "RUNNING"]);
    // The instance's first step, its logs pane.
    c.keys("\r\r");
    c.wait_for(&["<step>", "step 0 a"]);
    c.keys("\x1b[Z");
    c.wait_for(&["logs of every step, following", "a-1"]);
    std::fs::write(agent.path().join("data/gate-a"), "").unwrap();
    c.wait_for(&["a-2", "[apollo: step b, attempt 1]", "b-1"]);
    std::fs::write(agent.path().join("data/gate-b"), "").unwrap();
    c.wait_for(&["b-2"]);
    assert_eq!(c.quit(), 0);
}

/// The `up …` of the header, in seconds.
fn uptime_on(screen: &str) -> Option<u64> {
    let word = screen.split(" up ").nth(1)?.split_whitespace().next()?;
    let (m, s) = match word.split_once('m') {
        Some((m, s)) => (m.parse::<u64>().ok()?, s.trim_end_matches('s').parse::<u64>().unwrap_or(0)),
        None => (0, word.trim_end_matches('s').parse::<u64>().ok()?),
    };
    Some(m * 60 + s)
}

#[test]
fn at_80x24_the_clock_ticks_the_filter_reads_errors_and_no_prompt_claims_production() {
    let agent = Agent::builder()
        .task("long.yaml", LONG)
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")
        .task("named.yaml", "task: restart_web_fleet_eu_west\nsteps:\n  - plugin: sleep\n")
        .start();
    agent.cli(&["run", "long", "--wait"]);
    agent.cli(&["run", "ok", "--wait"]);
    let sock = agent.socket.display().to_string();
    let env = [("APOLLO_TUI_FLASH_SECS", "1")];
    let mut c = Console::start_sized(agent.path(), &["--socket", &sock], None, &env, (24, 80));
    c.wait_for(&["connected"]);
    let first = c.wait_until("the header's uptime", |s| uptime_on(s).is_some());
    let up = uptime_on(&first).unwrap();
    // No event arrives; the header's clock goes on by itself.
    c.wait_until("the uptime to tick on", |s| uptime_on(s).is_some_and(|n| n >= up + 2));
    // Free text matches the error column: only the instance whose error has it.
    c.keys("/tailtoken\r");
    let screen = c.wait_for(&["<tasks>", "filter: tailtoken", "long", "FAILED"]);
    assert!(screen.contains("tasks (1)") && !screen.lines().any(|l| l.contains(" ok ")), "{screen}");
    // The skip of its failed step names the step, and says production nowhere.
    c.keys("\r\r");
    c.wait_for(&["<step>", "write"]);
    c.keys("x");
    let prompt = c.wait_for(&["skip step write (#0) of long", "reason"]);
    assert!(!prompt.contains("production") && !prompt.contains("PRODUCTION"), "{prompt}");
    c.keys("\x1b");
    c.wait_for(&["cancelled; nothing was sent"]);
    // News goes from the status line once the moment has passed.
    c.wait_until("the news to go", |s| !s.contains("cancelled; nothing was sent"));
    c.keys("\x1b");
    c.wait_for(&["<timeline>"]);
    c.keys("\x1b");
    c.wait_for(&["<tasks>"]);
    // A name longer than its column is cut with `…`, never silently.
    c.keys(":defs\r");
    let defs = c.wait_for(&["<defs>", "restart_web_fle…"]);
    assert!(!defs.contains("restart_web_flee "), "{defs}");
    // A refused filter's message is read whole, over two lines if need be.
    c.keys(":tasks\r");
    c.wait_for(&["<tasks>"]);
    c.keys("/\x15state:nope\r");
    let refusal = c.wait_for(&["state:nope is not a state"]);
    let tail: Vec<&str> = refusal.lines().rev().take(3).collect();
    let joined: String = tail.into_iter().rev().collect::<Vec<_>>().join("");
    assert!(joined.contains("rolled_back)"), "{refusal}");
    // The refused filter is still being typed: Esc leaves it.
    c.keys("\x1b");
    c.wait_until("the filter prompt to close", |s| !s.contains("/state:nope"));
    assert_eq!(c.quit(), 0);
}

#[test]
fn the_run_form_takes_an_empty_optional_value_and_names_a_required_one() {
    let task = "task: notes\nparams:\n  owner: {required: true, description: who is on call}\n  \
                title: {default: Release notes, description: page title}\nsteps:\n  - plugin: shell\n    params:\n      \
                command: echo \"[{{ params.title }}] {{ params.owner }}\"\n";
    let agent = Agent::builder().task("notes.yaml", task).start();
    let mut c = started(&agent, (24, 80));
    c.keys(":defs\r");
    c.wait_for(&["<defs>", "notes"]);
    c.keys("r");
    c.wait_for(&["run notes", "owner", "Release notes"]);
    // The title emptied, the owner left empty: the owner is named, with its description.
    c.keys("\t");
    c.keys(&"\x7f".repeat("Release notes".len()));
    c.wait_until("the title to be empty", |s| !s.contains("Release notes"));
    c.keys("\r");
    c.wait_for(&["owner: required (who is on call): give it a value"]);
    c.keys("\x1b[A");
    c.keys("alice\r");
    c.wait_for(&["<timeline>", "notes", "SUCCESS"]);
    let (_, list) = agent.cli_json(&["ls"]);
    let params = &list[0]["params"];
    assert_eq!((params["title"].as_str(), params["owner"].as_str()), (Some(""), Some("alice")), "{list:#}");
    assert_eq!(c.quit(), 0);
}

#[test]
fn every_cli_table_fits_an_80_column_terminal_and_a_pipe_gets_it_whole() {
    let mut wide = String::from("task: a_task_with_a_long_name_and_many_steps\nsteps:\n");
    for n in ["download", "verify", "unpack", "migrate", "restart", "check", "announce"] {
        wide.push_str(&format!("  - {{name: {n}, plugin: sleep}}\n"));
    }
    let agent = Agent::builder().task("long.yaml", LONG).task("wide.yaml", &wide).start();
    agent.cli(&["run", "long", "--wait"]);
    let sock = agent.socket.display().to_string();
    for table in ["defs", "plugins", "agents", "queues", "alerts", "audit", "locks", "approvals"] {
        let lines = cli_on_terminal(agent.path(), &["--socket", &sock, table], (24, 80));
        for l in &lines {
            assert!(l.chars().count() <= 80, "apollo {table}: {} columns: {l}", l.chars().count());
        }
    }
    // The plugins table is wider than 80: cut on a terminal, whole into a pipe.
    let cut = cli_on_terminal(agent.path(), &["--socket", &sock, "plugins"], (24, 80));
    assert!(cut.iter().any(|l| l.ends_with('…')), "{cut:#?}");
    let piped = String::from_utf8_lossy(&agent.cli(&["plugins"]).stdout).to_string();
    assert!(piped.lines().any(|l| l.chars().count() > 80), "{piped}");
}
