//! What the README and the docs tell people to type, run as written: the
//! README's first runbook line by line in one shell (its failures where the
//! README says a line fails), then its console part in a pseudo-terminal;
//! and the service set up by hand, from docs/operations.md, into a
//! temporary root.

use apollo_tests::{bin_dir, console::Console, repo};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The code blocks of one section of a Markdown file (from its heading to
/// the next heading of the same level), in order, as (language, text).
fn blocks(file: &str, heading: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let start = text.find(&format!("\n{heading}\n")).unwrap_or_else(|| panic!("{file} has no {heading:?}"));
    let level = heading.split(' ').next().unwrap();
    let section = &text[start + heading.len() + 2..];
    let section = section.find(&format!("\n{level} ")).map_or(section, |end| &section[..end]);
    let mut out = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```").filter(|l| !l.is_empty()) {
            let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            out.push((lang.to_string(), body.join("\n") + "\n"));
        }
    }
    out
}

/// One bash, fed a line at a time, each answered by its exit code: what a
/// person typing the lines would see. Its process group (the jobs it puts in
/// the background too) is killed when it is dropped.
struct Shell {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

const MARK: &str = "::apollo-test-rc=";

impl Shell {
    fn start(cwd: &Path, home: &Path) -> Shell {
        let mut child = Command::new("bash")
            .args(["--noprofile", "--norc"])
            .current_dir(cwd)
            .env_clear()
            .env("HOME", home)
            .env("PATH", std::env::var("PATH").unwrap())
            .env("LANG", "C.UTF-8")
            .env("NO_COLOR", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut sh = Shell { child, stdin, lines };
        sh.run("exec 2>&1");
        sh
    }

    /// Runs one line; its output (stdout and stderr) and exit code.
    fn run(&mut self, line: &str) -> (i32, String) {
        writeln!(self.stdin, "{line}\necho \"{MARK}$?\"").unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut out = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let got =
                self.lines.recv_timeout(left).unwrap_or_else(|_| panic!("{line:?} did not end; it printed:\n{out}"));
            if let Some(rc) = got.strip_prefix(MARK) {
                return (rc.parse().unwrap(), out);
            }
            out.push_str(&got);
            out.push('\n');
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.wait();
    }
}

/// Waits until the socket accepts (the agent binds it once it is ready).
fn until_listening(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(Instant::now() < deadline, "no agent answered on {} in 30 s", socket.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The README's "Your first runbook", as a newcomer would do it on a clone
/// after the build: every shell line in one shell (its `target/release` is
/// the binaries this test built), the runbook saved where the README says;
/// each line must succeed, or fail where the README says "fails". Then the
/// console shows what the lines did, and the agent stops.
#[test]
fn the_readme_first_runbook_runs_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let clone = tmp.path().join("clone");
    std::fs::create_dir_all(clone.join("target")).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    std::os::unix::fs::symlink(bin_dir(), clone.join("target/release")).unwrap();
    let project = home.join("first-runbook");

    let blocks = blocks("README.md", "## Your first runbook");
    assert!(blocks.iter().any(|(l, _)| l == "yaml") && blocks.iter().filter(|(l, _)| l == "sh").count() >= 4);
    let mut sh = Shell::start(&clone, &home);
    let mut ran: Vec<(String, i32, String)> = Vec::new();
    let mut console_seen = false;
    for (lang, body) in &blocks {
        if lang == "yaml" {
            let first = body.lines().next().unwrap();
            let path = first
                .strip_prefix("# ~/")
                .unwrap_or_else(|| panic!("the runbook's first line names its file: {first}"));
            std::fs::write(home.join(path), body).unwrap();
            continue;
        }
        for line in body.lines().filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')) {
            if line.trim() == "kill %1" && !console_seen {
                console_seen = true;
                console_part(&project, &home);
            }
            let (rc, out) = sh.run(line);
            let fails = line.contains("# fails");
            assert_eq!(
                rc != 0,
                fails,
                "{line:?} exited {rc}; the README says it {}:\n{out}",
                if fails { "fails" } else { "succeeds" }
            );
            if line.trim_end().ends_with('&') {
                until_listening(&project.join(".apollo/agent.sock"));
            }
            ran.push((line.to_string(), rc, out));
        }
    }
    assert!(console_seen, "the README stops the agent with `kill %1` after the console part");
    let (rc, out) = sh.run("wait");
    assert_eq!(
        rc,
        0,
        "the agent ended cleanly on SIGTERM: {out}\n{}",
        std::fs::read_to_string(project.join("agent.log")).unwrap_or_default()
    );

    let said = |prefix: &str| -> Vec<&str> {
        ran.iter().filter(|(l, _, _)| l.starts_with(prefix)).map(|(_, _, o)| o.as_str()).collect()
    };
    // What the README says the lines show.
    let run = said("apollo run publish_notes --wait");
    assert!(
        run[0].contains("stderr: cp: cannot create regular file") && run[0].contains("(after 2 attempts)"),
        "{}",
        run[0]
    );
    let retried = said("apollo retry");
    assert!(retried[0].contains("SUCCESS publish_notes"), "{}", retried[0]);
    assert!(!retried[0].contains("step 0 build: RUNNING"), "build ran again on retry:\n{}", retried[0]);
    let pages = said("cat ~/site/index.html");
    assert_eq!(
        pages,
        ["<h1>Release notes</h1>\n", "<h1>Release notes</h1>\n"],
        "published, then put back by the rollback"
    );
    let logs = said("apollo logs");
    assert!(
        logs[0].contains("[apollo: step build, attempt 1]") && logs[0].contains("[apollo: step publish, attempt 2]"),
        "{}",
        logs[0]
    );
    let rolled = said("apollo rollback");
    assert!(rolled[0].contains("ROLLED_BACK publish_notes"), "{}", rolled[0]);
    let audit = said("apollo audit");
    assert!(audit[0].contains("created ~/site") && audit[0].contains("empty title"), "{}", audit[0]);

    // The typo the README says `check` catches.
    let yaml = std::fs::read_to_string(project.join("tasks/publish_notes.yaml")).unwrap();
    let typo = tmp.path().join("typo");
    std::fs::create_dir_all(&typo).unwrap();
    std::fs::write(
        typo.join("publish_notes.yaml"),
        yaml.replacen("steps.build.result.page", "steps.biuld.result.page", 1),
    )
    .unwrap();
    let out =
        Command::new(bin_dir().join("apollo-agent")).arg("check").arg(&typo).current_dir(&project).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && text.contains("did you mean \"build\"?"), "{text}");
}

/// The README's console paragraph: the instances listed live, Enter opens
/// one's timeline, Enter on a step shows its params and log.
fn console_part(project: &Path, home: &Path) {
    let home = home.display().to_string();
    let mut c = Console::start_with_env(project, &[], None, &[("HOME", &home)]);
    c.wait_for(&["publish_notes", "ROLLED_BACK", "SUCCESS"]);
    c.keys("\r");
    c.wait_for(&["build", "publish", "check", "rollback requested: empty title"]);
    c.keys("\r");
    c.wait_for(&["step 0 build", "params", "page.html"]);
    c.keys("q");
    c.wait_exit();
}

/// docs/operations.md's "By hand": its lines run as written into a
/// temporary root (`ROOT=` given the temp dir, `sudo` and the commands that
/// need a real host stubbed to record their arguments); then what it
/// installed is checked and the installed config is one `check` accepts.
#[test]
fn the_service_set_up_by_hand_installs_what_operations_md_says() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let stubs = tmp.path().join("stubs");
    std::fs::create_dir_all(&stubs).unwrap();
    let calls = tmp.path().join("calls");
    // sudo runs the rest; the account and service commands only say what
    // they were asked to do.
    stub(&stubs.join("sudo"), "exec \"$@\"");
    for name in ["groupadd", "useradd", "usermod", "systemctl"] {
        stub(&stubs.join(name), &format!("echo \"{name} $*\" >> {}", calls.display()));
    }
    let blocks = blocks("docs/operations.md", "## By hand");
    let (_, recipe) = blocks.iter().find(|(l, _)| l == "sh").expect("a sh block");
    assert!(recipe.starts_with("ROOT=\n"), "the recipe starts with ROOT= (empty on a real host)");
    // A clone that has been built: the recipe's target/release holds
    // small scripts that run this test's build (copying the debug binaries
    // would cost half a gigabyte).
    let clone = tmp.path().join("clone");
    std::fs::create_dir_all(clone.join("target/release")).unwrap();
    for bin in ["apollo-agent", "apollo", "apollo-tui"] {
        stub(&clone.join("target/release").join(bin), &format!("exec {} \"$@\"", bin_dir().join(bin).display()));
    }
    for dir in ["packaging", "tasks", "sdk"] {
        std::os::unix::fs::symlink(repo().join(dir), clone.join(dir)).unwrap();
    }
    let script = recipe.replacen("ROOT=\n", &format!("ROOT={}\n", root.display()), 1);
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(&clone)
        .env("PATH", format!("{}:{}", stubs.display(), std::env::var("PATH").unwrap()))
        .env("USER", "someone")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the recipe failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    for (path, mode) in [
        ("usr/bin/apollo-agent", 0o755),
        ("usr/bin/apollo", 0o755),
        ("usr/bin/apollo-tui", 0o755),
        ("etc/systemd/system/apollo-agent.service", 0o644),
        ("etc/apollo/apollo.yaml", 0o644),
        ("etc/apollo/tasks", 0o755),
    ] {
        let meta = std::fs::metadata(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777, mode, "{path}");
    }
    let unit = std::fs::read_to_string(root.join("etc/systemd/system/apollo-agent.service")).unwrap();
    assert!(unit.contains("User=apollo") && unit.contains("--config /etc/apollo/apollo.yaml"), "{unit}");
    let calls = std::fs::read_to_string(&calls).unwrap();
    for expected in [
        "groupadd --system apollo",
        "useradd --system --gid apollo --home-dir /var/lib/apollo",
        "systemctl daemon-reload",
        "systemctl enable --now apollo-agent",
        "usermod -aG apollo someone",
    ] {
        assert!(calls.contains(expected), "{expected:?} not run; ran:\n{calls}");
    }
    // The installed agent accepts the installed config (its users and
    // groups are checked against this host, where the stubbed groupadd made
    // no `apollo` group: that may be its one problem) and definitions.
    let agent = root.join("usr/bin/apollo-agent");
    let out =
        Command::new(&agent).arg("--config").arg(root.join("etc/apollo/apollo.yaml")).arg("check").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let no_group = text.lines().filter(|l| !l.trim().is_empty()).all(|l| l.contains("there is no group \"apollo\""));
    assert!(out.status.success() || no_group, "{text}");
    // The root's python3: the system one, with the root's dist-packages
    // (where the recipe installed the SDK) as /usr/lib/python3/dist-packages.
    let python = tmp.path().join("python-of-root");
    std::fs::create_dir_all(&python).unwrap();
    let real =
        String::from_utf8(Command::new("sh").args(["-c", "command -v python3"]).output().unwrap().stdout).unwrap();
    let site = root.join("usr/lib/python3/dist-packages");
    stub(&python.join("python3"), &format!("PYTHONPATH={} exec {} \"$@\"", site.display(), real.trim()));
    let out = Command::new(&agent)
        .arg("check")
        .arg(root.join("etc/apollo/tasks"))
        .current_dir(tmp.path())
        .env("PATH", format!("{}:{}", python.display(), std::env::var("PATH").unwrap()))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let n = definitions(&repo().join("tasks"));
    assert!(out.status.success() && text.contains(&format!("{n} definition(s) valid, 0 problem(s)")), "{text}");
}

/// An executable shell script at `path`.
fn stub(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

fn definitions(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p: &PathBuf| p.extension().is_some_and(|x| x == "yaml"))
        .count()
}

/// The README's second chapter, the rolling restart: the runbook it shows
/// is the one shipped in `tasks/`, and its lines do what it says — three
/// broken hosts stop the step over its budget, the retry restarts only the
/// hosts that did not succeed, the rollback puts back every host.
#[test]
fn the_readme_second_runbook_the_fleet_runs_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let clone = tmp.path().join("clone");
    std::fs::create_dir_all(clone.join("target")).unwrap();
    std::fs::create_dir_all(home.join("first-runbook/tasks")).unwrap();
    std::os::unix::fs::symlink(bin_dir(), clone.join("target/release")).unwrap();
    let project = home.join("first-runbook");
    let blocks = blocks("README.md", "## Your second runbook: a fleet");
    let shipped = std::fs::read_to_string(repo().join("tasks/rolling_restart.yaml")).unwrap();
    let mut sh = Shell::start(&clone, &home);
    assert_eq!(sh.run("export PATH=\"$PWD/target/release:$PATH\"").0, 0);
    let mut ran: Vec<(String, String)> = Vec::new();
    for (lang, body) in &blocks {
        if lang == "yaml" {
            assert_eq!(body, &shipped, "the README's runbook is tasks/rolling_restart.yaml");
            let path = body.lines().next().unwrap().strip_prefix("# ~/").unwrap();
            std::fs::write(home.join(path), body).unwrap();
            continue;
        }
        for line in body.lines().filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')) {
            let (rc, out) = sh.run(line);
            let fails = line.contains("# fails");
            assert_eq!(rc != 0, fails, "{line:?} exited {rc}:\n{out}\nbefore: {ran:#?}");
            if line.trim_end().ends_with('&') {
                until_listening(&project.join(".apollo/agent.sock"));
            }
            ran.push((line.to_string(), out));
        }
    }
    assert_eq!(sh.run("wait").0, 0, "the agent ended cleanly on SIGTERM");
    let said = |prefix: &str| ran.iter().find(|(l, _)| l.starts_with(prefix)).map(|(_, o)| o.clone()).unwrap();
    assert!(said("apollo run rolling_restart").contains("3 of 40 items failed (budget 2): web-07, web-12, web-31"));
    assert!(said("apollo show $ID --items").contains("NOT STARTED"));
    assert!(said("apollo logs $ID --step restart --item web-07").contains("restarting the API on web-07"));
    let retried = said("apollo retry");
    assert!(retried.contains("SUCCESS rolling_restart"), "{retried}");
    let rolled = said("apollo rollback");
    assert!(rolled.contains("ROLLED_BACK rolling_restart"), "{rolled}");
    // Every host was put back.
    let left: Vec<_> = (0..40).filter(|i| home.join(format!("fleet/web-{i:02}/restarted")).exists()).collect();
    assert!(left.is_empty(), "still restarted after the rollback: {left:?}");
}
