//! `s3://` sources against a local S3-compatible server (moto in server
//! mode, checking credentials), and the original design's example as
//! written.
//!
//! moto comes from the virtual environment `.ci/run` makes
//! (`target/test-venv`); `APOLLO_TEST_MOTO` names another `moto_server`.

use apollo_tests::*;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A moto S3 server on a free port, with a user whose key may do s3:*, a
/// bucket named `bucket` and the given objects; stopped when dropped.
struct S3Server {
    child: Child,
    endpoint: String,
    access_key: String,
    secret_key: String,
}

impl S3Server {
    fn start(objects: &[(&str, &std::path::Path)]) -> S3Server {
        let moto = std::env::var_os("APOLLO_TEST_MOTO")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo().join("target/test-venv/bin/moto_server"));
        assert!(
            moto.exists(),
            "{} is missing: `bash .ci/run` installs moto[server] into target/test-venv \
             (or set APOLLO_TEST_MOTO to a moto_server)",
            moto.display()
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(&moto)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            // Three calls (the IAM set-up) pass unchecked; every later one needs a valid key.
            .env("INITIAL_NO_AUTH_ACTION_COUNT", "3")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", moto.display()));
        let endpoint = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto did not listen on {endpoint} in 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        let python = moto.with_file_name("python");
        let mut setup = Command::new(&python);
        setup.arg(repo().join("tests/support/s3_setup.py")).arg(&endpoint).arg("bucket");
        for (key, file) in objects {
            setup.arg(format!("{key}={}", file.display()));
        }
        let out = setup.output().unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
        assert!(out.status.success(), "s3_setup.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let keys: Value = serde_json::from_slice(&out.stdout).unwrap();
        S3Server {
            child,
            endpoint,
            access_key: keys["access_key"].as_str().unwrap().into(),
            secret_key: keys["secret_key"].as_str().unwrap().into(),
        }
    }

    fn config(&self) -> String {
        format!("storage:\n  s3:\n    endpoint: {}\n    region: us-east-1\n    path_style: true\n", self.endpoint)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(agent: &Agent, args: &[&str]) -> Value {
    let mut a = vec!["run"];
    a.extend_from_slice(args);
    a.push("--wait");
    agent.cli_json(&a).1
}

#[test]
fn the_original_example_runs_as_written_against_s3() {
    let csv = repo().join("tasks/data/report.csv");
    let s3 = S3Server::start(&[("report.csv", &csv)]);
    let builder = Agent::builder();
    copy_dir(&repo().join("tasks/original"), &builder.path().join("tasks"));
    let agent = builder
        .config(&s3.config())
        .env("AWS_ACCESS_KEY_ID", &s3.access_key)
        .env("AWS_SECRET_ACCESS_KEY", &s3.secret_key)
        .start();
    let done = run(&agent, &["daily_report"]);
    assert_eq!(done["state"], "SUCCESS", "{done:#}\n{}", agent.log());
    let steps = done["steps"].as_array().unwrap();
    assert_eq!(steps[0]["output"]["path"], "/tmp/report.csv");
    assert_eq!(steps[0]["output"]["bytes"].as_u64(), Some(std::fs::metadata(&csv).unwrap().len()));
    assert_eq!(steps[1]["output"]["rows"], 12, "{done:#}");
    let report = std::fs::read_to_string(steps[2]["output"]["path"].as_str().unwrap()).unwrap();
    assert!(report.contains(r#"<strong id="rows">12</strong>"#), "{report}");
    let _ = std::fs::remove_file("/tmp/report.csv");

    // Unquoted, the comma is refused with its line and the fix.
    let bad = tempfile::tempdir().unwrap();
    let yaml = std::fs::read_to_string(repo().join("tasks/original/daily_report.yaml")).unwrap();
    assert!(yaml.contains("delimiter: \",\""), "the example quotes only the comma:\n{yaml}");
    std::fs::write(bad.path().join("daily_report.yaml"), yaml.replace("delimiter: \",\"", "delimiter: ,")).unwrap();
    let out = Command::new(agent_bin()).arg("--tasks").arg(bad.path()).arg("check").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("daily_report.yaml: line 11") && text.contains(r#"quote it: delimiter: ",""#), "{text}");
}

const FETCH: &str = r#"task: fetch
params:
  source: {required: true}
  target: {required: true}
  md5: {required: true}
steps:
  - plugin: file_downloader
    retry: 0
    params:
      source: "{{ params.source }}"
      target: "{{ params.target }}"
      md5: "{{ params.md5 }}"
"#;

#[test]
fn s3_downloads_verify_skip_and_fail_clearly() {
    let data = tempfile::tempdir().unwrap();
    let file = data.path().join("inventory.json");
    std::fs::write(&file, "[{\"host\": \"db1\"}]\n").unwrap();
    let md5 = format!("{:032x}", md5_of(&std::fs::read(&file).unwrap()));
    let s3 = S3Server::start(&[("dir/inventory.json", &file)]);
    let agent = Agent::builder()
        .config(&s3.config())
        .env("AWS_ACCESS_KEY_ID", &s3.access_key)
        .env("AWS_SECRET_ACCESS_KEY", &s3.secret_key)
        .task("fetch.yaml", FETCH)
        .start();
    let target = agent.path().join("out/inventory.json");
    let target = target.to_str().unwrap();
    let fetch = |source: &str, md5: &str| {
        run(
            &agent,
            &[
                "fetch",
                "-p",
                &format!("source={source}"),
                "-p",
                &format!("target={target}"),
                "-p",
                &format!("md5={md5}"),
            ],
        )
    };
    let first = fetch("s3://bucket/dir/inventory.json", &md5);
    assert_eq!(first["state"], "SUCCESS", "{first:#}\n{}", agent.log());
    assert_eq!(first["steps"][0]["output"]["skipped"], false);
    assert_eq!(std::fs::read(target).unwrap(), std::fs::read(&file).unwrap());
    // Present with the expected checksum: not downloaded again.
    let again = fetch("s3://bucket/dir/inventory.json", &md5);
    assert_eq!(
        (again["state"].as_str(), again["steps"][0]["output"]["skipped"].as_bool()),
        (Some("SUCCESS"), Some(true))
    );
    // A checksum that does not match fails the step and leaves no file.
    std::fs::remove_file(target).unwrap();
    let wrong = fetch("s3://bucket/dir/inventory.json", &"0".repeat(32));
    let error = wrong["steps"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("checksum mismatch"), "{wrong:#}");
    assert!(!std::path::Path::new(target).exists());
    let missing = fetch("s3://bucket/dir/nothing.json", &md5);
    let error = missing["steps"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("s3://bucket/dir/nothing.json: no such object"), "{missing:#}");

    // A key the server does not know.
    let stranger = Agent::builder()
        .config(&s3.config())
        .env("AWS_ACCESS_KEY_ID", "AKIAUNKNOWN000000000")
        .env("AWS_SECRET_ACCESS_KEY", "not-a-secret")
        .task("fetch.yaml", FETCH)
        .start();
    let (_, denied) = stranger.cli_json(&[
        "run",
        "fetch",
        "-p",
        "source=s3://bucket/dir/inventory.json",
        "-p",
        &format!("target={target}"),
        "-p",
        &format!("md5={md5}"),
        "--wait",
    ]);
    let error = denied["steps"][0]["error"].as_str().unwrap_or_default();
    assert_ne!(denied["state"], "SUCCESS", "{denied:#}");
    assert!(error.contains("access denied") && error.contains("AWS_ACCESS_KEY_ID"), "{error}");
    assert!(error.contains("(InvalidAccessKeyId: "), "the server's reason is named: {error}");
}

/// The MD5 digest of `bytes`, by coreutils' md5sum.
fn md5_of(bytes: &[u8]) -> u128 {
    let out = Command::new("md5sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(bytes)?;
            c.wait_with_output()
        })
        .unwrap();
    u128::from_str_radix(String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap(), 16).unwrap()
}

/// An endpoint given only as `AWS_ENDPOINT_URL`, an IP address, with no
/// `storage.s3` at all: it has no bucket subdomains, so requests are
/// path-style (virtual-hosted addressing made object_store panic on the
/// host name `bucket.127.0.0.1`, which stranded the instance).
#[test]
fn an_ip_endpoint_from_the_environment_is_addressed_path_style() {
    let data = tempfile::tempdir().unwrap();
    let file = data.path().join("inventory.json");
    std::fs::write(&file, "[]\n").unwrap();
    let md5 = format!("{:032x}", md5_of(&std::fs::read(&file).unwrap()));
    let s3 = S3Server::start(&[("inventory.json", &file)]);
    let agent = Agent::builder()
        .env("AWS_ENDPOINT_URL", &s3.endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", &s3.access_key)
        .env("AWS_SECRET_ACCESS_KEY", &s3.secret_key)
        .task("fetch.yaml", FETCH)
        .start();
    let target = agent.path().join("inventory.json");
    let out = agent.cli_within(
        &[
            "run",
            "fetch",
            "-p",
            "source=s3://bucket/inventory.json",
            "-p",
            &format!("target={}", target.display()),
            "-p",
            &format!("md5={md5}"),
            "--wait",
            "--json",
        ],
        Duration::from_secs(60),
    );
    let done: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(done["state"], "SUCCESS", "{done:#}\n{}", agent.log());
    assert_eq!(std::fs::read(&target).unwrap(), b"[]\n");
}
