//! The Debian package (`packaging/build-deb.sh`, cargo-deb): the binaries,
//! the systemd unit, the default config as a conffile, man pages, shell
//! completions, and a postinst that creates the apollo user. Built here from
//! the test build's binaries (`PROFILE=dev SKIP_BUILD=1`); `.ci/run` installs
//! cargo-deb when it is missing.

use apollo_tests::*;
use std::process::Command;

#[test]
fn the_package_holds_binaries_unit_config_man_pages_and_completions() {
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
    let contents = Command::new("dpkg-deb").arg("--contents").arg(&deb).output().expect("dpkg-deb");
    let listing = String::from_utf8_lossy(&contents.stdout);
    for path in [
        "./usr/bin/apollo-agent",
        "./usr/bin/apollo",
        "./usr/bin/apollo-tui",
        "./lib/systemd/system/apollo-agent.service",
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
