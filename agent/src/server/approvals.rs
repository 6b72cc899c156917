//! `approvals.list` and `approvals.decide`: who may decide an approval is
//! the step's `approvers` (users, or members of groups, by name; none
//! listed: any operator), never whoever triggered the instance when it says
//! `distinct_approver`; a decision is given once.

use super::api::Api;
use crate::triggers::store_error as store_err;
use apollo_shared::protocol::{code, Approval, ApprovalDecide, RpcError};

/// The user an actor names (`alice (uid 1000) via ssh from …` → `alice`).
fn user_of(actor: &str) -> &str {
    actor.split(" (uid").next().unwrap_or(actor).trim()
}

/// The names of the groups the system lists for `user`.
fn groups_of(user: &str) -> Vec<String> {
    let Ok(Some(u)) = nix::unistd::User::from_name(user) else { return Vec::new() };
    let Ok(name) = std::ffi::CString::new(user) else { return Vec::new() };
    nix::unistd::getgrouplist(&name, u.gid)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|g| nix::unistd::Group::from_gid(g).ok().flatten().map(|g| g.name))
        .collect()
}

/// Why `actor` may not decide `a`, if so.
fn refusal(a: &Approval, actor: &str) -> Option<String> {
    let user = user_of(actor);
    if a.distinct_approver && user_of(&a.requested_by) == user {
        return Some(format!(
            "{user} triggered instance {} and its approval asks for someone else (distinct_approver)",
            a.instance
        ));
    }
    let (users, groups) = (&a.approvers.users, &a.approvers.groups);
    if users.is_empty() && groups.is_empty() {
        return None;
    }
    if users.iter().any(|u| u == user) {
        return None;
    }
    let mine = groups_of(user);
    if groups.iter().any(|g| mine.contains(g)) {
        return None;
    }
    Some(format!("{user} may not decide this approval (approvers: {})", a.approvers.describe()))
}

impl Api {
    pub(super) async fn approvals(&self) -> Result<Vec<Approval>, RpcError> {
        self.listing.approvals(50).await.map_err(store_err)
    }

    pub(super) async fn decide(&self, p: ApprovalDecide, actor: &str) -> Result<Approval, RpcError> {
        const M: &str = "approvals.decide";
        let reason = p.reason.trim();
        if reason.is_empty() {
            return Err(RpcError::new(
                code::INVALID_PARAMS,
                format!("{M}: a reason is required (it goes to the history and the audit)"),
            ));
        }
        let Some(a) = self.h.store.open_approval(&p.id).await.map_err(store_err)? else {
            // Say what it is instead: decided already, or not waiting at all.
            let inst = self.h.store.get(&p.id).await.map_err(store_err)?;
            return Err(RpcError::new(
                code::INVALID_PARAMS,
                format!("instance {} ({}) waits for no approval", inst.id, inst.state),
            )
            .with_hint("apollo approvals lists those waiting and the latest decided"));
        };
        if let Some(why) = refusal(&a, actor) {
            return Err(RpcError::new(code::FORBIDDEN, format!("{M}: {why}")));
        }
        let decision = if p.deny { "denied" } else { "approved" };
        let done = self.h.store.decide_approval(&a, decision, reason, actor).await.map_err(store_err)?;
        self.h.control.wake();
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_user_is_the_actor_before_its_uid() {
        assert_eq!(super::user_of("alice (uid 1000) via ssh from 10.0.0.7"), "alice");
        assert_eq!(super::user_of("uid 1234"), "uid 1234");
    }
}
