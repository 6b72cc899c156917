//! Worker mode for external plugins: the original design's process pool
//! (§5.1). A plugin whose describe says `"mode": "worker"` is started as
//! `<exe> serve` and kept: it reads one JSON request a line on stdin and
//! answers one JSON reply a line on stdout, for many validate, execute and
//! rollback calls (PLUGINS.md has the protocol).
//!
//! Each plugin version has a pool of such workers between `min` and `max`.
//! A call takes an idle worker; one that has waited `grow_after` for a worker
//! starts another (up to `max`), and a janitor stops workers idle longer than
//! `idle` (down to `min`). A worker serves one call at a time. A call is
//! still bounded by its timeout: the worker that overruns is stopped with its
//! process group (SIGTERM, SIGKILL after the grace) and the call fails as a
//! timeout; a worker that dies mid-call fails that call as retryable; either
//! way the pool starts a new worker when one is next needed. A worker is
//! recycled after `max_calls` calls or when its resident memory passes
//! `max_memory_mb`.

mod proc;

pub use crate::config::PoolConf;

use super::PluginError;
use crate::logs::StepLog;
use apollo_shared::protocol::PoolStats;
use proc::{retire, spawn, Exchange, Worker, ENVELOPE};
use serde_json::{json, Map, Value};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// A plugin's pool bounds and limits (`plugins[].workers` in apollo.yaml).
/// Waits remembered for the pool's wait percentiles.
const WAITS: usize = 256;

#[derive(Default)]
struct Counters {
    waits: VecDeque<Duration>,
    calls: u64,
    started: u64,
    replaced: u64,
    recycled: u64,
    peak: usize,
}

/// The pool of one plugin version.
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    pass_env: Vec<String>,
    conf: PoolConf,
    grace: Duration,
    /// The longest line read from a worker's stdout.
    line_max: usize,
    /// Idle workers, the most recently used last (taken first), so the
    /// others age and the janitor can stop them.
    idle: Mutex<Vec<Worker>>,
    /// One permit per idle worker.
    ready: Semaphore,
    /// Workers alive, busy or idle, and those being started.
    size: AtomicUsize,
    waiting: AtomicUsize,
    counters: Mutex<Counters>,
}

impl Pool {
    /// A pool for `path`; its janitor starts `min` workers, then stops idle
    /// ones. `result_cap` is the largest result a call may return.
    pub fn new(path: &Path, pass_env: Vec<String>, conf: PoolConf, grace: Duration, result_cap: usize) -> Pool {
        let inner = Arc::new(Inner {
            path: path.to_path_buf(),
            pass_env,
            conf,
            grace,
            line_max: result_cap + ENVELOPE,
            idle: Mutex::new(Vec::new()),
            ready: Semaphore::new(0),
            size: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            counters: Mutex::new(Counters::default()),
        });
        tokio::spawn(janitor(Arc::downgrade(&inner)));
        Pool { inner }
    }

    pub fn stats(&self) -> PoolStats {
        let i = &self.inner;
        let c = i.counters.lock().expect("pool counters");
        let mut waits: Vec<Duration> = c.waits.iter().copied().collect();
        waits.sort();
        let at = |q: f64| {
            waits.get(((waits.len() as f64 - 1.0) * q).round() as usize).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
        };
        let workers = i.size.load(Ordering::SeqCst);
        let idle = i.idle.lock().expect("pool").len();
        PoolStats {
            min: i.conf.min,
            max: i.conf.max,
            workers,
            busy: workers.saturating_sub(idle),
            waiting: i.waiting.load(Ordering::SeqCst),
            peak: c.peak,
            calls: c.calls,
            wait_p50_ms: at(0.5),
            wait_p99_ms: at(0.99),
            started: c.started,
            replaced: c.replaced,
            recycled: c.recycled,
        }
    }

    /// One call on a worker: `input` is what a one-shot call reads on
    /// stdin, `env` the call's own variables. Returns the reply's result.
    pub async fn call(
        &self,
        verb: &str,
        input: &Value,
        env: &[(String, String)],
        log: Option<&StepLog>,
        cancel: &CancellationToken,
        cap: usize,
    ) -> Result<Map<String, Value>, PluginError> {
        let i = &self.inner;
        let mut w = i.acquire(verb, cancel).await?;
        w.calls += 1;
        if let Some(log) = log {
            // Heads the step's log when the call writes one (a silent call
            // creates no file, as in one-shot mode).
            log.header(&format!("[apollo: {verb} on worker pid {} (its call {})]", w.pid, w.calls));
        }
        let env: Map<String, Value> = env.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
        let request = json!({"id": w.calls, "call": verb, "env": env, "input": input});
        match w.exchange(verb, &request, log, cancel, cap, i.grace).await {
            Exchange::Answered(r) => {
                i.release(w);
                r
            }
            Exchange::Lost(e) => {
                tracing::warn!(plugin = %i.path.display(), pid = w.pid, "plugin worker replaced: {e}");
                if let Some(log) = log {
                    log.line(&format!("[apollo: {e}; the worker is replaced]"));
                }
                i.counters.lock().expect("pool counters").replaced += 1;
                i.size.fetch_sub(1, Ordering::SeqCst);
                drop(w);
                Err(e)
            }
        }
    }
}

