//! The connection to PostgreSQL: cut under load and restored, unreachable
//! at a wake-up, listings read from a replica, TLS asked for by the URL.

use crate::postgres::witness_lines;
use apollo_tests::*;
use serde_json::json;
use std::collections::BTreeSet;
use std::path::Path;

/// A proxy in front of the test PostgreSQL, and the URL through it.
fn pg_proxy() -> (Proxy, String) {
    let url = pg_url();
    let cfg: postgres::Config = url.parse().unwrap();
    let host = match &cfg.get_hosts()[0] {
        postgres::config::Host::Tcp(h) => h.clone(),
        other => panic!("this test needs PostgreSQL over TCP, not {other:?} ({url})"),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let server = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port)).unwrap().next().unwrap();
    let proxy = Proxy::start(server);
    let through = url.replacen(&format!(":{port}/"), &format!(":{}/", proxy.port), 1);
    assert_ne!(through, url, "the test URL names its port ({url})");
    (proxy, through)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_loses_nothing_and_the_agent_recovers_on_its_own() {
    let schema = PgSchema::new("cut");
    let (proxy, url) = pg_proxy();
    let shared = tempfile::tempdir().unwrap();
    let witness = shared.path().join("witness");
    let step = format!(
        "  - plugin: shell\n    params:\n      command: sleep 0.1; echo \"$APOLLO_IDEMPOTENCY_KEY\" >> {}\n",
        witness.display()
    );
    let agent = Agent::builder()
        .config(&format!("database:\n  url: {url}\n  schema: {}\nscheduler:\n  concurrency: 8\n", schema.name))
        .task("w.yaml", &format!("task: w\nsteps:\n{step}{step}"))
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks, Topic::Alerts]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mut ids = Vec::new();
    for _ in 0..40 {
        ids.push(trigger(&c, "w", json!({})).await);
    }
    wait_until(&c, &mut events, &ids[5], "some work to be done", ended).await;

    proxy.cut();
    wait_event(&mut events, "the store_unwritable alert", |e| e.data.json()["kind"] == "store_unwritable").await;
    let status = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
    assert!(
        status.store_error.as_deref().is_some_and(|e| e.contains("cannot be reached") || e.contains("cannot be read")),
        "the status says the store is unreachable: {status:?}"
    );
    proxy.restore();
    wait_event(&mut events, "the store_writable alert", |e| e.data.json()["kind"] == "store_writable").await;
    for id in &ids {
        let done = wait_until(&c, &mut events, id, "every instance to finish", ended).await;
        assert_eq!(done.state.as_str(), "SUCCESS", "{done:?}");
    }
    let lines = witness_lines(&witness);
    let unique: BTreeSet<&String> = lines.iter().collect();
    assert_eq!(unique.len(), 80, "every step ran");
    let status = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
    assert!(status.store_error.is_none(), "{status:?}");
    let alerts = agent.cli_json(&["alerts"]).1;
    let kinds: Vec<&str> = alerts.as_array().unwrap().iter().filter_map(|a| a["kind"].as_str()).collect();
    assert!(kinds.contains(&"store_unwritable") && kinds.contains(&"store_writable"), "{alerts:#}");
}

/// While PostgreSQL cannot be reached, the schedule's state is not read
/// again at every wake-up (a reload, a clock jump) and the failure is
/// logged once, not once a wake-up; its end is logged once too.
#[test]
fn an_unreachable_store_is_logged_once_and_the_schedule_reader_backs_off() {
    let schema = PgSchema::new("quiet");
    let (proxy, url) = pg_proxy();
    let agent = Agent::builder()
        .config(&format!("database:\n  url: {url}\n  schema: {}\n", schema.name))
        .task("tick.yaml", "task: tick\nschedule: \"0 3 * * *\"\nsteps:\n  - plugin: sleep\n")
        .start();
    let schedule_errors = |log: &str| log.lines().filter(|l| l.contains("cannot read the schedule state")).count();
    let hup =
        || nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.pid()), nix::sys::signal::Signal::SIGHUP).unwrap();
    proxy.cut();
    // Reloads wake the schedule runner until it has met the outage (its
    // read may wait out a connection attempt first, longer on a busy
    // machine); then twenty more in two seconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !agent.log().contains("cannot read the schedule state") {
        assert!(std::time::Instant::now() < deadline, "the outage is not logged:\n{}", agent.log());
        hup();
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for _ in 0..20 {
        hup();
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let log = agent.log();
    assert!(schedule_errors(&log) <= 2, "logged {} times:\n{log}", schedule_errors(&log));
    proxy.restore();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !agent.log().contains("cannot read the schedule state: works again, after") {
        assert!(std::time::Instant::now() < deadline, "the end of the outage is not logged:\n{}", agent.log());
        hup();
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(schedule_errors(&agent.log()) <= 3, "{}", agent.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_read_from_the_replica_and_the_agent_from_the_primary() {
    let schema = PgSchema::new("replica");
    // The "replica" is the same server behind a proxy the test can cut.
    let (replica, read_url) = pg_proxy();
    let agent = Agent::builder()
        .config(&format!("{}  read_url: {read_url}\n", schema.config()))
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")
        .start();
    let (code, first) = agent.cli_json(&["run", "ok", "--wait"]);
    assert_eq!(code, 0, "{first}");
    let (code, listed) = agent.cli_json(&["ls"]);
    assert_eq!((code, listed.as_array().map(Vec::len)), (0, Some(1)), "{listed}");
    replica.cut();
    // The agent's own work reads the primary: it goes on.
    let (code, second) = agent.cli_json(&["run", "ok", "--wait"]);
    assert_eq!((code, second["state"].as_str()), (0, Some("SUCCESS")), "{second}");
    // Listings read the replica: they fail, saying so.
    let out = agent.cli(&["ls"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("database error"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    replica.restore();
    let (code, listed) = agent.cli_json(&["ls"]);
    assert_eq!((code, listed.as_array().map(Vec::len)), (0, Some(2)), "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_used_when_the_url_asks_and_an_untrusted_server_is_refused() {
    // The machine's server presents Debian's self-signed certificate for localhost.
    const CERT: &str = "/etc/ssl/certs/ssl-cert-snakeoil.pem";
    assert!(Path::new(CERT).exists(), "{CERT} is missing: the test PostgreSQL's certificate");
    let schema = PgSchema::new("tls");
    let url = pg_url().replacen("127.0.0.1", "localhost", 1);
    let sep = if url.contains('?') { '&' } else { '?' };
    let config = |ca: &str| format!("database:\n  url: {url}{sep}sslmode=require\n  schema: {}\n{ca}", schema.name);
    let agent = Agent::builder()
        .config(&config(&format!("  ca_file: {CERT}\n")))
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")
        .start();
    let (code, inst) = agent.cli_json(&["run", "ok", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (0, Some("SUCCESS")), "{inst}");
    drop(agent);
    // Without the certificate's issuer trusted, the agent refuses to start, saying why.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("apollo.yaml"), config("")).unwrap();
    std::fs::create_dir(dir.path().join("tasks")).unwrap();
    let out = std::process::Command::new(agent_bin())
        .current_dir(dir.path())
        .args(["--data-dir", "data", "--socket", "agent.sock"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("TLS handshake") && err.contains("UnknownIssuer"), "{err}");
}
