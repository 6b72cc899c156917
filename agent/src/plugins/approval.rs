//! `approval`: a human in the loop. The scheduler parks the instance at
//! this step until someone permitted decides (`apollo approve`), or the
//! request times out; the step then runs with the decision and succeeds
//! (approved) or fails for good (denied, or a timeout that denies). Its
//! params: `message`, `approvers` (`users`, `groups`: who may decide; none:
//! any operator), `timeout` (how long the request waits), `on_timeout`
//! (`deny`, the default, or `approve`), `distinct_approver` (whoever
//! triggered the instance may not decide). Its approvers are checked at
//! load: only `users` and `groups`, each naming a user or group of this host.

use super::contract::{Call, ParamDoc, Plugin, PluginError};
use super::params::check_known;
use apollo_shared::protocol::Approvers;
use futures::future::BoxFuture;
use serde_json::{json, Map, Value};

pub struct Approval;

/// The param the scheduler adds when it runs the step: the decision.
pub const DECISION: &str = "decision";

const PARAMS: &[&str] = &["message", "approvers", "timeout", "on_timeout", "distinct_approver"];

/// What an approval step asks, from its rendered params.
#[derive(Debug, Clone)]
pub struct Request {
    pub message: String,
    pub approvers: Approvers,
    pub timeout: Option<f64>,
    pub on_timeout: String,
    pub distinct_approver: bool,
}

/// How long an approval step with params `p` waits for its decision, as a
/// dry-run shows it (`None` when `p` is not a valid approval's; `secs`
/// 0 when it waits until decided).
pub fn waits(p: &Map<String, Value>) -> Option<apollo_shared::protocol::AppliedTimeout> {
    let r = request(p).ok()?;
    Some(match r.timeout {
        Some(secs) => apollo_shared::protocol::AppliedTimeout {
            secs,
            basis: format!(
                "the approval's timeout: it waits this long for a decision, then {}",
                if r.on_timeout == "approve" { "approves" } else { "denies" }
            ),
        },
        None => apollo_shared::protocol::AppliedTimeout {
            secs: 0.0,
            basis: "the approval waits until someone decides: it has no timeout".into(),
        },
    })
}

pub fn request(p: &Map<String, Value>) -> Result<Request, String> {
    let message = match p.get("message") {
        Some(Value::String(m)) if !m.trim().is_empty() => m.clone(),
        Some(v) if !v.is_string() => return Err(format!("message: expected text, found {v}")),
        _ => return Err("message: required (what the approvers are asked)".into()),
    };
    let approvers = match p.get("approvers") {
        None | Some(Value::Null) => Approvers::default(),
        Some(v) => approvers(v)?,
    };
    let timeout = match p.get("timeout") {
        None | Some(Value::Null) => None,
        Some(v) => Some(apollo_shared::def::parse_duration(v).map_err(|e| format!("timeout: {e}"))?),
    };
    let on_timeout = match p.get("on_timeout") {
        None | Some(Value::Null) => "deny".to_string(),
        Some(Value::String(s)) if s == "deny" || s == "approve" => s.clone(),
        Some(v) => return Err(format!("on_timeout: expected deny or approve, found {v}")),
    };
    let distinct_approver = match p.get("distinct_approver") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(format!("distinct_approver: expected true or false, found {v}")),
    };
    Ok(Request { message, approvers, timeout, on_timeout, distinct_approver })
}

/// The fields of `approvers:`.
const APPROVER_FIELDS: &[&str] = &["users", "groups"];

/// `approvers:` as written: a mapping of `users` and `groups`, each a list
/// of names; anything else is refused (a typo would let any operator decide).
fn approvers(v: &Value) -> Result<Approvers, String> {
    let m = match v {
        Value::Object(m) => m,
        Value::String(s) => {
            return Err(format!(
                "approvers: expected a mapping of users and groups, found the text {s:?} \
                 (e.g. approvers: {{users: [{s}]}} or approvers: {{groups: [{s}]}})"
            ))
        }
        other => {
            return Err(format!(
                "approvers: expected a mapping of users and groups \
                 (e.g. approvers: {{users: [alice], groups: [dba]}}), found {}",
                apollo_shared::def::kind(other)
            ))
        }
    };
    if let Some(k) = m.keys().find(|k| !APPROVER_FIELDS.contains(&k.as_str())) {
        let hint = apollo_shared::text::closest(k, APPROVER_FIELDS)
            .map(|c| format!("did you mean {c:?}? "))
            .unwrap_or_default();
        return Err(format!("approvers: unknown field {k:?} ({hint}expected one of: {})", APPROVER_FIELDS.join(", ")));
    }
    let names = |field: &str, what: &str| -> Result<Vec<String>, String> {
        match m.get(field) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, n)| match n {
                    Value::String(s) if !s.trim().is_empty() => Ok(s.clone()),
                    other => Err(format!(
                        "approvers.{field}[{i}]: expected a {what} name, found {}",
                        apollo_shared::def::kind(other)
                    )),
                })
                .collect(),
            Some(Value::String(s)) => Err(format!(
                "approvers.{field}: expected a list of {what} names, found the text {s:?} (e.g. {field}: [{s}])"
            )),
            Some(other) => Err(format!(
                "approvers.{field}: expected a list of {what} names, found {}",
                apollo_shared::def::kind(other)
            )),
        }
    };
    Ok(Approvers { users: names("users", "user")?, groups: names("groups", "group")? })
}

