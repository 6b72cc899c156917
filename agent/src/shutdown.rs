//! One shutdown path, mini-redis's way: one token every task watches, one
//! tracker every long-lived task of the agent is spawned into, one bounded
//! drain.
//!
//! SIGTERM or SIGINT ([`on_signals`]), or whoever holds the token (a test, a
//! benchmark), begins it. Then, in order:
//! 1. the scheduler stops claiming and gives running steps
//!    `scheduler.shutdown_grace` to end (a stage of its own: an executor's
//!    last write must land before the store closes; what is still RUNNING
//!    after it is resumed by the next start);
//! 2. every task in the tracker — the socket server and its connections,
//!    the metrics endpoint, the reloader, the schedules, the event sources,
//!    the hooks, the bus listeners, the other agents' notifications — has
//!    [`DRAIN`] to end; one that does not is named in the log and left;
//! 3. the store records the agent stopped and closes (the writer commits
//!    what is queued first).

use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long the agent's tasks have to end once the scheduler has stopped.
pub const DRAIN: Duration = Duration::from_secs(5);

/// The token and the tracker, cheap to clone.
#[derive(Clone, Default)]
pub struct Shutdown {
    token: CancellationToken,
    tracker: TaskTracker,
}

impl Shutdown {
    /// A shutdown that begins when `token` is cancelled.
    pub fn new(token: CancellationToken) -> Shutdown {
        Shutdown { token, tracker: TaskTracker::new() }
    }

    /// The token every task stops on.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Whether the shutdown has begun.
    pub fn begun(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Spawns `task` into the tracker; the drain waits for it.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tracker.spawn(task)
    }

    /// Waits up to [`DRAIN`] for every tracked task (call it once the token
    /// has fired and the scheduler has stopped).
    pub async fn drain(&self) {
        self.tracker.close();
        if tokio::time::timeout(DRAIN, self.tracker.wait()).await.is_err() {
            tracing::warn!(
                left = self.tracker.len(),
                "tasks still running {}s after the scheduler stopped; leaving them",
                DRAIN.as_secs()
            );
        }
    }
}

/// Cancels `token` at the first SIGTERM or SIGINT.
pub fn on_signals(token: CancellationToken) {
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            _ = token.cancelled() => return,
        }
        token.cancel();
    });
}
