//! systemd's notification protocol (`sd_notify`), through the `sd-notify`
//! crate: READY=1 once recovery is done and the socket accepts, STATUS= with
//! what runs and waits, WATCHDOG=1 from the scheduler loop itself (a stuck
//! scheduler stops sending it, and systemd restarts the agent), STOPPING=1
//! with a longer stop timeout while running steps finish. Without
//! `NOTIFY_SOCKET` (not under systemd) every call does nothing.

use sd_notify::NotifyState;
use std::time::Duration;

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify the service manager");
    }
}

/// Startup is done: recovery finished, the socket accepts.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// The scheduler loop is alive; `status` says what runs and waits.
pub fn alive(status: &str) {
    send(&[NotifyState::Watchdog, NotifyState::Status(status)]);
}

/// Shutting down: running steps have up to `drain` to finish.
pub fn stopping(drain: Duration) {
    let usec = u32::try_from(drain.as_micros()).unwrap_or(u32::MAX);
    send(&[NotifyState::Stopping, NotifyState::ExtendTimeoutUsec(usec), NotifyState::Status("draining")]);
}

/// How often the scheduler loop must say it is alive: half the watchdog
/// interval systemd asked for (`WATCHDOG_USEC`), or never.
pub fn watchdog_every() -> Option<Duration> {
    sd_notify::watchdog_enabled().map(|d| (d / 2).max(Duration::from_millis(50)))
}
