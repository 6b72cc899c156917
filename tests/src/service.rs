//! Starting the agent exactly as a systemd unit would, where no systemd
//! runs: its `ExecStart=` with its `User=` and `Group=` (and that user's
//! groups), its `UMask=` and `Environment=`, the directories its
//! `RuntimeDirectory=`, `StateDirectory=`, `LogsDirectory=` name (owned by
//! that user, with their modes), and — when it says `PrivateUsers=yes` — in
//! a user namespace that maps root and that user only, as systemd's does.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The `[Service]` settings of a unit file (a key given twice keeps both).
pub fn service_settings(unit: &Path) -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(unit).unwrap_or_else(|e| panic!("{}: {e}", unit.display()));
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut in_service = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
            continue;
        }
        if !in_service || line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            out.entry(k.trim().to_string()).or_default().push(v.trim().to_string());
        }
    }
    out
}

fn ids(user: &str, group: &str) -> (u32, u32, Vec<u32>) {
    let u = nix::unistd::User::from_name(user).unwrap().unwrap_or_else(|| panic!("no user {user}"));
    let g = nix::unistd::Group::from_name(group).unwrap().unwrap_or_else(|| panic!("no group {group}"));
    let name = std::ffi::CString::new(user).unwrap();
    let groups = nix::unistd::getgrouplist(&name, g.gid).unwrap().iter().map(|g| g.as_raw()).collect();
    (u.uid.as_raw(), g.gid.as_raw(), groups)
}

/// Makes `dir` with `mode`, owned by `uid:gid`.
fn make_dir(dir: &Path, uid: u32, gid: u32, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    nix::unistd::chown(dir, Some(uid.into()), Some(gid.into())).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Starts the unit's `ExecStart=` as the unit would; its output goes to
/// `log`.
pub fn start_like_the_unit(unit: &Path, log: &Path) -> Child {
    let s = service_settings(unit);
    let one = |k: &str| s.get(k).and_then(|v| v.last()).cloned();
    let user = one("User").expect("the unit names its User=");
    let group = one("Group").unwrap_or_else(|| user.clone());
    let (uid, gid, groups) = ids(&user, &group);
    let mode = |k: &str, default: u32| one(k).map(|m| u32::from_str_radix(&m, 8).unwrap()).unwrap_or(default);
    for (key, base, mode_key) in [
        ("RuntimeDirectory", "/run", "RuntimeDirectoryMode"),
        ("StateDirectory", "/var/lib", "StateDirectoryMode"),
        ("LogsDirectory", "/var/log", "LogsDirectoryMode"),
    ] {
        if let Some(name) = one(key) {
            make_dir(&Path::new(base).join(name), uid, gid, mode(mode_key, 0o755));
        }
    }
    let exec = one("ExecStart").expect("ExecStart=");
    let mut words = exec.split_whitespace();
    let mut cmd = Command::new(words.next().unwrap());
    cmd.args(words);
    cmd.env_clear().env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    for e in s.get("Environment").into_iter().flatten() {
        for kv in e.split_whitespace() {
            if let Some((k, v)) = kv.split_once('=') {
                cmd.env(k, v);
            }
        }
    }
    let umask = one("UMask").map(|m| u32::from_str_radix(&m, 8).unwrap()).unwrap_or(0o022);
    let private_users = one("PrivateUsers").is_some_and(|v| matches!(v.as_str(), "yes" | "true" | "1"));
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    cmd.stdin(Stdio::null()).stdout(out.try_clone().unwrap()).stderr(out).current_dir("/");
    // The user namespace's maps are written from outside it, by a thread of
    // this process, once the child has entered it: the child says its pid
    // on one pipe and waits on the other.
    let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let (mapped_r, mapped_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    use std::os::fd::IntoRawFd;
    let (ready_r, ready_w, mapped_r, mapped_w) =
        (ready_r.into_raw_fd(), ready_w.into_raw_fd(), mapped_r.into_raw_fd(), mapped_w.into_raw_fd());
    if private_users {
        std::thread::spawn(move || {
            let mut pid = [0u8; 4];
            // SAFETY: plain reads and writes on pipe ends this thread owns.
            unsafe {
                if libc::read(ready_r, pid.as_mut_ptr().cast(), 4) == 4 {
                    let pid = i32::from_ne_bytes(pid);
                    let _ = std::fs::write(format!("/proc/{pid}/uid_map"), format!("0 0 1\n{uid} {uid} 1\n"));
                    let _ = std::fs::write(format!("/proc/{pid}/gid_map"), format!("0 0 1\n{gid} {gid} 1\n"));
                    libc::write(mapped_w, b"m".as_ptr().cast(), 1);
                }
                libc::close(ready_r);
                libc::close(mapped_w);
            }
        });
    }
    let supplementary: Vec<libc::gid_t> = if private_users { vec![gid] } else { groups };
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if private_users {
                if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let pid = libc::getpid().to_ne_bytes();
                libc::write(ready_w, pid.as_ptr().cast(), 4);
                let mut b = [0u8; 1];
                if libc::read(mapped_r, b.as_mut_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::other("the user namespace was not mapped"));
                }
            }
            libc::umask(umask as libc::mode_t);
            if libc::setgroups(supplementary.len(), supplementary.as_ptr()) != 0
                || libc::setresgid(gid, gid, gid) != 0
                || libc::setresuid(uid, uid, uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {exec}: {e}"));
    for fd in [ready_w, mapped_r] {
        // SAFETY: this process's ends of the pipes; the child has its own.
        unsafe { libc::close(fd) };
    }
    if !private_users {
        // SAFETY: the thread that would own them was not started.
        unsafe {
            libc::close(ready_r);
            libc::close(mapped_w);
        }
    }
    child
}
