//! Following an instance as it runs: `apollo logs ID --follow` prints every
//! step's output as it is written, each attempt opened by a line naming it,
//! until the instance ends, and exits with its outcome; `run --wait` (and
//! `retry`/`rollback --wait`) prints the id at once and a line per step as
//! it starts and ends; Ctrl-C leaves the instance running and says how to
//! attach again.

use apollo_tests::*;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// A step that prints `<name>-1`, waits for the gate file `gate-<name>`,
/// prints `<name>-2`.
fn gated(name: &str) -> String {
    format!(
        "  - name: {name}\n    plugin: shell\n    retry: 1\n    params:\n      command: |\n        echo {name}-1\n        \
         while [ ! -e ../../gate-{name} ]; do sleep 0.02; done\n        echo {name}-2\n"
    )
}

const FAIL_ONCE: &str = "        [ \"$APOLLO_ATTEMPT\" = 2 ] || { echo c-failed; exit 3; }\n";

fn three_steps() -> String {
    let c = gated("c").replace("        echo c-1\n", &format!("        echo c-1\n{FAIL_ONCE}"));
    format!("task: three\nsteps:\n{}{}{c}", gated("a"), gated("b"))
}

/// `apollo ARGS` with its output read line by line as it comes.
struct Watched {
    child: Child,
    stdout: Receiver<String>,
    stderr: Receiver<String>,
}

impl Watched {
    fn start(agent: &Agent, args: &[&str]) -> Watched {
        let mut child = Command::new(cli_bin())
            .current_dir(agent.path())
            .arg("--socket")
            .arg(&agent.socket)
            .args(args)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = |r: Box<dyn std::io::Read + Send>| {
            let (tx, rx) = channel();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(r).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            rx
        };
        let stdout = lines(Box::new(child.stdout.take().unwrap()));
        let stderr = lines(Box::new(child.stderr.take().unwrap()));
        Watched { child, stdout, stderr }
    }

    /// The next line of `rx` (30 s at most).
    fn next(rx: &Receiver<String>, what: &str) -> String {
        rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("no line came: waiting for {what}"))
    }

    /// Lines of `rx` until one that `pred` accepts; all of them, in order.
    fn until(rx: &Receiver<String>, what: &str, pred: impl Fn(&str) -> bool) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("no line for {what}; saw {seen:#?}"));
            let done = pred(&line);
            seen.push(line);
            if done {
                return seen;
            }
        }
    }

    fn exit_code(mut self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "apollo did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn interrupt(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    }
}

fn open(agent: &Agent, gate: &str) {
    std::fs::write(agent.path().join(format!("data/gate-{gate}")), "").unwrap();
}

#[test]
fn logs_follow_the_whole_instance_step_by_step_and_exit_with_its_outcome() {
    let agent =
        Agent::builder().config("scheduler:\n  backoff_base: 50ms\n").task("three.yaml", &three_steps()).start();
    let out = agent.cli(&["run", "three"]);
    let id = String::from_utf8_lossy(&out.stdout).split_whitespace().nth(2).unwrap().to_string();
    let f = Watched::start(&agent, &["logs", &id, "--follow"]);
    // Each line shows while its step still runs: the gate opens only after.
    let mut lines = Watched::until(&f.stdout, "a-1", |l| l == "a-1");
    open(&agent, "a");
    lines.extend(Watched::until(&f.stdout, "b-1", |l| l == "b-1"));
    open(&agent, "b");
    lines.extend(Watched::until(&f.stdout, "c's first attempt fails", |l| l == "c-failed"));
    lines.extend(Watched::until(&f.stdout, "c's second attempt", |l| l == "c-1"));
    open(&agent, "c");
    lines.extend(Watched::until(&f.stdout, "c-2", |l| l == "c-2"));
    assert_eq!(
        lines,
        [
            "[apollo: step a, attempt 1]",
            "a-1",
            "a-2",
            "[apollo: step b, attempt 1]",
            "b-1",
            "b-2",
            "[apollo: step c, attempt 1]",
            "c-1",
            "c-failed",
            "[apollo: step c, attempt 2]",
            "c-1",
            "c-2",
        ]
    );
    let progress = Watched::until(&f.stderr, "the end", |l| l.starts_with("SUCCESS three"));
    assert!(progress.iter().any(|l| l.starts_with("  step 2 c: FAILED (attempt 1")), "{progress:#?}");
    assert_eq!(f.exit_code(), 0, "the instance ended SUCCESS");
    // Once it has ended, the same command prints the logs and exits at once.
    let again = agent.cli_within(&["logs", &id, "--follow"], Duration::from_secs(30));
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&again.stdout).lines().count(), 12);
    // As JSON lines: one object a line, with the step.
    let json = agent.cli(&["logs", &id, "--json"]);
    let rows: Vec<serde_json::Value> =
        String::from_utf8_lossy(&json.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 12);
    assert_eq!(
        (rows[1]["step"].as_u64(), rows[1]["name"].as_str(), rows[1]["line"].as_str()),
        (Some(0), Some("a"), Some("a-1"))
    );
}

