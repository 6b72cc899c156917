//! Work that arrives from outside: NATS JetStream messages and webhooks
//! (JSON events and Alertmanager notifications) start the same task as
//! `apollo emit` does, exactly once.
//!
//! The NATS tests use the server at 127.0.0.1:4222 (`APOLLO_TEST_NATS_URL`
//! points them elsewhere); each makes its own stream and deletes it.

use apollo_tests::*;
use serde_json::{json, Value};
use std::time::Duration;

/// The task every source starts: it appends the event's host to a witness.
const REMEDIATE: &str = r#"task: remediate
on_event: DiskFull
steps:
  - plugin: shell
    params:
      command: echo "{% if event.host is defined %}{{ event.host }}{% else %}{{ event.labels.host }}{% endif %}" >> ../../witness
"#;

fn nats_url() -> String {
    std::env::var("APOLLO_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// A JetStream stream of the test's own, deleted when dropped.
struct TestStream {
    name: String,
    prefix: String,
    js: async_nats::jetstream::Context,
}

impl TestStream {
    async fn new(test: &str) -> TestStream {
        let url = nats_url();
        let client = async_nats::connect(&url).await.unwrap_or_else(|e| {
            panic!("NATS is not reachable at {url} ({e}); start it, or set APOLLO_TEST_NATS_URL to a server with JetStream")
        });
        let js = async_nats::jetstream::new(client);
        let tag = format!("{test}{}", std::process::id());
        let (name, prefix) = (format!("APOLLO_{}", tag.to_uppercase()), format!("apollo{tag}"));
        let _ = js.delete_stream(&name).await;
        js.create_stream(async_nats::jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("{prefix}.>")],
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("cannot create a JetStream stream on {url} (is JetStream enabled, -js?): {e}"));
        TestStream { name, prefix, js }
    }

    /// The source's config, reaching NATS at `url`.
    fn config(&self, url: &str) -> String {
        format!(
            "events:\n  sources:\n    - kind: nats\n      url: {url}\n      stream: {}\n      subject: \"{}.>\"\n      \
             name_field: event\n      ack_wait: 1s\n",
            self.name, self.prefix
        )
    }

    async fn publish(&self, payload: &str) {
        self.js.publish(format!("{}.alerts", self.prefix), payload.to_string().into()).await.unwrap().await.unwrap();
    }

    /// Waits until the consumer has every message acknowledged.
    async fn drained(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let mut stream = self.js.get_stream(&self.name).await.unwrap();
            let info = stream.info().await.unwrap().clone();
            let consumer = self
                .js
                .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>("apollo", &self.name);
            if let Ok(mut c) = consumer.await {
                let ci = c.info().await.unwrap();
                if ci.num_ack_pending == 0
                    && ci.num_pending == 0
                    && ci.ack_floor.stream_sequence == info.state.last_sequence
                {
                    return;
                }
            }
            assert!(tokio::time::Instant::now() < deadline, "the consumer did not acknowledge every message in 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for TestStream {
    fn drop(&mut self) {
        let (js, name) = (self.js.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async { js.delete_stream(&name).await })
        })
        .join();
    }
}

fn witness(agent: &Agent) -> Vec<String> {
    let text = std::fs::read_to_string(agent.path().join("data/witness")).unwrap_or_default();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort();
    lines
}

fn instances(agent: &Agent, task: &str) -> Vec<Value> {
    let (code, v) = agent.cli_json(&["ls", "--task", task]);
    assert_eq!(code, 0, "{v:#}");
    v.as_array().cloned().unwrap_or_default()
}

/// Waits (60 s at most), woken by the subscription, until `n` instances of
/// `task` have ended.
async fn ended_count(
    agent: &Agent,
    events: &mut tokio::sync::mpsc::Receiver<apollo_shared::protocol::Event>,
    task: &str,
    n: usize,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let done = instances(agent, task).iter().filter(|i| i["state"] == "SUCCESS").count();
        if done >= n {
            assert_eq!(done, n, "more instances of {task} than expected");
            return;
        }
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(_)) => {}
            _ => panic!("{done} of {n} instances of {task} ended in 60 s:\n{}", agent.log()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_messages_start_work_once_and_bad_ones_are_kept() {
    let stream = TestStream::new("once").await;
    let agent = Agent::builder().config(&stream.config(&nats_url())).task("remediate.yaml", REMEDIATE).start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks, Topic::Alerts]).await.unwrap();
    let mut events = c.take_events().unwrap();
    stream.publish(r#"{"event": "DiskFull", "host": "db1"}"#).await;
    stream.publish(r#"{"event": "DiskFull", "host": "db2"}"#).await;
    stream.publish("not json {").await;
    stream.publish(r#"{"event": "NobodyListens"}"#).await;
    stream.publish(r#"{"host": "no event field"}"#).await;
    // Messages are handled in order: the alert for the last one means all were.
    let last = wait_event(&mut events, "the alert for the message without a name", |e| {
        e.data.json()["kind"] == "event_invalid"
            && e.data.json()["message"].as_str().unwrap_or("").contains("\"event\"")
    })
    .await;
    assert!(last.data.json()["message"].as_str().unwrap().contains("message 5"), "{last:?}");
    ended_count(&agent, &mut events, "remediate", 2).await;
    assert_eq!(witness(&agent), ["db1", "db2"]);
    stream.drained().await;
    // Every message is visible as an event; the two bad ones say why.
    let (_, listed) = agent.cli_json(&["events"]);
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 5, "{listed:#?}");
    let invalid: Vec<&str> = listed.iter().filter_map(|e| e["data"]["invalid"].as_str()).collect();
    assert_eq!(invalid.len(), 2, "{listed:#?}");
    assert!(invalid.iter().any(|w| w.contains("not valid JSON")), "{invalid:?}");
    assert!(listed.iter().any(|e| e["name"] == "NobodyListens" && e["instances"] == json!([])), "{listed:#?}");
    let trigger = instances(&agent, "remediate")[0]["trigger"].as_str().unwrap().to_string();
    assert!(trigger.starts_with("event DiskFull by nats:"), "{trigger}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_before_the_ack_creates_nothing_twice() {
    let stream = TestStream::new("crash").await;
    let mut agent = Agent::builder().config(&stream.config(&nats_url())).task("remediate.yaml", REMEDIATE).start();
    agent.stop();
    // The agent commits the event and its instance, then dies before the ack.
    agent.spawn_with(&[("FAILPOINTS", "nats.before_ack=return")]);
    stream.publish(r#"{"event": "DiskFull", "host": "db1"}"#).await;
    let status = agent.wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "the agent crashed at the fail point:\n{}", agent.log());
    assert!(agent.log().contains("crashing at fail point nats.before_ack"), "{}", agent.log());
    // Restarted, it gets the message again (after ack_wait) and acknowledges it.
    agent.spawn();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    stream.drained().await;
    ended_count(&agent, &mut events, "remediate", 1).await;
    let created = instances(&agent, "remediate");
    assert_eq!(created.len(), 1, "{created:#?}");
    // One instance did the work. A trigger on an idle agent starts the step
    // with the instance's own commit, so the crash may interrupt it (attempt
    // 1, recorded) and the restart runs it again as attempt 2: the step ran
    // at most once per recorded attempt — never a run nobody recorded.
    let (_, inst) = agent.cli_json(&["show", created[0]["id"].as_str().unwrap()]);
    let attempts = inst["steps"][0]["attempts"].as_u64().unwrap() as usize;
    assert!((1..=2).contains(&attempts), "{inst:#}");
    let runs = witness(&agent);
    assert!(!runs.is_empty() && runs.len() <= attempts && runs.iter().all(|r| r == "db1"), "{runs:?}\n{inst:#}");
    let (_, listed) = agent.cli_json(&["events"]);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_raises_an_alert_and_the_backlog_is_read_after() {
    let stream = TestStream::new("cut").await;
    let server = nats_url().trim_start_matches("nats://").to_string();
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&server).unwrap().next().unwrap();
    let proxy = Proxy::start(addr);
    let through = format!("nats://127.0.0.1:{}", proxy.port);
    let agent = Agent::builder().config(&stream.config(&through)).task("remediate.yaml", REMEDIATE).start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks, Topic::Alerts]).await.unwrap();
    let mut events = c.take_events().unwrap();
    stream.publish(r#"{"event": "DiskFull", "host": "before"}"#).await;
    ended_count(&agent, &mut events, "remediate", 1).await;
    proxy.cut();
    wait_event(&mut events, "event_source_down", |e| e.data.json()["kind"] == "event_source_down").await;
    for host in ["during1", "during2", "during3"] {
        stream.publish(&format!(r#"{{"event": "DiskFull", "host": "{host}"}}"#)).await;
    }
    proxy.restore();
    wait_event(&mut events, "event_source_up", |e| e.data.json()["kind"] == "event_source_up").await;
    ended_count(&agent, &mut events, "remediate", 4).await;
    assert_eq!(witness(&agent), ["before", "during1", "during2", "during3"]);
}

/// A free local port for the webhook listener.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alertmanager_and_emit_start_the_same_task_and_bad_requests_are_refused() {
    let port = free_port();
    let agent = Agent::builder()
        .config(&format!(
            "events:\n  http:\n    listen: 127.0.0.1:{port}\n    token_env: APOLLO_TEST_TOKEN\n    max_body: 4096\n"
        ))
        .env("APOLLO_TEST_TOKEN", "s3cret")
        .task("remediate.yaml", REMEDIATE)
        .task("resolved.yaml", "task: all_clear\non_event: DiskFull.resolved\nsteps:\n  - plugin: sleep\n")
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let http = reqwest::Client::new();
    let url = |path: &str| format!("http://127.0.0.1:{port}{path}");
    let alert = |status: &str| {
        json!({
            "version": "4", "status": status, "receiver": "apollo", "groupKey": "{}:{alertname=\"DiskFull\"}",
            "alerts": [{
                "status": status,
                "labels": {"alertname": "DiskFull", "host": "db7", "severity": "page"},
                "annotations": {"summary": "disk 95% full"},
                "startsAt": "2026-11-30T08:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus/graph", "fingerprint": "5f2a"
            }]
        })
    };
    let post = |path: &str, body: Value| http.post(url(path)).bearer_auth("s3cret").json(&body).send();
    // Firing: one instance, with the labels in its context. Alertmanager
    // repeats the notification: nothing more is created.
    let r = post("/alertmanager", alert("firing")).await.unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["events"][0]["instances"].as_array().unwrap().len(), 1, "{body:#}");
    let id = body["events"][0]["instances"][0].as_str().unwrap().to_string();
    let again: Value = post("/alertmanager", alert("firing")).await.unwrap().json().await.unwrap();
    assert_eq!(again["events"][0]["duplicate"], true, "{again:#}");
    let inst = wait_until(&c, &mut events, &id, "the remediation", ended).await;
    assert_eq!(inst.context["event"]["labels"]["severity"], "page");
    assert_eq!(inst.context["event"]["annotations"]["summary"], "disk 95% full");
    // Resolved is an event of its own.
    let resolved: Value = post("/alertmanager", alert("resolved")).await.unwrap().json().await.unwrap();
    assert_eq!(resolved["events"][0]["name"], "DiskFull.resolved");
    assert_eq!(resolved["events"][0]["instances"].as_array().unwrap().len(), 1, "{resolved:#}");
    // A plain JSON event and `apollo emit` start the same task.
    let plain: Value =
        post("/events", json!({"name": "DiskFull", "data": {"host": "web1"}})).await.unwrap().json().await.unwrap();
    assert_eq!(plain["instances"].as_array().unwrap().len(), 1, "{plain:#}");
    let (code, emitted) = agent.cli_json(&["emit", "DiskFull", "--data", r#"{"host": "web2"}"#]);
    assert_eq!((code, emitted["instances"].as_array().unwrap().len()), (0, 1), "{emitted:#}");
    ended_count(&agent, &mut events, "remediate", 3).await;
    assert_eq!(witness(&agent), ["db7", "web1", "web2"]);

    // Refusals, each with a status and a message that says what is wrong.
    let refused = |r: reqwest::Response| async move {
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap()["error"].as_str().unwrap_or_default().to_string())
    };
    let (s, m) = refused(http.post(url("/alertmanager")).json(&alert("firing")).send().await.unwrap()).await;
    assert_eq!(s, 401, "{m}");
    assert!(m.contains("missing bearer token"), "{m}");
    let (s, m) =
        refused(http.post(url("/alertmanager")).bearer_auth("wrong").json(&alert("firing")).send().await.unwrap())
            .await;
    assert_eq!((s, m.as_str()), (403, "wrong bearer token"));
    let big = json!({"name": "DiskFull", "data": {"pad": "x".repeat(5000)}});
    let (s, m) = refused(post("/events", big).await.unwrap()).await;
    assert_eq!(s, 413, "{m}");
    assert!(m.contains("4096 byte limit"), "{m}");
    let (s, m) =
        refused(http.post(url("/events")).bearer_auth("s3cret").body("{\"name\": \"DiskFull\",").send().await.unwrap())
            .await;
    assert_eq!(s, 400, "{m}");
    assert!(m.contains("not valid JSON") && m.contains("line 1"), "{m}");
    let (s, m) = refused(post("/alertmanager", json!({"status": "firing"})).await.unwrap()).await;
    assert_eq!(s, 400, "{m}");
    assert!(m.contains("Alertmanager"), "{m}");
    let (s, m) = refused(http.get(url("/events")).bearer_auth("s3cret").send().await.unwrap()).await;
    assert_eq!(s, 405, "{m}");
    let (s, m) = refused(post("/nowhere", json!({})).await.unwrap()).await;
    assert_eq!(s, 404, "{m}");
    assert!(m.contains("POST /events"), "{m}");
    // Nothing refused created anything.
    assert_eq!(instances(&agent, "remediate").len(), 3);
}
