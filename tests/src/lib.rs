//! End-to-end test harness: builds the real binaries, starts `apollo-agent`
//! as a process on a temp dir and a real socket, and drives it through the
//! `apollo` CLI or the client library. Nothing here mocks the store, the
//! socket or the file system.

pub mod chaos;
mod client;
pub mod console;
pub mod layers;
mod servers;
pub mod service;
pub use client::*;
pub use servers::*;

pub use apollo_shared::protocol::methods as m;
pub use apollo_shared::protocol::*;
pub use apollo_shared::state::OperatorAction;

use apollo_tui::client::Client;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root").to_path_buf()
}

/// The directory holding the built binaries, built once per test process
/// with the same profile as the tests.
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test exe");
        // target/<profile>/deps/<test> → target/<profile>
        let dir = exe.parent().and_then(Path::parent).expect("target dir").to_path_buf();
        let release = dir.file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(repo()).args(["build", "--quiet", "-p", "apollo-agent", "-p", "apollo-tui", "--bins"]);
        // Tests get fail points compiled in (inert unless a test sets
        // FAILPOINTS); the benchmarks (examples) measure the plain build.
        let is_example = exe.parent().and_then(Path::file_name).is_some_and(|n| n == "examples");
        if !is_example {
            cmd.args(["--features", "apollo-agent/failpoints"]);
        }
        if release {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build");
        assert!(status.success(), "building the binaries failed");
        dir
    })
}

pub fn agent_bin() -> PathBuf {
    bin_dir().join("apollo-agent")
}

pub fn cli_bin() -> PathBuf {
    bin_dir().join("apollo")
}

/// An external plugin `ver` at `version` (idempotent, validate and rollback
/// always fine) whose execute runs the shell lines `work`.
pub fn ver_plugin(version: &str, work: &str) -> String {
    format!(
        r#"#!/bin/sh
case "$1" in
describe) echo '{{"name": "ver", "version": "{version}", "idempotent": true}}'; exit 0 ;;
validate) echo '{{"ok": true}}'; exit 0 ;;
rollback) echo '{{}}'; exit 0 ;;
esac
cat > /dev/null
{work}
"#
    )
}

/// Copies a directory tree (following symbolic links).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// The pid of the agent answering `agent.status` on `socket`, if any.
fn answering_pid(socket: &Path) -> Option<u64> {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"agent.status\"}\n").ok()?;
    let mut line = String::new();
    std::io::BufReader::new(s).read_line(&mut line).ok()?;
    serde_json::from_str::<Value>(&line).ok()?["result"]["pid"].as_u64()
}

/// A running agent on its own temp dir. Killed when dropped.
pub struct Agent {
    pub dir: tempfile::TempDir,
    pub child: Option<Child>,
    pub socket: PathBuf,
    /// Environment every start of the agent gets.
    pub env: Vec<(String, String)>,
    /// The agent run under another program (valgrind), and which binary.
    pub under: Option<(String, PathBuf)>,
}

pub struct AgentBuilder {
    dir: tempfile::TempDir,
    config: Option<String>,
    bundled: bool,
    socket: Option<PathBuf>,
    env: Vec<(String, String)>,
    under: Option<(String, PathBuf)>,
}

impl AgentBuilder {
    /// The agent's directory (its config, tasks/ and data/ live here).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `binary` under `wrap` (`valgrind --tool=callgrind …`, its words)
    /// instead of the tests' agent, for this agent only.
    pub fn under(mut self, wrap: &str, binary: PathBuf) -> Self {
        self.under = Some((wrap.to_string(), binary));
        self
    }

    /// Copies the repository's tasks/ into the agent's dir.
    pub fn bundled_tasks(mut self) -> Self {
        self.bundled = true;
        self
    }

    /// Writes a definition file into the agent's tasks dir.
    pub fn task(self, file: &str, yaml: &str) -> Self {
        let tasks = self.dir.path().join("tasks");
        std::fs::create_dir_all(&tasks).unwrap();
        std::fs::write(tasks.join(file), yaml).unwrap();
        self
    }

    /// Writes an executable into the agent's `tasks/plugins/` (auto-registered
    /// under its file stem).
    pub fn plugin(self, file: &str, script: &str) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.dir.path().join("tasks/plugins");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(file);
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        self
    }

    /// Listens on this socket instead of `<dir>/agent.sock`.
    pub fn socket(mut self, path: &Path) -> Self {
        self.socket = Some(path.to_path_buf());
        self
    }

    /// Sets a variable in the agent's environment, for every start.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Uses this `apollo.yaml` (written into the agent's dir).
    pub fn config(mut self, yaml: &str) -> Self {
        self.config = Some(yaml.to_string());
        self
    }

    pub fn start(self) -> Agent {
        let mut agent = self.start_stopped();
        agent.spawn();
        agent
    }

    /// The agent's directory made, its process not started yet (for a
    /// first start with fail points: `run_until_exit`).
    pub fn start_stopped(self) -> Agent {
        if self.bundled {
            copy_dir(&repo().join("tasks"), &self.dir.path().join("tasks"));
            // The bundled Python plugin finds the SDK beside its tasks dir,
            // as in the checkout (or installed, as the package does).
            std::os::unix::fs::symlink(repo().join("sdk"), self.dir.path().join("sdk")).unwrap();
        }
        std::fs::create_dir_all(self.dir.path().join("tasks")).unwrap();
        if let Some(c) = &self.config {
            std::fs::write(self.dir.path().join("apollo.yaml"), c).unwrap();
        }
        let socket = self.socket.clone().unwrap_or_else(|| self.dir.path().join("agent.sock"));
        Agent { dir: self.dir, child: None, socket, env: self.env, under: self.under }
    }
}