impl Inner {
    /// Reserves room for one more worker if fewer than `limit` are alive.
    fn reserve(&self, limit: usize) -> bool {
        self.size.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < limit).then_some(n + 1)).is_ok()
    }

    /// Starts a worker in the room `reserve` made (given back on failure).
    fn start(&self) -> Result<Worker, String> {
        let spawned = spawn(&self.path, &self.pass_env, self.line_max);
        let mut c = self.counters.lock().expect("pool counters");
        match spawned {
            Ok(w) => {
                c.started += 1;
                c.peak = c.peak.max(self.size.load(Ordering::SeqCst));
                Ok(w)
            }
            Err(e) => {
                self.size.fetch_sub(1, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    fn take_idle(&self) -> Option<Worker> {
        let permit = self.ready.try_acquire().ok()?;
        permit.forget();
        let mut idle = self.idle.lock().expect("pool");
        idle.pop()
    }

    /// An idle worker, a new one (below `min`, or after waiting
    /// `grow_after`, below `max`), or the one released first.
    async fn acquire(&self, verb: &str, cancel: &CancellationToken) -> Result<Worker, PluginError> {
        let began = Instant::now();
        let starting = |e: String| PluginError::retryable(format!("{verb}: cannot start a worker: {e}"));
        let w = loop {
            if let Some(mut w) = self.take_idle() {
                if w.gone() {
                    self.counters.lock().expect("pool counters").replaced += 1;
                    self.size.fetch_sub(1, Ordering::SeqCst);
                    continue;
                }
                break w;
            }
            if self.reserve(self.conf.min.max(1)) {
                break self.start().map_err(starting)?;
            }
            self.waiting.fetch_add(1, Ordering::SeqCst);
            let waited = tokio::select! {
                p = self.ready.acquire() => p.ok().map(|p| p.forget()).map(|_| self.idle.lock().expect("pool").pop()),
                _ = tokio::time::sleep(self.conf.grow_after) => None,
                _ = cancel.cancelled() => {
                    self.waiting.fetch_sub(1, Ordering::SeqCst);
                    return Err(PluginError::retryable(format!("{verb} was stopped while waiting for a worker")));
                }
            };
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            match waited {
                Some(Some(mut w)) => {
                    if !w.gone() {
                        break w;
                    }
                    self.counters.lock().expect("pool counters").replaced += 1;
                    self.size.fetch_sub(1, Ordering::SeqCst);
                }
                // Waited `grow_after`: the pool grows if it may.
                _ if self.reserve(self.conf.max) => break self.start().map_err(starting)?,
                _ => {}
            }
        };
        let mut c = self.counters.lock().expect("pool counters");
        if c.waits.len() == WAITS {
            c.waits.pop_front();
        }
        c.waits.push_back(began.elapsed());
        c.calls += 1;
        Ok(w)
    }

    /// Back to the pool, or recycled when it has served its calls or grown.
    fn release(&self, mut w: Worker) {
        if w.calls >= self.conf.max_calls || w.over_memory(self.conf.max_memory_mb) {
            tracing::info!(plugin = %self.path.display(), pid = w.pid, calls = w.calls, "plugin worker recycled");
            self.counters.lock().expect("pool counters").recycled += 1;
            self.size.fetch_sub(1, Ordering::SeqCst);
            retire(w, self.grace);
            return;
        }
        w.last_used = Instant::now();
        self.idle.lock().expect("pool").push(w);
        self.ready.add_permits(1);
    }
}

/// Starts `min` workers, then every tick stops the workers idle longer than
/// `idle` while more than `min` are alive. Ends with the pool.
async fn janitor(pool: Weak<Inner>) {
    let (tick, min) = match pool.upgrade() {
        Some(p) => ((p.conf.idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(5)), p.conf.min),
        None => return,
    };
    for _ in 0..min {
        let Some(p) = pool.upgrade() else { return };
        if !p.reserve(min) {
            break;
        }
        match p.start() {
            Ok(w) => p.release(w),
            Err(e) => {
                tracing::warn!(plugin = %p.path.display(), "cannot start a plugin worker: {e}");
                break;
            }
        }
    }
    loop {
        tokio::time::sleep(tick).await;
        let Some(p) = pool.upgrade() else { return };
        let mut stale = Vec::new();
        {
            let mut idle = p.idle.lock().expect("pool");
            while idle.first().is_some_and(|w| w.last_used.elapsed() >= p.conf.idle)
                && p.size.load(Ordering::SeqCst) > p.conf.min
            {
                // Its permit is taken with it; none free means a caller is
                // about to take this worker, so it stays.
                let Ok(permit) = p.ready.try_acquire() else { break };
                permit.forget();
                stale.push(idle.remove(0));
                p.size.fetch_sub(1, Ordering::SeqCst);
            }
        }
        for w in stale {
            tracing::debug!(plugin = %p.path.display(), pid = w.pid, "idle plugin worker stopped");
            retire(w, p.grace);
        }
    }
}
