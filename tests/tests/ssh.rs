//! A real sshd on localhost, with host and user keys made by the test: `apollo
//! --ssh` and `apollo-tui --ssh` reach an agent listening at the system
//! socket path (`/run/apollo/agent.sock`, as the packaged service runs it)
//! with no `--socket`, through `apollo-agent dial-stdio` on the far side.
//!
//! Needs the OS's `sshd` (Debian's openssh-server, which `.ci/run` installs)
//! and root, as CI and the development machines run; the agent at the system
//! path is this test's own and is removed afterwards.

use apollo_tests::console::Console;
use apollo_tests::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";

struct Sshd {
    child: Child,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn keygen(path: &Path) {
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .stdout(Stdio::null())
        .status()
        .expect("ssh-keygen (openssh-client) is needed");
    assert!(st.success(), "ssh-keygen failed");
}

/// Starts sshd on a free local port, accepting `user_key.pub`, with the
/// binaries under test first in the PATH of its sessions; returns it and
/// an `ssh` config naming it `apollo-test`.
fn start_sshd(dir: &Path) -> (Sshd, std::path::PathBuf) {
    assert!(
        Path::new(SSHD).exists(),
        "{SSHD} is missing: install openssh-server (`apt-get install openssh-server`; .ci/run does this)"
    );
    keygen(&dir.join("host_key"));
    keygen(&dir.join("user_key"));
    std::fs::copy(dir.join("user_key.pub"), dir.join("authorized_keys")).unwrap();
    // sshd insists on its privilege separation directory.
    std::fs::create_dir_all("/run/sshd").expect("creating /run/sshd needs root");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let d = dir.display();
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", bin_dir().display());
    std::fs::write(
        dir.join("sshd_config"),
        format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\nPubkeyAuthentication yes\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n\
             SetEnv PATH={path}\nLogLevel ERROR\n"
        ),
    )
    .unwrap();
    let child = Command::new(SSHD)
        .arg("-D")
        .arg("-e")
        .arg("-f")
        .arg(dir.join("sshd_config"))
        .stderr(std::fs::File::create(dir.join("sshd.log")).unwrap())
        .spawn()
        .expect("start sshd");
    let sshd = Sshd { child };
    // Ready when the port accepts.
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "sshd did not listen on {port}:\n{}",
            std::fs::read_to_string(dir.join("sshd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let user = nix::unistd::User::from_uid(nix::unistd::getuid()).unwrap().expect("the current user").name;
    let config = dir.join("ssh_config");
    std::fs::write(
        &config,
        format!(
            "Host apollo-test\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {d}/user_key\n  \
             IdentitiesOnly yes\n  UserKnownHostsFile /dev/null\n  StrictHostKeyChecking no\n  LogLevel ERROR\n"
        ),
    )
    .unwrap();
    (sshd, config)
}

#[test]
fn the_cli_and_the_console_reach_the_system_agent_through_a_real_sshd() {
    let run = Path::new("/run/apollo");
    let created = !run.exists();
    std::fs::create_dir_all(run).expect("creating /run/apollo needs root, as CI and the development machines run");
    let system = run.join("agent.sock");
    assert!(
        std::os::unix::net::UnixStream::connect(&system).is_err(),
        "an agent already listens on {}; stop it to run this test",
        system.display()
    );
    let agent = Agent::builder().task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n").socket(&system).start();
    let (code, inst) = agent.cli_json(&["run", "ok", "--wait"]);
    assert_eq!(code, 0, "{inst}");
    let id = inst["id"].as_str().unwrap().to_string();

    let dir = tempfile::tempdir().unwrap();
    let (_sshd, config) = start_sshd(dir.path());
    let ssh = format!("ssh -F {}", config.display());
    let cwd = tempfile::tempdir().unwrap();
    let out = Command::new(cli_bin())
        .current_dir(cwd.path())
        .args(["--ssh", "apollo-test", "--json", "ls"])
        .env("APOLLO_SSH_COMMAND", &ssh)
        .env_remove("APOLLO_SOCKET")
        .output()
        .unwrap();
    let console = Console::start_with_env(cwd.path(), &["--ssh", "apollo-test"], None, &[("APOLLO_SSH_COMMAND", &ssh)]);
    let screen = console.wait_for(&["via ssh apollo-test", "connected", &id]);
    let quit = console.quit();

    drop(agent);
    let _ = std::fs::remove_file(&system);
    if created {
        let _ = std::fs::remove_dir(run);
    }
    let sshd_log = std::fs::read_to_string(dir.path().join("sshd.log")).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{}\nsshd: {sshd_log}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&id), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(screen.contains("ok"), "{screen}");
    assert_eq!(quit, 0);
}
