//! The agent as a systemd service: the shipped unit passes `systemd-analyze
//! verify` and rates no worse than "OK" in `systemd-analyze security`; the
//! notification protocol is spoken to a datagram socket the test binds
//! (READY after the socket accepts, STATUS, WATCHDOG from the scheduler loop,
//! STOPPING on SIGTERM), and a stalled scheduler stops the WATCHDOG.

use apollo_tests::*;
use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::{Duration, Instant};

fn unit() -> std::path::PathBuf {
    repo().join("packaging/apollo-agent.service")
}

#[test]
fn the_unit_verifies_and_is_rated_ok_or_better() {
    // verify checks that ExecStart's binary exists: point it at the one built.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(unit()).unwrap();
    assert!(text.contains("ExecStart=/usr/bin/apollo-agent "), "the packaged path");
    let local = dir.path().join("apollo-agent.service");
    std::fs::write(&local, text.replace("/usr/bin/apollo-agent", &agent_bin().display().to_string())).unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&local).output().expect("systemd-analyze");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new("systemd-analyze").args(["security", "--offline=true"]).arg(unit()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let overall = text.lines().find(|l| l.contains("Overall exposure level")).unwrap_or_else(|| panic!("{text}"));
    let rating = overall.rsplit(':').next().unwrap().split_whitespace().nth(1).unwrap_or_default();
    assert!(matches!(rating, "SAFE" | "OK"), "{overall}");
}

/// Messages received on the notify socket within `window`, with when.
fn collect(sock: &UnixDatagram, window: Duration, until: impl Fn(&str) -> bool) -> Vec<(Instant, String)> {
    let deadline = Instant::now() + window;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        sock.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))))
            .unwrap();
        match sock.recv(&mut buf) {
            Ok(n) => {
                let msg = String::from_utf8_lossy(&buf[..n]).to_string();
                let done = until(&msg);
                out.push((Instant::now(), msg));
                if done {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    out
}

fn notify_env<'a>(path: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![("NOTIFY_SOCKET", path), ("WATCHDOG_USEC", "400000")];
    env.extend_from_slice(extra);
    env
}

#[test]
fn ready_status_watchdog_and_stopping_reach_the_service_manager() {
    let mut agent = Agent::builder().task("noop.yaml", "task: noop\nsteps:\n  - plugin: sleep\n").start();
    agent.kill9();
    let path = agent.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    let p = path.display().to_string();
    // spawn_with returns once the agent answers on its socket.
    agent.spawn_with(&notify_env(&p, &[]));
    let msgs = collect(&sock, Duration::from_secs(5), |m| m.contains("READY=1"));
    let first = &msgs.first().expect("a notification").1;
    assert!(first.contains("READY=1") && first.contains("STATUS=0 running, 0 queued"), "{msgs:?}");
    // WATCHDOG every 0.2 s (half of WATCHDOG_USEC), each with the status.
    let msgs = collect(&sock, Duration::from_millis(1500), |_| false);
    let beats = msgs.iter().filter(|(_, m)| m.contains("WATCHDOG=1") && m.contains("STATUS=")).count();
    assert!(beats >= 4, "{beats} watchdog notifications in 1.5 s: {msgs:?}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.pid()), nix::sys::signal::Signal::SIGTERM).unwrap();
    let msgs = collect(&sock, Duration::from_secs(10), |m| m.contains("STOPPING=1"));
    let stop = &msgs.last().expect("STOPPING").1;
    assert!(stop.contains("STOPPING=1") && stop.contains("EXTEND_TIMEOUT_USEC="), "{msgs:?}");
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
}

#[test]
fn a_stalled_scheduler_stops_the_watchdog() {
    let mut agent = Agent::builder().task("noop.yaml", "task: noop\nsteps:\n  - plugin: sleep\n").start();
    agent.kill9();
    let path = agent.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    let p = path.display().to_string();
    // The loop's 8th turn blocks for 3 s.
    agent.spawn_with(&notify_env(&p, &[("FAILPOINTS", "scheduler.stall=7*off->sleep(3000)")]));
    let msgs = collect(&sock, Duration::from_secs(6), |_| false);
    let beats: Vec<Instant> = msgs.iter().filter(|(_, m)| m.contains("WATCHDOG=1")).map(|(t, _)| *t).collect();
    let gap = beats.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
    assert!(gap >= Duration::from_secs(2), "the watchdog went on while the loop was stuck: longest gap {gap:?}");
    assert!(beats.len() >= 3, "{msgs:?}");
}
