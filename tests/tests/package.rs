//! The Debian package (`packaging/build-deb.sh`, cargo-deb): the binaries,
//! the systemd unit, the default config as a conffile, man pages, shell
//! completions, and a postinst that creates the apollo user. Built here from
//! the test build's binaries (`PROFILE=dev SKIP_BUILD=1`); `.ci/run` installs
//! cargo-deb when it is missing.

use apollo_tests::*;
use std::process::Command;

/// The package, built once for the tests of this file from the test
/// build's binaries.
fn package() -> &'static std::path::Path {
    static DEB: std::sync::OnceLock<(tempfile::TempDir, std::path::PathBuf)> = std::sync::OnceLock::new();
    &DEB.get_or_init(|| {
        bin_dir(); // the binaries it packages
        let out = tempfile::tempdir().unwrap();
        let deb = out.path().join("apollo.deb");
        let built = Command::new(repo().join("packaging/build-deb.sh"))
            .current_dir(repo())
            .env("PROFILE", "dev")
            .env("SKIP_BUILD", "1")
            .args(["--fast", "--output"])
            .arg(&deb)
            .output()
            .expect("run packaging/build-deb.sh");
        assert!(
            built.status.success(),
            "packaging/build-deb.sh failed (needs cargo-deb: cargo install cargo-deb):\n{}{}",
            String::from_utf8_lossy(&built.stdout),
            String::from_utf8_lossy(&built.stderr)
        );
        (out, deb)
    })
    .1
}

#[test]
fn the_package_holds_binaries_unit_config_man_pages_and_completions() {
    let deb = package().to_path_buf();
    let contents = Command::new("dpkg-deb").arg("--contents").arg(&deb).output().expect("dpkg-deb");
    let listing = String::from_utf8_lossy(&contents.stdout);
    for path in [
        "./usr/bin/apollo-agent",
        "./usr/bin/apollo",
        "./usr/bin/apollo-tui",
        "/systemd/system/apollo-agent.service",
        "./etc/apollo/apollo.yaml",
        "./usr/share/man/man1/apollo.1.gz",
        "./usr/share/man/man1/apollo-agent.1.gz",
        "./usr/share/man/man1/apollo-tui.1.gz",
        "./usr/share/bash-completion/completions/apollo",
        "./usr/share/zsh/vendor-completions/_apollo",
        "./usr/share/fish/vendor_completions.d/apollo.fish",
        "./usr/share/bash-completion/completions/apollo-agent",
        "./usr/share/bash-completion/completions/apollo-tui",
        "./usr/share/man/man1/apollo-run.1.gz",
        "./usr/share/man/man1/apollo-agent-check.1.gz",
    ] {
        assert!(listing.lines().any(|l| l.ends_with(path)), "{path} is not in the package:\n{listing}");
    }
    let info = |part: &str| {
        let o = Command::new("dpkg-deb").arg("--info").arg(&deb).arg(part).output().unwrap();
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    assert!(info("conffiles").contains("/etc/apollo/apollo.yaml"));
    assert!(info("postinst").contains("adduser --system"), "the postinst creates the user");
    assert!(info("control").contains("Package: apollo"));
    // The service follows the package where systemd runs, and nothing
    // happens where it does not: enabled and started on install, restarted
    // on upgrade, stopped on removal, its enable link removed on purge.
    let postinst = info("postinst");
    assert!(postinst.contains("deb-systemd-helper enable apollo-agent.service"), "{postinst}");
    assert!(
        postinst.contains("if [ -d /run/systemd/system ]") && postinst.contains("_dh_action=restart"),
        "{postinst}"
    );
    let prerm = info("prerm");
    assert!(
        prerm.contains("[ -d /run/systemd/system ]") && prerm.contains("deb-systemd-invoke stop apollo-agent.service"),
        "{prerm}"
    );
    assert!(info("postrm").contains("deb-systemd-helper purge apollo-agent.service"), "{}", info("postrm"));
    // Every page a page refers to is in the package, and each has its exit
    // statuses and examples.
    let root = tempfile::tempdir().unwrap();
    assert!(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(root.path()).status().unwrap().success());
    let man = root.path().join("usr/share/man/man1");
    let pages: Vec<String> =
        std::fs::read_dir(&man).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    for page in &pages {
        let out = Command::new("gzip").arg("-dc").arg(man.join(page)).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).replace("\\-", "-");
        assert!(text.contains(".SH \"EXIT STATUS\"") && text.contains(".SH EXAMPLES"), "{page} lacks a section");
        for word in text.split_whitespace() {
            if let Some(name) = word.strip_suffix("(1)") {
                assert!(pages.contains(&format!("{name}.1.gz")), "{page} refers to {name}(1), which is not shipped");
            }
        }
    }
}

