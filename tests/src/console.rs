//! Driving `apollo-tui` in a real pseudo-terminal: keys go in, a vt100
//! parser keeps the screen, and waits are woken by output (no sleeps).

use portable_pty::{native_pty_system, CommandBuilder, PtySize};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub struct Console {
    screen: Arc<(Mutex<vt100::Parser>, Condvar)>,
    writer: Box<dyn Write + Send>,
    child: Box<dyn portable_pty::Child + Send + Sync>,
}

impl Console {
    /// Starts `apollo-tui ARGS` in `dir` on a 140×40 terminal.
    pub fn start(dir: &Path, args: &[&str], path_prefix: Option<&Path>) -> Console {
        Console::start_with_env(dir, args, path_prefix, &[])
    }

    /// As [`Console::start`], with these extra environment variables.
    pub fn start_with_env(dir: &Path, args: &[&str], path_prefix: Option<&Path>, env: &[(&str, &str)]) -> Console {
        Console::start_sized(dir, args, path_prefix, env, (40, 140))
    }

    /// As [`Console::start_with_env`], on a terminal of `(rows, cols)`.
    pub fn start_sized(
        dir: &Path,
        args: &[&str],
        path_prefix: Option<&Path>,
        env: &[(&str, &str)],
        (rows, cols): (u16, u16),
    ) -> Console {
        let pty = native_pty_system().openpty(PtySize { rows, cols, pixel_width: 0, pixel_height: 0 }).unwrap();
        let mut cmd = CommandBuilder::new(crate::bin_dir().join("apollo-tui"));
        cmd.args(args);
        cmd.cwd(dir);
        cmd.env("TERM", "xterm-256color");
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some(p) = path_prefix {
            cmd.env(
                "PATH",
                format!("{}:{}:{}", p.display(), crate::bin_dir().display(), std::env::var("PATH").unwrap_or_default()),
            );
        }
        let child = pty.slave.spawn_command(cmd).unwrap();
        let mut reader = pty.master.try_clone_reader().unwrap();
        let writer = pty.master.take_writer().unwrap();
        let screen = Arc::new((Mutex::new(vt100::Parser::new(rows, cols, 0)), Condvar::new()));
        let s = screen.clone();
        let master = pty.master;
        std::thread::spawn(move || {
            let _keep = master;
            let mut buf = [0u8; 8192];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                s.0.lock().unwrap().process(&buf[..n]);
                s.1.notify_all();
            }
        });
        Console { screen, writer, child }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.process_id()
    }

    pub fn text(&self) -> String {
        self.screen.0.lock().unwrap().screen().contents()
    }

    /// Waits until the screen shows every one of `parts`.
    pub fn wait_for(&self, parts: &[&str]) -> String {
        self.wait_until(&format!("{parts:?}"), |text| parts.iter().all(|p| text.contains(p)))
    }

    /// Waits (woken by output, 30 s at most) until `pred` holds for the screen.
    pub fn wait_until(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut parser = self.screen.0.lock().unwrap();
        loop {
            let text = parser.screen().contents();
            if pred(&text) {
                return text;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "the screen never showed {what}; it shows:\n{text}");
            parser = self.screen.1.wait_timeout(parser, left).unwrap().0;
        }
    }

    pub fn keys(&mut self, keys: &str) {
        self.writer.write_all(keys.as_bytes()).unwrap();
        self.writer.flush().unwrap();
    }

    /// Waits (30 s at most) for the console to exit by itself; its exit code.
    pub fn wait_exit(&mut self) -> u32 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.exit_code();
            }
            assert!(Instant::now() < deadline, "apollo-tui did not exit in 30 s; it shows:\n{}", self.text());
            // The exit is not signalled through the pty; poll it, briefly.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Quits with `q` and waits (30 s at most) for the process; returns its
    /// exit code. A console that does not quit fails the test with its screen.
    pub fn quit(mut self) -> u32 {
        self.keys("q");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.exit_code();
            }
            assert!(Instant::now() < deadline, "apollo-tui did not quit on q in 30 s; it shows:\n{}", self.text());
            // The exit is not signalled through the pty; poll it, briefly.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs `apollo ARGS` on a terminal of `(rows, cols)` in `dir` and returns
/// what it printed, a line each (the terminal's line ends removed).
pub fn cli_on_terminal(dir: &Path, args: &[&str], (rows, cols): (u16, u16)) -> Vec<String> {
    let pty = native_pty_system().openpty(PtySize { rows, cols, pixel_width: 0, pixel_height: 0 }).unwrap();
    let mut cmd = CommandBuilder::new(crate::cli_bin());
    cmd.args(args);
    cmd.cwd(dir);
    cmd.env("TERM", "xterm-256color");
    cmd.env("NO_COLOR", "1");
    let mut child = pty.slave.spawn_command(cmd).unwrap();
    drop(pty.slave);
    let mut reader = pty.master.try_clone_reader().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = reader.read_to_end(&mut out);
        let _ = tx.send(out);
    });
    let status = child.wait().unwrap();
    drop(pty.master);
    let out = rx.recv_timeout(Duration::from_secs(30)).expect("the output of apollo");
    assert!(status.success(), "apollo {args:?} failed on a terminal: {}", String::from_utf8_lossy(&out));
    String::from_utf8_lossy(&out)
        .split("\r\n")
        .map(|l| l.trim_end_matches('\r').to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}