/// The first approver this host does not know: a gate nobody could decide.
/// A name that is a template is known only once rendered.
fn unknown_on_host(a: &Approvers) -> Option<String> {
    let templated = |n: &str| n.contains("{{") || n.contains("{%");
    for (i, u) in a.users.iter().enumerate() {
        if !templated(u) && nix::unistd::User::from_name(u).ok().flatten().is_none() {
            return Some(format!(
                "approvers.users[{i}]: there is no user {u:?} on this host \
                 (nobody could decide; a group goes under groups:)"
            ));
        }
    }
    for (i, g) in a.groups.iter().enumerate() {
        if !templated(g) && nix::unistd::Group::from_name(g).ok().flatten().is_none() {
            return Some(format!("approvers.groups[{i}]: there is no group {g:?} on this host (nobody could decide)"));
        }
    }
    None
}

/// What holds of an approval step's params whatever its templates render
/// to, checked at load when some are templates: its `approvers` (unless a
/// template itself) are a mapping of known users and groups.
pub fn check_templated(p: &Map<String, Value>) -> Result<(), String> {
    match p.get("approvers") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) if s.contains("{{") || s.contains("{%") => Ok(()),
        Some(v) => approvers(v).and_then(|a| unknown_on_host(&a).map_or(Ok(()), Err)),
    }
}

/// What a decision (as the scheduler gives it: `decision`, `by`,
/// `reason`, `at`, `on_timeout`) means: the step's output when it lets the
/// work go on, else why not.
pub fn verdict(d: &Value) -> Result<Value, String> {
    let (decision, by, reason) = (d["decision"].as_str().unwrap_or(""), &d["by"], &d["reason"]);
    let by_s = by.as_str().unwrap_or("?");
    let reason_s = reason.as_str().unwrap_or("");
    let out = json!({"decision": decision, "by": by, "reason": reason, "at": d["at"]});
    match (decision, d["on_timeout"].as_str()) {
        ("approved", _) => Ok(out),
        ("timed_out", Some("approve")) => {
            Ok(json!({"decision": "approved", "by": "timeout", "reason": reason, "at": d["at"]}))
        }
        ("denied", _) => Err(format!("approval denied by {by_s}: {reason_s}")),
        ("timed_out", _) => Err(format!("approval timed out: {reason_s}")),
        (other, _) => Err(format!("approval {other} by {by_s}: {reason_s}")),
    }
}

/// A fan-out's `approve_after_batch` params, checked at load as an
/// approval step's are.
pub fn check_gate(p: &Map<String, Value>) -> Result<(), String> {
    let templated = p
        .values()
        .any(|v| apollo_shared::template::strings(v, "").iter().any(|(_, t)| t.contains("{{") || t.contains("{%")));
    match templated {
        true => check_templated(p),
        false => Approval.check_params(p),
    }
}

impl Plugin for Approval {
    fn uses_work_dir(&self) -> bool {
        false
    }
    fn name(&self) -> &str {
        "approval"
    }
    fn version(&self) -> semver::Version {
        semver::Version::new(1, 0, 0)
    }
    fn description(&self) -> &str {
        "Waits for a person's decision (apollo approve); holds no slot while it waits"
    }
    fn outputs(&self) -> Option<Vec<String>> {
        Some(["decision", "by", "reason", "at"].map(String::from).to_vec())
    }
    fn params(&self) -> Vec<ParamDoc> {
        vec![
            ParamDoc { name: "message", kind: "string", required: true, description: "what the approvers are asked" },
            ParamDoc {
                name: "approvers",
                kind: "mapping",
                required: false,
                description: "users: [names], groups: [names] who may decide (default: any operator)",
            },
            ParamDoc {
                name: "timeout",
                kind: "duration",
                required: false,
                description: "how long it waits (default: until decided)",
            },
            ParamDoc { name: "on_timeout", kind: "string", required: false, description: "deny (default) or approve" },
            ParamDoc {
                name: "distinct_approver",
                kind: "boolean",
                required: false,
                description: "whoever triggered the instance may not decide (default false)",
            },
        ]
    }
    fn check_params(&self, p: &Map<String, Value>) -> Result<(), String> {
        let mut known = PARAMS.to_vec();
        known.push(DECISION);
        check_known(p, &known)?;
        let r = request(p)?;
        unknown_on_host(&r.approvers).map_or(Ok(()), Err)
    }
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Value, PluginError>> {
        Box::pin(async move {
            let Some(d) = call.params.get(DECISION) else {
                return Err(PluginError::permanent("an approval step runs only once decided (apollo approve)"));
            };
            verdict(d).map_err(PluginError::permanent)
        })
    }
    fn rollback<'a>(&'a self, _call: Call<'a>, _output: Option<&'a Value>) -> BoxFuture<'a, Result<(), PluginError>> {
        Box::pin(async { Ok(()) })
    }
}
