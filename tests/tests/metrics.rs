//! `/metrics` scraped over HTTP during a run: the counters match the
//! instances run, every line parses as Prometheus text exposition, and the
//! same text is available over the socket (`apollo metrics`). `apollo
//! plugins` shows each plugin's recent runs and the timeout they suggest.

use apollo_tests::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::{Read, Write};

fn scrape(port: u16) -> String {
    get(port, "", "content-type: text/plain; version=0.0.4")
}

/// `GET /metrics` with `extra` headers; the body, its head holding `kind`.
fn get(port: u16, extra: &str, kind: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: localhost\r\n{extra}\r\n").as_bytes()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains(kind), "{head}");
    body.to_string()
}

/// The exposition parsed strictly, as Prometheus's text format (0.0.4)
/// has it: every family has HELP then TYPE before its samples; a counter's
/// samples are its name, which ends in `_total`; a histogram's are
/// `_bucket` (with `le`), `_sum` and `_count`; names and label names are
/// valid, label values quoted; no series twice. Returns series → value.
fn parse(text: &str) -> BTreeMap<String, f64> {
    let name_ok = |n: &str| {
        n.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let mut help: BTreeMap<String, String> = BTreeMap::new();
    let mut kind: BTreeMap<String, String> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, h) = rest.split_once(' ').unwrap_or_else(|| panic!("HELP without text: {line}"));
            assert!(name_ok(name) && !h.trim().is_empty(), "bad HELP: {line}");
            assert!(help.insert(name.to_string(), h.to_string()).is_none(), "HELP twice: {line}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, t) = rest.split_once(' ').unwrap_or_else(|| panic!("TYPE without a type: {line}"));
            assert!(help.contains_key(name), "TYPE before HELP: {line}");
            assert!(["counter", "gauge", "histogram"].contains(&t), "unexpected type: {line}");
            assert!(t != "counter" || name.ends_with("_total"), "a counter's name ends in _total: {line}");
            kind.insert(name.to_string(), t.to_string());
            continue;
        }
        assert!(!line.starts_with('#'), "a comment that is not HELP or TYPE: {line}");
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(name_ok(name), "bad metric name: {line}");
        let mut labels = Vec::new();
        if name_end < series.len() {
            let body = series[name_end + 1..].strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels: {line}"));
            for pair in body.split("\",").filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once("=\"").unwrap_or_else(|| panic!("bad label {pair:?}: {line}"));
                assert!(name_ok(k) && !k.contains(':'), "bad label name {k:?}: {line}");
                assert!(!v.trim_end_matches('"').contains('"'), "unescaped quote: {line}");
                labels.push(k.to_string());
            }
        }
        let family = if kind.contains_key(name) {
            name.to_string()
        } else {
            let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
            assert_eq!(kind.get(base).map(String::as_str), Some("histogram"), "a sample of no declared family: {line}");
            assert!(!name.ends_with("_bucket") || labels.contains(&"le".to_string()), "a bucket without le: {line}");
            base.to_string()
        };
        assert!(help.contains_key(&family), "no HELP for {family}: {line}");
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("bad value: {line}"));
        assert!(out.insert(series.to_string(), v).is_none(), "the same series twice: {line}");
    }
    out
}

/// `promtool check metrics`, the linter Prometheus ships: silent on good text.
fn promtool_check(text: &str) {
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): `bash .ci/run` installs Debian's prometheus, which has it")
        });
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics:\n{said}\n{text}");
}

#[tokio::test]
async fn metrics_count_what_ran_and_parse_as_prometheus_text() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let agent = Agent::builder()
        .config(&format!("metrics:\n  listen: 127.0.0.1:{port}\nscheduler:\n  backoff_base: 100ms\n"))
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n  - plugin: sleep\n")
        .task("bad.yaml", "task: bad\non_failure: stop\nsteps:\n  - plugin: shell\n    retry: 1\n    params:\n      command: exit 3\n")
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mut ids = Vec::new();
    for task in ["ok", "ok", "ok", "bad"] {
        ids.push(trigger(&c, task, json!({})).await);
    }
    for id in &ids {
        wait_until(&c, &mut events, id, "the end", ended).await;
    }
    // The executor counts an ending after its write commits, and the
    // instance's end is pushed at that commit: the count may trail the event
    // by a moment (seen once in a full run). Scraped until it is there, 5 s
    // at most.
    let counted = r#"apollo_instances_finished_total{task="bad",state="FAILED"}"#;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !scrape(port).contains(counted) && std::time::Instant::now() < until {
        std::thread::yield_now();
    }
    let text = scrape(port);
    let m = parse(&text);
    promtool_check(&text);
    // Prometheus asks for OpenMetrics, and gets it.
    let open = get(port, "Accept: application/openmetrics-text; version=1.0.0\r\n", "application/openmetrics-text");
    assert!(open.ends_with("# EOF\n") && open.contains("# TYPE apollo_reaped counter"), "{open}");
    let get = |k: &str| m.get(k).copied().unwrap_or_else(|| panic!("no {k} in {m:#?}"));
    assert_eq!(get(r#"apollo_instances_created_total{task="ok"}"#), 3.0);
    assert_eq!(get(r#"apollo_instances_finished_total{task="ok",state="SUCCESS"}"#), 3.0);
    assert_eq!(get(r#"apollo_instances_finished_total{task="bad",state="FAILED"}"#), 1.0);
    assert_eq!(get(r#"apollo_retries_total{task="bad"}"#), 1.0);
    assert_eq!(get(r#"apollo_step_duration_seconds_count{plugin="sleep",outcome="success"}"#), 6.0);
    assert_eq!(get(r#"apollo_step_duration_seconds_count{plugin="shell",outcome="failure"}"#), 2.0);
    assert_eq!(get(r#"apollo_queue_pending{queue="default"}"#), 0.0);
    assert!(get("apollo_store_commit_seconds_count") > 0.0);
    assert!(get("apollo_clients_connected") >= 1.0);
    // Each plugin's history: runs, failure rate, p50/p99 and the timeout it suggests.
    let (code, plugins) = agent.cli_json(&["plugins"]);
    assert_eq!(code, 0);
    let stats = |name: &str| plugins.as_array().unwrap().iter().find(|p| p["name"] == name).unwrap()["stats"].clone();
    let sleep = stats("sleep");
    assert_eq!((sleep["runs"].as_u64(), sleep["failure_rate"].as_f64()), (Some(6), Some(0.0)), "{sleep:#}");
    assert!(sleep["p99_secs"].as_f64().unwrap() >= sleep["p50_secs"].as_f64().unwrap());
    assert!(sleep["suggested_timeout_secs"].as_f64().unwrap() >= 1.0);
    // Every attempt is a run: the step and its one retry both failed, as the
    // step-duration metric above counts them.
    let shell = stats("shell");
    assert_eq!((shell["runs"].as_u64(), shell["failure_rate"].as_f64()), (Some(2), Some(1.0)), "{shell:#}");
    assert!(stats("http").is_null(), "a plugin that never ran has no statistics");
    let human = String::from_utf8_lossy(&agent.cli(&["plugins"]).stdout).to_string();
    assert!(human.contains("SUGGESTED"), "{human}");
    // The same over the socket.
    let out = agent.cli(&["metrics"]);
    assert_eq!(out.status.code(), Some(0));
    let over_socket = parse(&String::from_utf8_lossy(&out.stdout));
    promtool_check(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(over_socket[r#"apollo_instances_finished_total{task="ok",state="SUCCESS"}"#], 3.0);
}
