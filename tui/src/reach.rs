//! Why a socket could not be reached, in words an operator acts on: no
//! socket there (no agent runs with it), permission denied (which directory
//! or socket, its group, and whether logging in again would help), or
//! nobody answering (a stale socket of a stopped agent).

use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One socket tried and why it failed.
pub fn why_not(path: &Path, err: &std::io::Error) -> String {
    let at = path.display();
    match err.kind() {
        ErrorKind::NotFound => format!("{at}: no such socket (no agent runs with it)"),
        ErrorKind::PermissionDenied => denied(path),
        ErrorKind::ConnectionRefused => format!(
            "{at}: the socket is there but no agent answers (connection refused): the agent has stopped; \
             start it (`systemctl start apollo-agent`, or `apollo-agent` in its directory)"
        ),
        _ => format!("{at}: {err}"),
    }
}

/// The first part of `path` the user may not pass (a directory it cannot
/// enter, or the socket it cannot write), with its owner, group and mode.
fn denied(path: &Path) -> String {
    use nix::unistd::{access, AccessFlags};
    let mut parts: Vec<PathBuf> =
        path.ancestors().skip(1).filter(|p| !p.as_os_str().is_empty()).map(Path::to_path_buf).collect();
    parts.reverse();
    let blocking = parts
        .iter()
        .map(|p| (p.clone(), AccessFlags::X_OK))
        .chain([(path.to_path_buf(), AccessFlags::R_OK | AccessFlags::W_OK)])
        .find(|(p, how)| access(p, *how).is_err());
    let user = nix::unistd::User::from_uid(nix::unistd::getuid()).ok().flatten().map(|u| u.name);
    let user = user.unwrap_or_else(|| nix::unistd::getuid().to_string());
    let Some((p, _)) = blocking else {
        return format!("{}: permission denied", path.display());
    };
    let Ok(meta) = std::fs::metadata(&p) else {
        return format!("{}: permission denied", path.display());
    };
    let group = nix::unistd::Group::from_gid(meta.gid().into()).ok().flatten();
    let group_name = group.as_ref().map(|g| g.name.clone()).unwrap_or_else(|| meta.gid().to_string());
    let what = if p == path { "the socket" } else { "the directory" };
    let mut msg = format!(
        "{}: permission denied: {user} may not use {what} {} (mode {:04o}, group {group_name})",
        path.display(),
        p.display(),
        meta.mode() & 0o7777
    );
    let listed = group.as_ref().is_some_and(|g| g.mem.contains(&user));
    let in_session = nix::unistd::getgroups().is_ok_and(|gs| gs.iter().any(|g| g.as_raw() == meta.gid()));
    if listed && !in_session {
        msg.push_str(&format!(
            "; {user} is in group {group_name} now, but this login began before: log in again after usermod (or run `newgrp {group_name}`)"
        ));
    } else if !in_session {
        msg.push_str(&format!(
            "; operators are members of group {group_name}: `sudo usermod -aG {group_name} {user}`, then log in again"
        ));
    }
    msg
}

/// The message of a failed default connection: every socket tried, each
/// with why it failed, and what to do when none is there.
pub fn none_answered(tried: &[(PathBuf, std::io::Error)]) -> String {
    if tried.iter().all(|(_, e)| e.kind() == ErrorKind::NotFound) {
        let paths: Vec<String> = tried.iter().map(|(p, _)| p.display().to_string()).collect();
        return format!(
            "no agent is listening (no socket at {}); start one with `apollo-agent` in the project directory, \
             pass --socket PATH, or use --local to start one for this command",
            paths.join(", ")
        );
    }
    // The sockets that exist say more than the ones that do not.
    let reasons: Vec<String> =
        tried.iter().filter(|(_, e)| e.kind() != ErrorKind::NotFound).map(|(p, e)| why_not(p, e)).collect();
    format!("cannot reach the agent: {}", reasons.join("; "))
}
