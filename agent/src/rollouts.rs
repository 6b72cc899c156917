//! Canary rollouts of a plugin version (the original design's §4.3: load
//! the new version on some schedulers first, watch it, then push it
//! everywhere): what `rollouts.start`, `promote` and `abort` do, the two
//! versions' figures since the start, and the automatic abort each
//! maintenance tick checks.
//!
//! Which version a step then runs is the registry view's business
//! (`plugins::rollout`); which arm a new instance gets, the trigger's
//! (`plugins::rollout::arms`).

use crate::config::Config;
use crate::plugins::Plugins;
use crate::store::{Store, StoreError};
use apollo_shared::protocol::{code, AlertKind, PluginStats, Rollout, RolloutStart, RolloutState, RpcError};
use semver::Version;

/// Attempts read for a version's figures since the start, at most.
const FIGURES_RUNS: u32 = 10_000;

/// `r` with both versions' figures since it started.
pub async fn with_figures(store: &Store, mut r: Rollout) -> Rollout {
    let since = Some(r.started_at.as_str());
    let (new, old) = tokio::join!(
        store.plugin_runs(&r.plugin, &r.version, FIGURES_RUNS, since),
        store.plugin_runs(&r.plugin, &r.base, FIGURES_RUNS, since)
    );
    let (new, old) = (new.ok(), old.ok());
    r.new = new.as_deref().and_then(PluginStats::from_runs);
    r.old = old.as_deref().and_then(PluginStats::from_runs);
    r
}

/// Every rollout, newest first, with its figures (the ended ones' up to now:
/// an ended rollout's versions may still run).
pub async fn list(store: &Store) -> Result<Vec<Rollout>, StoreError> {
    let mut out = Vec::new();
    for r in store.rollouts().await? {
        out.push(with_figures(store, r).await);
    }
    Ok(out)
}

fn invalid(msg: String) -> RpcError {
    RpcError::new(code::INVALID_PARAMS, msg)
}

/// Starts a rollout: `version` must be registered on this agent or on a
/// live one, and another version of the plugin must be in use (the one it
/// replaces, `base`: the newest version below it registered here or on a
/// live agent, else the newest other); the agents named must be live and
/// have `version`.
pub async fn start(
    store: &Store,
    plugins: &Plugins,
    config: &Config,
    p: RolloutStart,
    id: String,
    actor: &str,
) -> Result<Rollout, RpcError> {
    let reason = p.reason.trim().to_string();
    if reason.is_empty() {
        return Err(invalid("rollouts.start: a reason is required (it goes to the audit)".into()));
    }
    let version = Version::parse(&p.version)
        .map_err(|e| invalid(format!("rollouts.start: version {:?} is not a semantic version: {e}", p.version)))?;
    let defaults = &config.scheduler.rollout;
    let share = p.share_pct.unwrap_or(defaults.share_pct);
    if !(0.0..=100.0).contains(&share) {
        return Err(invalid(format!("rollouts.start: share_pct {share} is not between 0 and 100")));
    }
    // Who has which version: this agent, and every live one on a shared store.
    let mut holders: Vec<(String, Version)> =
        plugins.get().all().filter(|r| r.name == p.plugin).map(|r| (config.agent_name(), r.version())).collect();
    let agents = store.agents().await.map_err(StoreError::into_rpc)?;
    for a in agents.iter().filter(|a| !a.stopped && !a.late) {
        for c in a.plugins.iter().filter(|c| c.name == p.plugin) {
            if let Ok(v) = Version::parse(&c.version) {
                holders.push((a.name.clone(), v));
            }
        }
    }
    let has_new: Vec<&str> = holders.iter().filter(|(_, v)| *v == version).map(|(a, _)| a.as_str()).collect();
    let mut others: Vec<&Version> = holders.iter().map(|(_, v)| v).filter(|v| **v != version).collect();
    others.sort();
    others.dedup();
    // What it replaces: the newest version below it (else the newest other).
    let base = others.iter().rev().find(|v| ***v < version).or(others.last()).map(|v| v.to_string());
    let others: Vec<String> = others.iter().map(|v| v.to_string()).collect();
    if has_new.is_empty() {
        let known = match others.is_empty() {
            true => "no version of it is registered on a live agent".to_string(),
            false => format!("live agents have {}", others.join(", ")),
        };
        return Err(RpcError::new(
            code::NOT_FOUND,
            format!("rollouts.start: no live agent has {} {version} registered ({known})", p.plugin),
        )
        .with_hint("register the new version on the agents that should run it first (apollo plugins shows them)"));
    }
    let Some(base) = base else {
        return Err(invalid(format!(
            "rollouts.start: {version} is the only version of {} registered; there is nothing to roll out from",
            p.plugin
        )));
    };
    for a in &p.agents {
        if !has_new.contains(&a.as_str()) {
            return Err(invalid(format!(
                "rollouts.start: agent {a:?} is not live with {} {version} registered (those that are: {})",
                p.plugin,
                has_new.join(", ")
            )));
        }
    }
    let r = Rollout {
        id,
        plugin: p.plugin,
        version: version.to_string(),
        base,
        share_pct: share,
        agents: p.agents,
        state: RolloutState::Running,
        started_at: String::new(),
        started_by: actor.to_string(),
        reason,
        ended_at: None,
        ended_by: None,
        end_reason: None,
        abort_margin_pct: p.abort_margin_pct.unwrap_or(defaults.abort_margin_pct),
        min_runs: p.min_runs.unwrap_or(defaults.min_runs),
        new: None,
        old: None,
    };
    let r = store.start_rollout(r).await.map_err(StoreError::into_rpc)?;
    refresh(store, plugins).await;
    tracing::info!(plugin = %r.plugin, version = %r.version, base = %r.base, share = r.share_pct, "rollout started");
    Ok(r)
}

