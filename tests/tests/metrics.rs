//! `/metrics` scraped over HTTP during a run: the counters match the
//! instances run, every line parses as Prometheus text exposition, and the
//! same text is available over the socket (`apollo metrics`). `apollo
//! plugins` shows each plugin's recent runs and the timeout they suggest.

use apollo_tests::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::{Read, Write};

fn scrape(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain"), "{head}");
    body.to_string()
}

/// Every sample line is `name{labels} value`; comments are HELP, TYPE, UNIT or EOF.
fn parse(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(c) = line.strip_prefix("# ") {
            assert!(["HELP ", "TYPE ", "UNIT ", "EOF"].iter().any(|p| c.starts_with(p)), "bad comment: {line}");
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name: {line}"
        );
        if name_end < series.len() {
            assert!(series.ends_with('}'), "unclosed labels: {line}");
        }
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("bad value: {line}"));
        out.insert(series.to_string(), v);
    }
    out
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
    let m = parse(&scrape(port));
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
    assert_eq!(over_socket[r#"apollo_instances_finished_total{task="ok",state="SUCCESS"}"#], 3.0);
}