#[test]
fn lintian_finds_no_error_in_the_package() {
    let out = Command::new("lintian")
        .arg(package())
        .output()
        .unwrap_or_else(|e| panic!("cannot run lintian ({e}): `bash .ci/run` installs it"));
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = said.lines().filter(|l| l.starts_with("E: ")).collect();
    assert!(errors.is_empty(), "lintian:\n{said}");
}

/// What a command run as root printed, and whether it succeeded.
fn sh(cmd: &mut Command) -> (bool, String) {
    let out = cmd.stdin(std::process::Stdio::null()).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

fn dpkg(args: &[&str]) -> String {
    let (ok, said) = sh(Command::new("dpkg").args(args).env("DEBIAN_FRONTEND", "noninteractive"));
    assert!(ok, "dpkg {args:?}:\n{said}");
    assert!(!said.to_lowercase().contains("warning"), "dpkg {args:?} warned:\n{said}");
    said
}

/// The machine as it was: the package purged, the users this test made
/// removed, and the apollo user and group too when the test made them.
struct Leave {
    users: Vec<&'static str>,
    apollo_was_there: bool,
    /// The agent started as the unit would, stopped first.
    agent: Option<std::process::Child>,
}

impl Drop for Leave {
    fn drop(&mut self) {
        if let Some(mut a) = self.agent.take() {
            let _ = a.kill();
            let _ = a.wait();
        }
        let _ = sh(Command::new("dpkg").args(["--purge", "apollo"]));
        for u in &self.users {
            let _ = sh(Command::new("userdel").arg(u));
        }
        if !self.apollo_was_there {
            let _ = sh(Command::new("userdel").arg("apollo"));
            let _ = sh(Command::new("groupdel").arg("apollo"));
        }
    }
}

/// `apollo ARGS` as `user`, with the groups the system lists for them.
fn apollo_as(user: &str, args: &[&str]) -> (Option<i32>, String) {
    let u = nix::unistd::User::from_name(user).unwrap().unwrap();
    let name = std::ffi::CString::new(user).unwrap();
    let groups: Vec<u32> = nix::unistd::getgrouplist(&name, u.gid).unwrap().iter().map(|g| g.as_raw()).collect();
    let mut cmd = Command::new("/usr/bin/apollo");
    cmd.args(args).current_dir("/").env_clear().env("PATH", "/usr/bin:/bin").env("NO_COLOR", "1");
    use std::os::unix::process::CommandExt;
    let (uid, gid) = (u.uid.as_raw(), u.gid.as_raw());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setresgid(gid, gid, gid) != 0
                || libc::setresuid(uid, uid, uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

/// On this machine (root, a throwaway one in CI): install, use as root, as a
/// member of the socket's group and as a user named in socket.operators,
/// and as a user outside; upgrade; remove; purge. It leaves the machine as
/// it found it.
#[test]
fn the_installed_package_serves_every_operator_and_upgrades_removes_and_purges_cleanly() {
    assert!(
        !sh(Command::new("dpkg").args(["-s", "apollo"])).0,
        "the apollo package is installed on this machine; this test installs and purges it: remove it first"
    );
    let deb = package().display().to_string();
    let apollo_was_there = nix::unistd::User::from_name("apollo").unwrap().is_some();
    let mut leave =
        Leave { users: vec!["apollo-t-member", "apollo-t-named", "apollo-t-outsider"], apollo_was_there, agent: None };
    // Install: no warning (a home that cannot be accessed, say).
    dpkg(&["-i", &deb]);
    assert!(nix::unistd::User::from_name("apollo").unwrap().is_some());
    let readme = std::fs::read_to_string("/etc/apollo/tasks/README").unwrap();
    assert!(readme.contains("/usr/share/doc/apollo/examples/"), "{readme}");
    for file in ["daily_report.yaml", "data/report.csv", "templates/daily_report.html", "plugins/disk_usage.sh"] {
        assert!(std::path::Path::new("/usr/share/doc/apollo/examples").join(file).exists(), "{file} is not shipped");
    }
    // The README's links resolve in the installed docs.
    let shipped = std::fs::read_to_string("/usr/share/doc/apollo/README.md").unwrap();
    for link in shipped.split("](").skip(1).filter_map(|s| s.split(')').next()).filter(|l| l.ends_with(".md")) {
        assert!(
            std::path::Path::new("/usr/share/doc/apollo").join(link).exists(),
            "the README links {link}, not shipped"
        );
    }
    // Operators as the README says: the group, or a name in the config.
    for (user, groups) in [("apollo-t-member", "apollo"), ("apollo-t-named", "apollo"), ("apollo-t-outsider", "")] {
        let mut c = Command::new("useradd");
        c.args(["--no-create-home", "--shell", "/usr/sbin/nologin"]);
        if !groups.is_empty() {
            c.args(["--groups", groups]);
        }
        let (ok, said) = sh(c.arg(user));
        assert!(ok, "useradd {user}: {said}");
    }
    let config = std::fs::read_to_string("/etc/apollo/apollo.yaml").unwrap();
    assert!(config.contains("operators: [\"@apollo\"]"), "the shipped config: {config}");
    // An edited config (kept by the upgrade below): the group observes, one of its members operates.
    let edited = config.replace("operators: [\"@apollo\"]", "operators: [apollo-t-named]\n  observers: [\"@apollo\"]");
    std::fs::write("/etc/apollo/apollo.yaml", &edited).unwrap();
    let (ok, said) = sh(Command::new("sh").args(["-c", "cp -r /usr/share/doc/apollo/examples/. /etc/apollo/tasks/"]));
    assert!(ok, "{said}");
    let log = tempfile::NamedTempFile::new().unwrap();
    let unit = std::path::Path::new("/lib/systemd/system/apollo-agent.service");
    let agent = leave.agent.insert(apollo_tests::service::start_like_the_unit(unit, log.path()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !std::path::Path::new("/run/apollo/agent.sock").exists() || apollo_as("root", &["status"]).0 != Some(0) {
        if let Some(s) = agent.try_wait().unwrap() {
            panic!("the agent exited ({s}):\n{}", std::fs::read_to_string(log.path()).unwrap_or_default());
        }
        assert!(std::time::Instant::now() < deadline, "{}", std::fs::read_to_string(log.path()).unwrap_or_default());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let agent_log = || std::fs::read_to_string(log.path()).unwrap_or_default();
    // Root operates; the example runs as the README says.
    let (code, said) = apollo_as("root", &["run", "daily_report", "--wait"]);
    assert_eq!(code, Some(0), "{said}\n{}", agent_log());
    // The Python example runs on the SDK the package installs for /usr/bin/python3.
    let (code, said) = apollo_as("root", &["run", "provision_host", "--wait"]);
    assert_eq!(code, Some(0), "{said}\n{}", agent_log());
    // A member of the group observes (the edited config): reads, and is told it may not change things.
    let (code, said) = apollo_as("apollo-t-member", &["ls"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("daily_report"), "{said}");
    let (code, said) = apollo_as("apollo-t-member", &["run", "daily_report"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("needs the operator role") && said.contains("apollo-t-member"), "{said}");
    // The one named in socket.operators operates.
    let (code, said) = apollo_as("apollo-t-named", &["run", "daily_report", "--wait"]);
    assert_eq!(code, Some(0), "{said}");
    // Outside the group: refused, and told why.
    let (code, said) = apollo_as("apollo-t-outsider", &["status"]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("permission denied") && said.contains("group apollo"), "{said}");
    assert!(said.contains("sudo usermod -aG apollo apollo-t-outsider`, then log in again"), "{said}");
    let mut agent = leave.agent.take().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    agent.wait().unwrap();
    // Upgrade (the same package again): no conffile question, the edited config kept.
    let said = dpkg(&["-i", &deb]);
    assert!(!said.contains("Configuration file"), "{said}");
    assert_eq!(std::fs::read_to_string("/etc/apollo/apollo.yaml").unwrap(), edited);
    // Remove: the binaries go, the data, logs, config and definitions stay.
    dpkg(&["-r", "apollo"]);
    assert!(!std::path::Path::new("/usr/bin/apollo-agent").exists());
    for kept in ["/var/lib/apollo/apollo.db", "/etc/apollo/apollo.yaml", "/etc/apollo/tasks/daily_report.yaml"] {
        assert!(std::path::Path::new(kept).exists(), "{kept} is kept on remove");
    }
    // Purge: nothing but the user.
    dpkg(&["-P", "apollo"]);
    for gone in ["/etc/apollo", "/var/lib/apollo", "/var/log/apollo"] {
        assert!(!std::path::Path::new(gone).exists(), "{gone} is left after purge");
    }
    assert!(nix::unistd::User::from_name("apollo").unwrap().is_some(), "the user stays, as Debian keeps system users");
}
