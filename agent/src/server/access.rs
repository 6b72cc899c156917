//! Who may do what on the socket: roles from the peer's uid and groups.

use apollo_shared::protocol::Role;

/// Who may do what: the agent's own user and root operate; the config names
/// other operators and observers, as users (names or uids) or groups
/// (`@name` or `@gid`); anyone else is refused.
pub struct Access {
    own_uid: u32,
    /// Who operates and who observes; SIGHUP sets them anew.
    roles: std::sync::RwLock<(Members, Members)>,
}

/// The users and groups one role names.
#[derive(Default, Debug, PartialEq)]
struct Members {
    uids: Vec<u32>,
    gids: Vec<u32>,
}

impl Members {
    fn has(&self, uid: u32, groups: &[u32]) -> bool {
        self.uids.contains(&uid) || groups.iter().any(|g| self.gids.contains(g))
    }
}

/// A user's uid from its name or number.
pub fn uid_of(name: &str) -> Option<u32> {
    name.parse().ok().or_else(|| nix::unistd::User::from_name(name).ok().flatten().map(|u| u.uid.as_raw()))
}

/// A group's gid from its name or number (written without its `@`).
pub fn gid_of(name: &str) -> Option<u32> {
    name.parse().ok().or_else(|| nix::unistd::Group::from_name(name).ok().flatten().map(|g| g.gid.as_raw()))
}

/// The groups of the process at the other end of `fd` (SO_PEERGROUPS: the
/// groups it connected with, supplementary ones included), else the groups
/// the system lists for `uid` with its primary group `gid`.
pub fn peer_groups(fd: std::os::fd::RawFd, uid: u32, gid: u32) -> Vec<u32> {
    let mut buf = vec![0u32; 256];
    let mut len = (buf.len() * std::mem::size_of::<u32>()) as libc::socklen_t;
    // SAFETY: the buffer is as long as `len` says; the kernel writes at most that.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERGROUPS, buf.as_mut_ptr().cast(), &mut len) };
    if r == 0 {
        buf.truncate(len as usize / std::mem::size_of::<u32>());
        buf.push(gid);
        return buf;
    }
    let user = nix::unistd::User::from_uid(uid.into()).ok().flatten();
    let listed = user
        .and_then(|u| std::ffi::CString::new(u.name).ok())
        .and_then(|name| nix::unistd::getgrouplist(&name, gid.into()).ok())
        .map(|gs| gs.iter().map(|g| g.as_raw()).collect::<Vec<_>>());
    listed.unwrap_or_else(|| vec![gid])
}

impl Access {
    pub fn new(socket: &crate::config::Socket) -> Access {
        let access = Access { own_uid: nix::unistd::getuid().as_raw(), roles: Default::default() };
        access.set(socket);
        access
    }

    /// Resolves the configured names to uids and gids and puts them in
    /// force (`check` refuses names that do not exist; one gone since is
    /// logged and left out).
    pub fn set(&self, socket: &crate::config::Socket) {
        let resolve = |names: &[String]| {
            let mut m = Members::default();
            for n in names {
                match n.strip_prefix('@') {
                    Some(g) => match gid_of(g) {
                        Some(gid) => m.gids.push(gid),
                        None => tracing::warn!(group = %g, "socket access: unknown group, ignored"),
                    },
                    None => match uid_of(n) {
                        Some(uid) => m.uids.push(uid),
                        None => tracing::warn!(user = %n, "socket access: unknown user, ignored"),
                    },
                }
            }
            m
        };
        *self.roles.write().expect("roles") = (resolve(&socket.operators), resolve(&socket.observers));
    }

    /// The role of a peer with this uid and these groups.
    pub fn role(&self, uid: u32, groups: &[u32]) -> Option<Role> {
        let (operators, observers) = &*self.roles.read().expect("roles");
        if uid == 0 || uid == self.own_uid || operators.has(uid, groups) {
            Some(Role::Operator)
        } else if observers.has(uid, groups) {
            Some(Role::Observer)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_set_again_take_effect() {
        let socket = |operators: &[&str], observers: &[&str]| crate::config::Socket {
            path: None,
            operators: operators.iter().map(|s| s.to_string()).collect(),
            observers: observers.iter().map(|s| s.to_string()).collect(),
        };
        let access = Access::new(&socket(&[], &["4242"]));
        assert_eq!(access.role(4242, &[]), Some(Role::Observer));
        access.set(&socket(&["4242"], &[]));
        assert_eq!(access.role(4242, &[]), Some(Role::Operator));
        access.set(&socket(&[], &[]));
        assert_eq!(access.role(4242, &[]), None);
        // Groups, by gid or name: a member has the role, others not.
        access.set(&socket(&["@4300"], &["@root"]));
        assert_eq!(access.role(4242, &[100, 4300]), Some(Role::Operator));
        assert_eq!(access.role(4242, &[0]), Some(Role::Observer));
        assert_eq!(access.role(4242, &[100]), None);
    }
}