#[test]
fn run_wait_says_the_id_at_once_and_each_step_and_ctrl_c_leaves_it_running() {
    let agent = Agent::builder().task("three.yaml", &three_steps()).start();
    let w = Watched::start(&agent, &["run", "three", "--wait"]);
    let first = Watched::next(&w.stderr, "the created line");
    assert!(first.starts_with("created three "), "{first}");
    let id = first.split_whitespace().nth(2).unwrap().trim_end_matches(';').to_string();
    Watched::until(&w.stderr, "step a running", |l| l.starts_with("  step 0 a: RUNNING (attempt 1)"));
    open(&agent, "a");
    Watched::until(&w.stderr, "step a's end", |l| l.starts_with("  step 0 a: SUCCESS (attempt 1, "));
    Watched::until(&w.stderr, "step b running", |l| l.starts_with("  step 1 b: RUNNING (attempt 1)"));
    // Ctrl-C: the id and the command that attaches again; the instance runs on.
    w.interrupt();
    let said = Watched::until(&w.stderr, "the re-attach hint", |l| l.contains("keeps running"));
    let hint = said.last().unwrap();
    let sock = agent.socket.display().to_string();
    assert!(hint.contains(&format!("apollo --socket {sock} logs {id} --follow")), "{hint}");
    assert_eq!(w.exit_code(), 130);
    let (_, inst) = agent.cli_json(&["show", &id]);
    assert_eq!(inst["state"], "RUNNING", "{inst:#}");
    // Ctrl-C during --follow says the same.
    let f = Watched::start(&agent, &["logs", &id, "--follow"]);
    Watched::until(&f.stdout, "b-1", |l| l == "b-1");
    f.interrupt();
    Watched::until(&f.stderr, "the re-attach hint", |l| l.contains(&format!("logs {id} --follow")));
    assert_eq!(f.exit_code(), 130);
    open(&agent, "b");
    open(&agent, "c");
    let done = agent.cli_within(&["logs", &id, "--follow"], Duration::from_secs(60));
    assert_eq!(done.status.code(), Some(0), "{}", String::from_utf8_lossy(&done.stderr));
}

#[test]
fn retry_and_rollback_wait_for_the_end() {
    let agent = Agent::builder()
        .task(
            "gate.yaml",
            "task: gate\non_failure: stop\nsteps:\n  - name: check\n    plugin: shell\n    retry: 0\n    params:\n      \
             command: test -f ../../gate-open\n      rollback_command: echo undone\n",
        )
        .start();
    let (code, inst) = agent.cli_json(&["run", "gate", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")));
    let id = inst["id"].as_str().unwrap();
    // Still closed: the retry fails again, and --wait says so with exit 1.
    let again = agent.cli_within(&["retry", id, "--wait"], Duration::from_secs(60));
    let err = String::from_utf8_lossy(&again.stderr).to_string();
    assert_eq!(again.status.code(), Some(1), "{err}");
    assert!(err.contains("  step 0 check: FAILED (attempt 2"), "{err}");
    let rolled = agent.cli_within(&["rollback", id, "--wait", "--json"], Duration::from_secs(60));
    assert_eq!(rolled.status.code(), Some(0), "a rollback that ended ROLLED_BACK did what was asked");
    let end: serde_json::Value = serde_json::from_slice(&rolled.stdout).unwrap();
    assert_eq!(end["state"], "ROLLED_BACK");
    let refused = agent.cli(&["cancel", id, "--wait"]);
    assert_eq!(refused.status.code(), Some(2));
}
