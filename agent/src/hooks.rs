//! Alert hooks: every alert raised on the bus is handed, through a bounded
//! queue, to the hooks whose filters (kind, task) let it through — a command
//! (the alert as JSON on stdin, a clean environment, 10 s at most) or a
//! webhook (POSTed as JSON, headers from named environment variables, 10 s
//! at most). Each delivery is tried 4 times with growing pauses; one that
//! still fails is recorded as a `hook_failed` alert (which no hook is sent).
//! The same alert repeated within a minute is delivered once. Nothing here
//! can block the scheduler: the bus never waits, and a full queue drops (and
//! logs) what it cannot hold. The hooks in force are built anew whenever
//! SIGHUP changes `alerts.hooks`.

use crate::config::{Config, HookConf};
use crate::settings::Settings;
use crate::shutdown::Shutdown;
use crate::store::Store;
use apollo_shared::protocol::{AlertKind, Raised};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const QUEUE: usize = 1000;
const ATTEMPTS: u32 = 4;
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const REPEAT_WINDOW: Duration = Duration::from_secs(60);

struct Hook {
    conf: HookConf,
    command: Option<Vec<String>>,
}

impl Hook {
    fn describe(&self) -> String {
        match (&self.command, &self.conf.webhook) {
            (Some(c), _) => format!("command {:?}", c.join(" ")),
            (_, Some(u)) => format!("webhook {u}"),
            _ => "hook".into(),
        }
    }

    async fn deliver(&self, http: &reqwest::Client, alert: &Value) -> Result<(), String> {
        if let Some(argv) = &self.command {
            use crate::plugins::process::{self, Spec};
            let cancel = CancellationToken::new();
            let spec = Spec {
                argv: argv.clone(),
                env: process::clean_env(&[], Vec::new()),
                cwd: std::env::temp_dir(),
                clean_env: true,
                stdin: Some(serde_json::to_vec(alert).unwrap_or_default()),
                capture_stdout: Some(4096),
                step_key: None,
            };
            // At the timeout the command is stopped (its group gets SIGTERM,
            // then SIGKILL) and the run ends with `stopped`.
            let run = process::run(spec, None, cancel.clone(), Duration::from_secs(1));
            tokio::pin!(run);
            let out = tokio::select! {
                out = &mut run => out,
                _ = tokio::time::sleep(CALL_TIMEOUT) => {
                    cancel.cancel();
                    run.await
                }
            }?;
            return match (out.stopped, out.code) {
                (true, _) => Err(format!("did not finish within {}s", CALL_TIMEOUT.as_secs())),
                (false, Some(0)) => Ok(()),
                _ => Err(format!("{}; stderr: {}", process::describe_exit(&out), out.stderr_tail.trim())),
            };
        }
        let url = self.conf.webhook.as_deref().unwrap_or_default();
        let mut req = http.post(url).timeout(CALL_TIMEOUT).json(alert);
        for (header, var) in &self.conf.headers {
            let value = std::env::var(var).map_err(|_| format!("header {header}: ${var} is not set"))?;
            req = req.header(header.as_str(), value);
        }
        let resp = req.send().await.map_err(|e| format!("POST {url}: {e}"))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(format!("POST {url}: HTTP {}", resp.status()))
        }
    }
}

/// The configured hooks, command paths made absolute (relative to the
/// config file; a hook runs elsewhere).
fn build(config: &Config) -> Arc<Vec<Hook>> {
    Arc::new(
        config
            .alerts
            .hooks
            .iter()
            .map(|h| Hook {
                conf: h.clone(),
                command: h.command.as_ref().map(|c| {
                    let mut argv = c.clone();
                    if argv[0].contains('/') {
                        let p = config.command_path(&argv[0]);
                        argv[0] = std::path::absolute(&p).unwrap_or(p).display().to_string();
                    }
                    argv
                }),
            })
            .collect(),
    )
}

/// Delivers alerts to the hooks in force until shutdown.
pub fn start(settings: &Settings, store: Store, tasks: &Shutdown) {
    let shutdown = tasks.token();
    let mut changes = settings.subscribe();
    let mut hooks = build(&changes.borrow_and_update());
    let (tx, mut queue) = tokio::sync::mpsc::channel::<Raised>(QUEUE);
    // From the bus to the queue, never waiting.
    store.bus().each_alert(tasks, move |alert| {
        if alert.kind != AlertKind::HookFailed && tx.try_send(alert.clone()).is_err() {
            tracing::warn!("alert hook queue full; an alert was not delivered to the hooks");
        }
    });
    tasks.spawn(async move {
        // Made at the first delivery: a client loads the TLS roots, which
        // an agent with no hooks (or no alerts) should not pay for.
        let mut client: Option<reqwest::Client> = None;
        let mut recent: HashMap<String, Instant> = HashMap::new();
        let deliveries = tokio_util::task::TaskTracker::new();
        loop {
            let alert = tokio::select! {
                a = queue.recv() => match a { Some(a) => a, None => break },
                _ = shutdown.cancelled() => break,
            };
            // The hooks in force when the alert is taken (SIGHUP may have
            // replaced them; deliveries under way keep the ones they started with).
            if changes.has_changed().unwrap_or(false) {
                hooks = build(&changes.borrow_and_update());
            }
            if hooks.is_empty() {
                continue;
            }
            let key = format!("{}|{:?}|{}", alert.kind, alert.instance, alert.message);
            let now = Instant::now();
            recent.retain(|_, at| now.duration_since(*at) < REPEAT_WINDOW);
            if recent.insert(key, now).is_some() {
                continue; // the same alert within the window: delivered once
            }
            let task = match alert.instance.as_deref() {
                Some(id) => store.get(id).await.ok().map(|i| i.task),
                None => None,
            };
            // What a hook is sent (see docs/operations.md, "Alert hooks").
            let kind = alert.kind;
            let mut alert = json!({ "kind": alert.kind, "instance": alert.instance, "message": alert.message });
            alert["task"] = json!(task);
            alert["at"] = json!(chrono::Utc::now().to_rfc3339());
            alert["agent"] = json!(store.agent());
            for (i, hook) in hooks.iter().enumerate() {
                if !hook.conf.kinds.is_empty() && !hook.conf.kinds.iter().any(|k| k == kind.as_str()) {
                    continue;
                }
                if !hook.conf.tasks.is_empty() && !task.as_ref().is_some_and(|t| hook.conf.tasks.contains(t)) {
                    continue;
                }
                let http = client.get_or_insert_with(reqwest::Client::new).clone();
                let (hooks, store, alert) = (hooks.clone(), store.clone(), alert.clone());
                deliveries.spawn(async move {
                    let hook = &hooks[i];
                    let mut last = String::new();
                    for attempt in 1..=ATTEMPTS {
                        match hook.deliver(&http, &alert).await {
                            Ok(()) => return,
                            Err(e) => last = e,
                        }
                        if attempt < ATTEMPTS {
                            tokio::time::sleep(Duration::from_millis(250 << attempt)).await;
                        }
                    }
                    let msg = format!(
                        "alert hook {} failed {ATTEMPTS} times: {last} (alert {}: {})",
                        hook.describe(),
                        alert["kind"].as_str().unwrap_or_default(),
                        alert["message"].as_str().unwrap_or_default()
                    );
                    tracing::error!("{msg}");
                    let _ = store.alert(AlertKind::HookFailed, &msg, alert["instance"].as_str()).await;
                });
            }
        }
        deliveries.close();
        let _ = tokio::time::timeout(Duration::from_secs(5), deliveries.wait()).await;
    });
}
