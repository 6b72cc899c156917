//! How a plugin version's rollout (the original design's §4.3) shapes the
//! version a step resolves to (`Registry::resolve` with a view's rules).
//!
//! The latest rollout of a plugin decides, for an instance:
//! - running, the instance's arm is the new version: a step that accepts
//!   it runs it, on the rollout's agents only;
//! - running, the old arm: a step runs the version the rollout replaces;
//! - running, no arm (created before the start, or its steps did not accept
//!   both versions): as without a rollout;
//! - promoted: every step that accepts the new version runs it, on every
//!   agent that has it (a version registered later is not chosen until a
//!   rollout of it starts);
//! - aborted: every step that accepts the replaced version runs it, and the
//!   new version is chosen only where nothing else will do, until a rollout
//!   of the plugin starts again.

use apollo_shared::protocol::{Pins, PluginCap, Rollout, RolloutState};
use semver::{Version, VersionReq};
use std::collections::BTreeMap;

/// What a rollout changes in the choice of a plugin's version: a step that
/// accepts `run` runs it, and only on `agents` (empty: any that has it);
/// any other step chooses as usual, `avoid` only when nothing else will do.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    pub run: Version,
    pub agents: Vec<String>,
    pub avoid: Option<Version>,
}

/// The index in `versions` (ascending) a step requiring `req` resolves to
/// under `rule` on agent `me`; else why not (appended to the message that
/// names the versions available), empty when no rule is the cause.
pub fn choose(versions: &[Version], req: Option<&VersionReq>, rule: Option<&Rule>, me: &str) -> Result<usize, String> {
    let accepts = |v: &Version| req.is_none_or(|r| r.matches(v));
    let pick = |keep: &dyn Fn(&Version) -> bool| versions.iter().rposition(|v| accepts(v) && keep(v));
    let Some(Rule { run, agents, avoid }) = rule else { return pick(&|_| true).ok_or_else(String::new) };
    if accepts(run) {
        if !agents.is_empty() && !agents.iter().any(|a| a == me) {
            return Err(format!(
                "; its rollout sends this instance to {run}, which runs on {} only",
                agents.join(", ")
            ));
        }
        return versions
            .iter()
            .position(|v| v == run)
            .ok_or_else(|| format!("; its rollout sends this instance to {run}, not registered here"));
    }
    pick(&|v| Some(v) != avoid.as_ref()).or_else(|| pick(&|_| true)).ok_or_else(String::new)
}

/// The rules an instance with `pins` resolves under, given each plugin's
/// latest rollout.
pub fn rules(latest: &BTreeMap<String, Rollout>, pins: Option<&Pins>) -> BTreeMap<String, Rule> {
    let mut out = BTreeMap::new();
    for (plugin, r) in latest {
        let (Ok(new), Ok(base)) = (Version::parse(&r.version), Version::parse(&r.base)) else { continue };
        let rule = match r.state {
            RolloutState::Running => match pins.and_then(|p| p.get(plugin)).filter(|p| p.rollout == r.id) {
                Some(pin) if pin.new => Rule { run: new, agents: r.agents.clone(), avoid: None },
                // The old arm, and an instance without an arm of this
                // rollout (created before it started, or by an agent that
                // had learned of its end while this one has not yet): only
                // the new arm runs the new version.
                _ => Rule { run: base, agents: Vec::new(), avoid: Some(new) },
            },
            RolloutState::Promoted => Rule { run: new, agents: Vec::new(), avoid: None },
            RolloutState::Aborted => Rule { run: base, agents: Vec::new(), avoid: Some(new) },
        };
        out.insert(plugin.clone(), rule);
    }
    out
}

/// Whether an agent that publishes `caps` can run a step of `plugin`
/// requiring `req` under `rule` (as `Registry::resolve` would choose there).
pub fn cap_runs(caps: &[PluginCap], agent: &str, plugin: &str, req: Option<&str>, rule: Option<&Rule>) -> bool {
    let req = match req.map(VersionReq::parse) {
        Some(Ok(r)) => Some(r),
        Some(Err(_)) => return false,
        None => None,
    };
    let mut versions: Vec<Version> =
        caps.iter().filter(|c| c.name == plugin).filter_map(|c| Version::parse(&c.version).ok()).collect();
    versions.sort();
    choose(&versions, req.as_ref(), rule, agent).is_ok()
}

