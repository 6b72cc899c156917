//! Instances no live agent can run (the original design's §4.3): a claim
//! passes over an instance whose definition version names a plugin version
//! this agent lacks; here, once a maintenance tick, each such version is
//! checked against what every live agent publishes. When none can run it,
//! its runnable instances say why they wait and a `no_capable_agent` alert
//! is raised once; when one can again, the reason is cleared (that agent's
//! claim takes them).

use super::Scheduler;
use apollo_shared::def::TaskDef;
use apollo_shared::protocol::{AgentInfo, AlertKind, PluginCap};
use std::sync::Arc;

/// Why no live agent can run `def`, naming each step's plugin that none
/// has and who has which version of it; `None` when one can.
pub fn no_agent_runs(def: &TaskDef, live: &[AgentInfo]) -> Option<String> {
    let runs_all =
        |a: &AgentInfo| def.steps.iter().all(|s| PluginCap::any_runs(&a.plugins, &s.plugin, s.version.as_deref()));
    if live.iter().any(runs_all) {
        return None;
    }
    let mut missing: Vec<String> = Vec::new();
    for s in &def.steps {
        let wanted = s.version.as_deref().unwrap_or("any version");
        let holders: Vec<String> = live
            .iter()
            .map(|a| {
                let versions: Vec<&str> =
                    a.plugins.iter().filter(|p| p.name == s.plugin).map(|p| p.version.as_str()).collect();
                match versions.is_empty() {
                    true => format!("{} has none", a.name),
                    false => format!("{} has {}", a.name, versions.join(", ")),
                }
            })
            .collect();
        if !live.iter().any(|a| PluginCap::any_runs(&a.plugins, &s.plugin, s.version.as_deref())) {
            let entry = format!("plugin {} {wanted} ({})", s.plugin, holders.join("; "));
            if !missing.contains(&entry) {
                missing.push(entry);
            }
        }
    }
    if missing.is_empty() {
        // Each step has a taker, but no one agent has them all.
        missing.push("every step's plugin on one agent".into());
    }
    Some(format!("waiting: no live agent can run {}", missing.join(", ")))
}

/// One pass over what claims passed over since the last.
pub(super) async fn check(s: &Arc<Scheduler>) {
    let passed = s.capable.take_passed();
    if passed.is_empty() {
        return;
    }
    let Ok(agents) = s.store.agents().await else { return };
    let live: Vec<AgentInfo> = agents.into_iter().filter(|a| !a.stopped && !a.late).collect();
    for (task, hash) in passed {
        let Ok(def) = s.def_for(&hash).await else { continue };
        let key = (task.clone(), hash.clone());
        match no_agent_runs(&def, &live) {
            Some(reason) => {
                let fresh = s.store.set_waiting(&task, &hash, Some(&reason)).await.unwrap_or(0);
                let first = s.uncapable.lock().expect("uncapable").insert(key);
                if fresh > 0 && first {
                    let msg = format!("task {task}: {fresh} instance(s) {reason}");
                    tracing::warn!("{msg}");
                    let _ = s.store.alert(AlertKind::NoCapableAgent, &msg, None).await;
                }
            }
            None => {
                s.uncapable.lock().expect("uncapable").remove(&key);
                let _ = s.store.set_waiting(&task, &hash, None).await;
            }
        }
    }
}
