//! apollo-agent: runs task definitions as ordered steps through plugins,
//! persisting every step's state and context so work survives crashes, and
//! serves the JSON-RPC protocol on a Unix socket.
//!
//! Layout:
//! - [`config`]: `apollo.yaml`, defaults and path resolution.
//! - [`store`]: SQLite — the only module that writes SQL; group commit.
//! - [`scheduler`]: claims, executes, retries, rolls back, reaps, recovers.
//! - [`plugins`]: the plugin contract, the built-ins and their registry.
//! - [`catalog`]: definitions loaded from the tasks directory.
//! - [`reload`]: live definitions (file watcher, SIGHUP).
//! - [`repeats`]: an error that repeats, logged once, then as a count.
//! - [`settings`]: the settings in force, which SIGHUP replaces.
//! - [`handles`]: what the API, triggers and schedules hold instead of the scheduler.
//! - [`triggers`]: manual, scheduled and event triggers; the clock.
//! - [`server`]: the socket server, the protocol methods, dial-stdio.
//! - [`bus`]: change notifications for subscribers.
//! - [`logs`]: per-step log files.
//! - [`check`]: `apollo-agent check`.
//! - [`telemetry`]: tracing set-up.
//!
//! [`run`] is the whole agent; `main.rs` only parses arguments and calls it,
//! so tests and benchmarks can run the agent in-process.

// JSON-RPC errors travel as values with a message and optional data; they are
// returned on rare paths, so their size does not matter.
#![allow(clippy::result_large_err)]

pub mod bus;
pub mod catalog;
pub mod check;
pub mod config;
pub mod handles;
pub mod hooks;
pub mod logs;
pub mod metrics;
pub mod notify;
pub mod plugins;
pub mod reload;
pub mod repeats;
pub mod scheduler;
pub mod server;
pub mod settings;
pub mod sources;
pub mod steps;
pub mod store;
pub mod telemetry;
pub mod triggers;

use anyhow::Context as _;
use apollo_shared::protocol::{EventKind, Topic};
use config::Config;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use tokio_util::sync::CancellationToken;

/// A point where the fault tests can crash the agent, as a kill -9 would
/// (`FAILPOINTS="<name>=return"`, or `"<name>=N*off->return"` for the N+1th
/// pass). Compiled to nothing without the `failpoints` feature.
#[macro_export]
macro_rules! crash_point {
    ($name:literal) => {
        fail::fail_point!($name, |_| {
            eprintln!("apollo-agent: crashing at fail point {}", $name);
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            std::process::abort()
        })
    };
}

/// How this life of the agent signs leases and history rows:
/// `<name>:<pid>`, so a restarted agent of the same name is told apart from
/// the one before it.
pub fn agent_id(name: &str) -> String {
    format!("{name}:{}", std::process::id())
}

/// Holds the data dir's lock: one agent per SQLite database.
pub struct DataDirLock {
    _file: nix::fcntl::Flock<std::fs::File>,
}

pub fn lock_data_dir(dir: &std::path::Path) -> anyhow::Result<DataDirLock> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create the data dir", dir.display()))?;
    let path = dir.join("agent.lock");
    let mut attempt = std::fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&path)?;
    // A previous agent killed a moment ago can leave the lock held briefly by
    // a child it had forked but not yet exec'd; wait a little for that.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let mut file = loop {
        match nix::fcntl::Flock::lock(attempt, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(f) => break f,
            Err((f, _)) if std::time::Instant::now() < deadline => {
                attempt = f;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(_) => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                anyhow::bail!(
                    "{}: another agent (pid {}) already uses this data dir; SQLite allows one agent per database — \
                     stop it, give this one another --data-dir, or use PostgreSQL (database.url) for several agents",
                    dir.display(),
                    holder.trim()
                );
            }
        }
    };
    use std::io::{Seek, Write};
    file.set_len(0)?;
    file.rewind()?;
    write!(file, "{}", std::process::id())?;
    Ok(DataDirLock { _file: file })
}

/// Everything `run` needs besides the config.
pub struct Options {
    pub socket: PathBuf,
}