impl Agent {
    pub fn builder() -> AgentBuilder {
        AgentBuilder {
            dir: tempfile::tempdir().unwrap(),
            config: None,
            bundled: false,
            socket: None,
            env: Vec::new(),
            under: None,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Starts the agent process (again) and waits until its socket answers.
    pub fn spawn(&mut self) {
        self.spawn_with(&[]);
    }

    /// Starts the agent with these extra environment variables (FAILPOINTS).
    pub fn spawn_with(&mut self, env: &[(&str, &str)]) {
        self.start_process(env);
        self.wait_ready();
    }

    /// Starts the agent with `env` and waits for it to exit by itself before
    /// it is ready (a fail point during start-up); returns its status.
    pub fn run_until_exit(&mut self, env: &[(&str, &str)], limit: Duration) -> std::process::ExitStatus {
        self.start_process(env);
        self.wait_exit(limit)
    }

    fn start_process(&mut self, env: &[(&str, &str)]) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.path().join("agent.log")).unwrap();
        // APOLLO_AGENT_WRAP runs the agent under another program (valgrind,
        // for the instruction-count benchmark).
        let (wrap, binary) = match &self.under {
            Some((wrap, binary)) => (wrap.clone(), binary.clone()),
            None => (std::env::var("APOLLO_AGENT_WRAP").unwrap_or_default(), agent_bin()),
        };
        let mut words = wrap.split_whitespace();
        let mut cmd = match words.next() {
            Some(program) => {
                let mut c = Command::new(program);
                c.args(words).arg(binary);
                c
            }
            None => Command::new(binary),
        };
        cmd.current_dir(self.path())
            .arg("--socket")
            .arg(&self.socket)
            .args(["--data-dir", "data"])
            .env("NO_COLOR", "1")
            .env_remove("APOLLO_SOCKET")
            .env_remove("APOLLO_CONFIG")
            .env_remove("FAILPOINTS")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.child = Some(cmd.spawn().expect("start apollo-agent"));
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        // Ready means this process answers on the socket: after a kill -9 the
        // socket of the dead agent can be held a moment longer by a child it
        // had forked, and must not count.
        let pid = self.pid() as u64;
        while answering_pid(&self.socket) != Some(pid) {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("apollo-agent exited ({status}) before it was ready:\n{}", self.log());
            }
            assert!(Instant::now() < deadline, "apollo-agent did not open its socket in 30s:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("agent.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// SIGKILL: the agent dies with no chance to clean up.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Waits (up to `limit`) for the agent to exit by itself, e.g. at a fail
    /// point; returns its status.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let pid = child.id() as i32;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        match rx.recv_timeout(limit) {
            Ok(status) => status.unwrap(),
            Err(_) => {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                panic!("apollo-agent did not exit within {limit:?}:\n{}", self.log());
            }
        }
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
        c.wait().unwrap()
    }

    /// Runs `apollo --socket … ARGS`.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(cli_bin())
            .current_dir(self.path())
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .env("NO_COLOR", "1")
            .output()
            .expect("run apollo")
    }

    /// Runs `apollo --socket … ARGS`, failing the test when it has not
    /// returned within `limit` (a command that would hang for ever).
    pub fn cli_within(&self, args: &[&str], limit: Duration) -> Output {
        let child = Command::new(cli_bin())
            .current_dir(self.path())
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run apollo");
        let pid = child.id() as i32;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        match rx.recv_timeout(limit) {
            Ok(out) => out.expect("apollo's output"),
            Err(_) => {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                panic!("apollo {args:?} did not return within {limit:?}:\n{}", self.log());
            }
        }
    }

    /// Runs the CLI with `--json` and parses its stdout.
    pub fn cli_json(&self, args: &[&str]) -> (i32, Value) {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.cli(&a);
        let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "apollo {args:?}: stdout is not JSON ({e}):\n{}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap_or(-1), v)
    }

    pub async fn client(&self) -> Client {
        let c = Client::connect_unix(&self.socket).await.unwrap_or_else(|e| panic!("connect: {e}\n{}", self.log()));
        c.hello("tests").await.unwrap_or_else(|e| panic!("hello: {e}\n{}", self.log()));
        c
    }

    /// A client subscribed to instance changes, and those changes (for
    /// [`wait_until`]).
    pub async fn watch(&self) -> (Client, tokio::sync::mpsc::Receiver<apollo_shared::protocol::Event>) {
        let c = self.client().await;
        c.subscribe(&[apollo_shared::protocol::Topic::Tasks]).await.unwrap();
        let events = c.take_events().unwrap();
        (c, events)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
