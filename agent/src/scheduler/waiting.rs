//! Instances no live agent can run (the original design's §4.3): a claim
//! passes over an instance whose definition version names a plugin version
//! this agent lacks; here, once a maintenance tick, each such version is
//! checked against what every live agent publishes. When none can run it,
//! its runnable instances say why they wait and a `no_capable_agent` alert
//! is raised once; when one can again, the reason is cleared (that agent's
//! claim takes them).

use super::Scheduler;
use crate::plugins::rollout::{cap_runs, Rule};
use apollo_shared::def::{StepDef, TaskDef};
use apollo_shared::protocol::{AgentInfo, AlertKind, Pins};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Why no live agent can run `def` under these rollout rules, naming each
/// step's plugin that none has and who has which version of it; `None`
/// when one can.
pub fn no_agent_runs(def: &TaskDef, live: &[AgentInfo], rules: &BTreeMap<String, Rule>) -> Option<String> {
    let runs = |a: &AgentInfo, s: &StepDef| {
        cap_runs(&a.plugins, &a.name, &s.plugin, s.version.as_deref(), rules.get(&s.plugin))
    };
    let runs_all = |a: &AgentInfo| def.steps.iter().all(|s| runs(a, s));
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
        if !live.iter().any(|a| runs(a, s)) {
            let arm = match rules.get(&s.plugin) {
                Some(Rule { run, agents, .. }) if !agents.is_empty() => {
                    format!(", its rollout sending it to {run} on {}", agents.join(", "))
                }
                Some(Rule { run, .. }) => format!(", its rollout sending it to {run}"),
                None => String::new(),
            };
            let entry = format!("plugin {} {wanted} ({}{arm})", s.plugin, holders.join("; "));
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
    let latest = s.registry.rollouts();
    for (task, hash, pins) in passed {
        let Ok(def) = s.def_for(&hash).await else { continue };
        let key = (task.clone(), hash.clone(), pins.clone());
        let arms: Option<Pins> = pins.as_deref().and_then(|p| serde_json::from_str(p).ok());
        let rules = crate::plugins::rollout::rules(&latest, arms.as_ref());
        match no_agent_runs(&def, &live, &rules) {
            Some(reason) => {
                let fresh = s.store.set_waiting(&task, &hash, pins.as_deref(), Some(&reason)).await.unwrap_or(0);
                let first = s.uncapable.lock().expect("uncapable").insert(key);
                if fresh > 0 && first {
                    let msg = format!("task {task}: {fresh} instance(s) {reason}");
                    tracing::warn!("{msg}");
                    let _ = s.store.alert(AlertKind::NoCapableAgent, &msg, None).await;
                }
            }
            None => {
                s.uncapable.lock().expect("uncapable").remove(&key);
                let _ = s.store.set_waiting(&task, &hash, pins.as_deref(), None).await;
            }
        }
    }
}