/// Runs the agent until `shutdown` is cancelled, then stops claiming, lets
/// running steps finish up to the grace period, and returns.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let settings = Arc::new(settings::Settings::new(config));
    let config = settings.get();
    let data_dir = config.data_dir();
    let _lock = lock_data_dir(&data_dir)?;
    plugins::process::record_in(&data_dir);
    let bus = bus::Bus::default();
    let name = agent_id(&config.agent_name());
    let location = store::Location::from_conf(&config)?;
    let (b, actor) = (bus.clone(), format!("agent:{name}"));
    // Opening may block (PostgreSQL's client runs its own runtime).
    let store = tokio::task::spawn_blocking(move || store::Store::open_at(location, b, actor))
        .await?
        .context("cannot open the store")?;
    let registry = plugins::load(&config).await;
    for b in &registry.broken {
        let msg = format!("plugin {:?} ({}) is not usable: {}", b.name, b.command.display(), b.error);
        let _ = store.alert("plugin_error", &msg, None).await;
    }
    let registry = Arc::new(plugins::Plugins::new(registry));
    let tasks_dir = config.tasks_dir();
    let cat = catalog::load_dir(&tasks_dir, &registry.get());
    for (file, errs) in &cat.errors {
        for e in errs {
            tracing::warn!(file = %file.display(), "definition not loaded: {e}");
        }
        let msg = errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ");
        let _ = store.alert("definition_error", &msg, None).await;
    }
    tracing::info!(tasks_dir = %tasks_dir.display(), loaded = cat.defs.len(), errors = cat.errors.len(), "definitions loaded");
    if cat.defs.is_empty() && cat.errors.is_empty() {
        tracing::warn!(
            "no definitions in {}: write one there as a YAML file (it is loaded at once); \
             `apollo defs` lists what loaded",
            tasks_dir.display()
        );
    }
    let catalog = Arc::new(RwLock::new(cat));
    let socket = config.socket_path();
    let listener = server::bind(&socket)?;
    let scheduler =
        scheduler::Scheduler::new(store.clone(), catalog.clone(), registry.clone(), settings.clone(), shutdown.clone());
    let access = Arc::new(server::Access::new(&config.socket));
    let triggers = Arc::new(triggers::Triggers::new(scheduler.handles()));
    let reloaded = Arc::new(tokio::sync::Notify::new());
    let reloader = reload::Reloader {
        dir: tasks_dir.clone(),
        catalog: catalog.clone(),
        plugins: registry.clone(),
        settings: settings.clone(),
        access: access.clone(),
        store: store.clone(),
        reloaded: reloaded.clone(),
        watch: config.watch_tasks,
        hangup: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok(),
    };
    let cron = triggers::cron::CronRunner::new(triggers.clone(), Arc::new(triggers::clock::SystemClock), reloaded);
    let api = Arc::new(server::Api {
        triggers: triggers.clone(),
        h: scheduler.handles(),
        name,
        started: std::time::Instant::now(),
        socket: socket.display().to_string(),
        listing: store.for_listing(),
    });
    // The first heartbeat claims this agent's name on the store.
    store.heartbeat(scheduler.heartbeat(), true).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    scheduler.recover().await;
    tracing::info!(socket = %socket.display(), store = %store.location(), "agent ready");
    let server = tokio::spawn(server::serve(listener, api, access, shutdown.clone()));
    let hooks_task = hooks::start(&settings, store.clone(), shutdown.clone());
    let metrics_task = tokio::spawn(server::follow_metrics(scheduler.handles(), shutdown.clone()));
    // Alerts counted by kind, from the bus every alert is published on.
    let alert_counter = {
        let s = scheduler.clone();
        bus.each_alert(shutdown.clone(), move |alert| {
            let kind = alert["kind"].as_str().unwrap_or("unknown");
            metrics::get().alerts.get_or_create(&metrics::label("kind", kind)).inc();
            // The store is back: what stalled on it goes on now.
            if kind == "store_writable" {
                s.wake();
            }
        })
    };
    // On a shared database, the other agents' changes wake this one.
    let listener = {
        let s = scheduler.clone();
        store.listen(Arc::new(move |change| s.heard(change)), shutdown.clone())
    };
    // Requests from the other agents: stop an instance this one runs.
    let control = {
        let (s, me) = (scheduler.clone(), store.agent().to_string());
        bus.each(Topic::Control, shutdown.clone(), move |ev| {
            if ev.kind == EventKind::Cancel && ev.data["to"] == me.as_str() {
                let text = |k: &str| ev.data[k].as_str().unwrap_or_default().to_string();
                let why = handles::StopReason::Cancel { actor: text("actor"), reason: text("reason") };
                let _ = s.cancel(&text("id"), why);
            }
        })
    };
    notify::ready(&scheduler.status_line().await);
    let reload_task = tokio::spawn(reloader.run(shutdown.clone()));
    let cron_task = tokio::spawn(cron.run(shutdown.clone()));
    let sources = sources::start(&config, triggers, shutdown.clone());
    scheduler.run().await;
    let _ = server.await;
    let _ = metrics_task.await;
    if let Some(l) = listener {
        let _ = l.await;
    }
    let _ = alert_counter.await;
    let _ = control.await;
    let _ = hooks_task.await;
    let _ = reload_task.await;
    let _ = cron_task.await;
    sources.wait().await;
    let _ = store.agent_stopped().await;
    store.close();
    let _ = std::fs::remove_file(&socket);
    tracing::info!("agent stopped");
    Ok(())
}