/// Ends the plugin's running rollout (promoted or aborted); an abort is
/// alerted.
pub async fn end(
    store: &Store,
    plugins: &Plugins,
    plugin: &str,
    to: RolloutState,
    reason: &str,
    actor: &str,
) -> Result<Rollout, RpcError> {
    let verb = if to == RolloutState::Promoted { "promote" } else { "abort" };
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(invalid(format!("rollouts.{verb}: a reason is required (it goes to the audit)")));
    }
    let ended = store.end_rollout(plugin, to, reason, actor).await.map_err(StoreError::into_rpc)?;
    let Some(r) = ended else {
        return Err(RpcError::new(code::NOT_FOUND, format!("rollouts.{verb}: no rollout of {plugin:?} is running"))
            .with_hint("list rollouts with `apollo rollout`"));
    };
    refresh(store, plugins).await;
    if to == RolloutState::Aborted {
        let msg = format!(
            "rollout of {} {} aborted by {actor}: {reason}; new instances run {} again",
            r.plugin, r.version, r.base
        );
        tracing::warn!("{msg}");
        let _ = store.alert(AlertKind::RolloutAborted, &msg, None).await;
    } else {
        tracing::info!(plugin = %r.plugin, version = %r.version, "rollout promoted");
    }
    Ok(with_figures(store, r).await)
}

/// Reads each plugin's latest rollout into the registry's view.
pub async fn refresh(store: &Store, plugins: &Plugins) {
    if let Ok(latest) = store.latest_rollouts().await {
        plugins.set_rollouts(latest);
    }
}

/// One maintenance tick: the rollouts as the store has them now, and the
/// automatic abort of a running one whose new version fails too often. On
/// a shared store every agent checks; the first to end it wins (the end is
/// conditional) and it alone alerts.
pub async fn tick(store: &Store, plugins: &Plugins, agent: &str) {
    refresh(store, plugins).await;
    let running: Vec<Rollout> =
        plugins.rollouts().values().filter(|r| r.state == RolloutState::Running).cloned().collect();
    for r in running {
        let r = with_figures(store, r).await;
        if let Some(why) = r.should_abort() {
            let actor = format!("automatic abort (agent {agent})");
            let _ = end(store, plugins, &r.plugin, RolloutState::Aborted, &why, &actor).await;
        }
    }
}