/// The arms a new instance gets: for each running rollout of a plugin its
/// steps use, when every such step accepts both the new version and the
/// one it replaces, the new arm with the rollout's share (`draw` in
/// [0, 1) decides), else the old one.
pub fn arms(
    latest: &BTreeMap<String, Rollout>,
    def: &apollo_shared::def::TaskDef,
    draw: &mut dyn FnMut() -> f64,
) -> Pins {
    let mut pins = Pins::new();
    for (plugin, r) in latest.iter().filter(|(_, r)| r.state == RolloutState::Running) {
        let (Ok(new), Ok(old)) = (Version::parse(&r.version), Version::parse(&r.base)) else { continue };
        let steps: Vec<_> = def.steps.iter().filter(|s| &s.plugin == plugin).collect();
        let accepts = |v: &Version| {
            steps.iter().all(|s| match s.version.as_deref().map(VersionReq::parse) {
                None => true,
                Some(Ok(req)) => req.matches(v),
                Some(Err(_)) => false,
            })
        };
        if steps.is_empty() || !accepts(&new) || !accepts(&old) {
            continue;
        }
        let new_arm = draw() * 100.0 < r.share_pct;
        pins.insert(
            plugin.clone(),
            apollo_shared::protocol::Pin {
                rollout: r.id.clone(),
                version: if new_arm { r.version.clone() } else { r.base.clone() },
                new: new_arm,
            },
        );
    }
    pins
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    #[test]
    fn each_rule_chooses_as_its_rollout_says() {
        let versions = [v("1.0.0"), v("2.0.0"), v("3.0.0")];
        let req = |r: &str| VersionReq::parse(r).unwrap();
        let rule = |run: &str, agents: &[&str], avoid: Option<&str>| Rule {
            run: v(run),
            agents: agents.iter().map(|a| a.to_string()).collect(),
            avoid: avoid.map(v),
        };
        let any = req(">=1");
        assert_eq!(choose(&versions, Some(&any), None, "a"), Ok(2));
        // The new arm, anywhere or on b only.
        assert_eq!(choose(&versions, Some(&any), Some(&rule("2.0.0", &[], None)), "a"), Ok(1));
        assert_eq!(choose(&versions, Some(&any), Some(&rule("2.0.0", &["b"], None)), "b"), Ok(1));
        let elsewhere = choose(&versions, Some(&any), Some(&rule("2.0.0", &["b"], None)), "a").unwrap_err();
        assert!(elsewhere.contains("runs on b only"), "{elsewhere}");
        // An agent without the version its arm runs: not here.
        assert!(choose(&versions[..1], Some(&any), Some(&rule("2.0.0", &[], None)), "a").is_err());
        // The old arm and an abort: the replaced version, not the newest.
        assert_eq!(choose(&versions, Some(&any), Some(&rule("1.0.0", &[], Some("2.0.0"))), "a"), Ok(0));
        // A step that does not accept the version run: as usual, avoiding
        // the aborted one while another will do.
        assert_eq!(choose(&versions, Some(&req(">=2")), Some(&rule("1.0.0", &[], Some("3.0.0"))), "a"), Ok(1));
        assert_eq!(choose(&versions, Some(&req("^3")), Some(&rule("1.0.0", &[], Some("3.0.0"))), "a"), Ok(2));
    }

    /// Under a running rollout only the new arm runs the new version: an
    /// instance without an arm of it runs the base, as the old arm does.
    #[test]
    fn an_instance_without_an_arm_of_a_running_rollout_runs_its_base() {
        use apollo_shared::protocol::Pin;
        let rollout = Rollout {
            id: "r1".into(),
            plugin: "ver".into(),
            version: "3.0.0".into(),
            base: "2.0.0".into(),
            share_pct: 50.0,
            agents: vec!["c".into()],
            state: RolloutState::Running,
            started_at: String::new(),
            started_by: String::new(),
            reason: String::new(),
            ended_at: None,
            ended_by: None,
            end_reason: None,
            abort_margin_pct: 20.0,
            min_runs: 4,
            new: None,
            old: None,
        };
        let latest = BTreeMap::from([("ver".to_string(), rollout)]);
        let pin =
            |new: bool| Pins::from([("ver".to_string(), Pin { rollout: "r1".into(), version: String::new(), new })]);
        let base = Rule { run: v("2.0.0"), agents: Vec::new(), avoid: Some(v("3.0.0")) };
        assert_eq!(rules(&latest, None).get("ver"), Some(&base));
        assert_eq!(rules(&latest, Some(&pin(false))).get("ver"), Some(&base));
        let new = Rule { run: v("3.0.0"), agents: vec!["c".into()], avoid: None };
        assert_eq!(rules(&latest, Some(&pin(true))).get("ver"), Some(&new));
    }
}
