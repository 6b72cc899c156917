//! apollo-agent: runs task definitions as ordered steps through plugins,
//! persisting every step's state and context so work survives crashes, and
//! serves the JSON-RPC protocol on a Unix socket.
//!
//! Layout, bottom first (each names only those before it; ARCHITECTURE.md,
//! "Layers", and `tests/tests/layers.rs`):
//! - [`config`]: `apollo.yaml` as data, defaults and paths.
//! - [`shutdown`]: the token, the tracker of every long-lived task, the drain.
//! - [`bus`]: typed change notifications for subscribers and listeners.
//! - [`logs`]: per-step log files.
//! - [`repeats`]: an error that repeats, logged once, then as a count.
//! - [`notify`]: systemd's notification protocol.
//! - [`metrics`]: the Prometheus families (a leaf).
//! - [`telemetry`]: tracing set-up.
//! - [`settings`]: the settings in force, which SIGHUP replaces.
//! - [`store`]: the only SQL; one driver per backend; group commit.
//! - [`plugins`]: the plugin contract, the built-ins and their registry.
//! - [`catalog`]: definitions loaded from the tasks directory.
//! - [`timeouts`]: a step's timeout, fixed or learned from history.
//! - [`steps`]: a step's call made ready (plugin, params, env).
//! - [`handles`]: what the API, triggers and schedules hold instead of the scheduler.
//! - [`scheduler`]: claims, executes, retries, rolls back, reaps, recovers.
//! - [`triggers`]: manual, scheduled and event triggers; the clock.
//! - [`hooks`]: alert hooks.
//! - [`sources`]: events from NATS JetStream and HTTP.
//! - [`server`]: the socket server, the protocol methods, `/metrics`, dial-stdio.
//! - [`reload`]: live definitions and config (file watcher, SIGHUP).
//! - [`check`]: `apollo-agent check`.
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
pub mod rollouts;
pub mod scheduler;
pub mod secrets;
pub mod server;
pub mod settings;
pub mod shutdown;
pub mod sources;
pub mod steps;
pub mod store;
pub mod telemetry;
pub mod timeouts;
pub mod triggers;

use anyhow::Context as _;
use apollo_shared::protocol::{AlertKind, EventData, Topic};
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

/// Runs the agent until `token` is cancelled, then stops claiming, lets
/// running steps finish up to the grace period, drains every other task and
/// returns (see [`shutdown`]).
pub async fn run(config: Config, token: CancellationToken) -> anyhow::Result<()> {
    let tasks = shutdown::Shutdown::new(token);
    let shutdown = tasks.token();
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
        let _ = store.alert(apollo_shared::protocol::AlertKind::PluginError, &msg, None).await;
    }
    let registry = Arc::new(plugins::Plugins::new(registry, &config.agent_name()));
    let tasks_dir = config.tasks_dir();
    let cat = catalog::load_dir(&tasks_dir, &registry.get());
    for (file, errs) in &cat.errors {
        for e in errs {
            tracing::warn!(file = %file.display(), "definition not loaded: {e}");
        }
        let msg = errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ");
        let _ = store.alert(apollo_shared::protocol::AlertKind::DefinitionError, &msg, None).await;
    }
    // A freeze window naming a queue or task nobody knows would freeze nothing.
    for p in catalog::freeze_targets(&config, &cat) {
        tracing::warn!("{p}");
        let _ = store.alert(AlertKind::ConfigError, &p, None).await;
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
    let _ = scheduler.children.set(Arc::new(triggers::ChildMaker(triggers.clone())));
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
    tasks.spawn(server::serve(listener, api, access, tasks.clone()));
    hooks::start(&settings, store.clone(), &tasks);
    tasks.spawn(server::follow_metrics(scheduler.handles(), shutdown.clone()));
    // Alerts counted by kind, from the bus every alert is published on.
    {
        let s = scheduler.clone();
        bus.each_alert(&tasks, move |alert| {
            metrics::get().alerts.get_or_create(&metrics::label("kind", alert.kind.as_str())).inc();
            // The store is back: what stalled on it goes on now.
            if alert.kind == AlertKind::StoreWritable {
                s.wake();
            }
        });
    }
    // On a shared database, the other agents' changes wake this one.
    {
        let s = scheduler.clone();
        store.listen(Arc::new(move |change| s.heard(change)), &tasks);
    }
    // Requests from the other agents: stop an instance this one runs.
    {
        let (s, me) = (scheduler.clone(), store.agent().to_string());
        bus.each(Topic::Control, &tasks, move |ev| {
            if let EventData::Cancel { id, to, actor, reason } = &ev.data {
                if *to == me {
                    let why = handles::StopReason::Cancel { actor: actor.clone(), reason: reason.clone() };
                    let _ = s.cancel(id, why);
                }
            }
        });
    }
    notify::ready(&scheduler.status_line().await);
    tasks.spawn(reloader.run(shutdown.clone()));
    tasks.spawn(cron.run(shutdown.clone()));
    sources::start(&config, triggers, &tasks);
    // Until the token fires; then the executors' grace, then the drain.
    scheduler.run().await;
    tasks.drain().await;
    let _ = store.agent_stopped().await;
    store.close();
    let _ = std::fs::remove_file(&socket);
    tracing::info!("agent stopped");
    Ok(())
}
