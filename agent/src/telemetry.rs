//! Tracing set-up: pretty or JSON lines on stderr, and a daily rolling file
//! when `logging.dir` is set. Every line of an instance's work carries its
//! task id and trace id (the executor's span).

use crate::config::Logging;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer};

/// Whether stderr is connected to journald (systemd sets `JOURNAL_STREAM` to
/// the device and inode of the stream it connected; they must match ours).
fn under_journald() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else { return false };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else { return false };
    stream.to_string_lossy() == format!("{}:{}", meta.dev(), meta.ino())
}

/// Keep the returned guard alive: it flushes the log file on drop.
pub fn init(
    cfg: &Logging,
    dir: Option<&std::path::Path>,
    format: &str,
) -> Option<tracing_appender::non_blocking::WorkerGuard> {
    let filter = || EnvFilter::try_from_env("APOLLO_LOG").unwrap_or_else(|_| EnvFilter::new(&cfg.level));
    let json = format == "json";
    let stderr = if json {
        fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(std::io::stderr)
            .with_filter(filter())
            .boxed()
    } else {
        use std::io::IsTerminal;
        let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        if under_journald() {
            // journald stamps each line itself: no second timestamp, no colour.
            fmt::layer().with_ansi(false).without_time().with_writer(std::io::stderr).with_filter(filter()).boxed()
        } else {
            fmt::layer().with_ansi(ansi).with_writer(std::io::stderr).with_filter(filter()).boxed()
        }
    };
    let (file, guard) = match dir {
        Some(dir) => {
            let appender = tracing_appender::rolling::daily(dir, "apollo-agent.log");
            let (writer, guard) = tracing_appender::non_blocking(appender);
            let layer = fmt::layer()
                .json()
                .with_current_span(true)
                .with_span_list(true)
                .with_writer(writer)
                .with_filter(filter());
            (Some(layer.boxed()), Some(guard))
        }
        None => (None, None),
    };
    let _ = tracing_subscriber::registry().with(stderr).with(file).try_init();
    guard
}
