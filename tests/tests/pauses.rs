//! Pauses and freeze windows: nothing new is claimed in their scope
//! (running instances go on; what triggers and schedules create waits),
//! they survive a restart, end by hand or by themselves, are audited, hold
//! across agents on PostgreSQL, and say so in `status`, `queues`, `pauses`,
//! `ls` and `show`.

use apollo_shared::protocol::Instance;
use apollo_shared::state::TaskState;
use apollo_tests::*;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use std::time::Duration;

const DEPLOY: &str =
    "task: deploy\nqueue: deploys\nsteps:\n  - plugin: shell\n    params: {command: 'echo deployed'}\n";
const REPORT: &str =
    "task: report\nqueue: reports\nsteps:\n  - plugin: shell\n    params: {command: 'echo reported'}\n";

fn text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn success(i: &Instance) -> bool {
    i.state == TaskState::Success
}

/// `apollo audit` as JSON rows for this pause id.
fn audit_of(agent: &Agent, id: &str) -> Vec<Value> {
    let (_, rows) = agent.cli_json(&["audit", "--limit", "200"]);
    rows.as_array().unwrap().iter().filter(|r| r["instance"] == id).cloned().collect()
}

#[tokio::test]
async fn a_paused_queue_claims_nothing_across_a_restart_until_resumed_and_the_rest_runs() {
    let mut agent = Agent::builder().task("deploy.yaml", DEPLOY).task("report.yaml", REPORT).start();
    let out = agent.cli(&["pause", "--queue", "deploy", "--reason", "typo"]);
    assert!(!out.status.success() && text(&out).contains("did you mean \"deploys\"?"), "{}", text(&out));
    let out = agent.cli(&["pause", "--queue", "deploys", "--reason", "incident 42"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("queue deploys paused (pause-"), "{}", text(&out));

    let (c, mut events) = agent.watch().await;
    let deploy = trigger(&c, "deploy", json!({})).await;
    let report = trigger(&c, "report", json!({})).await;
    // The other queue runs; the paused one waits and says why.
    wait_until(&c, &mut events, &report, "the report", success).await;
    let waiting = get(&c, &deploy).await;
    assert_eq!(waiting.state, TaskState::Pending, "{waiting:?}");
    let why = waiting.waiting.clone().unwrap_or_default();
    assert!(why.contains("queue deploys: paused by") && why.ends_with(": incident 42"), "{why}");
    let shown = text(&agent.cli(&["show", &deploy]));
    assert!(shown.contains("queue deploys: paused by"), "{shown}");
    let status = text(&agent.cli(&["status"]));
    assert!(status.contains("PAUSED  queue deploys: paused by") && status.contains("incident 42"), "{status}");
    let queues = text(&agent.cli(&["queues"]));
    let line = queues.lines().find(|l| l.starts_with("deploys")).unwrap_or_default();
    assert!(line.contains("PAUSED queue deploys"), "{queues}");
    assert!(!queues.lines().find(|l| l.starts_with("reports")).unwrap_or_default().contains("PAUSED"), "{queues}");
    drop(c);

    // A restart keeps the pause.
    agent.stop();
    agent.spawn();
    let (c, mut events) = agent.watch().await;
    let again = trigger(&c, "report", json!({})).await;
    wait_until(&c, &mut events, &again, "the report after the restart", success).await;
    assert_eq!(get(&c, &deploy).await.state, TaskState::Pending);
    let (_, pauses) = agent.cli_json(&["pauses"]);
    let id = pauses[0]["id"].as_str().expect("the pause is listed").to_string();
    assert_eq!((pauses[0]["scope"].as_str(), pauses[0]["target"].as_str()), (Some("queue"), Some("deploys")));

    let out = agent.cli(&["resume", "--task", "deploy", "--reason", "wrong scope"]);
    assert!(!out.status.success() && text(&out).contains("no pause of task deploy is in force"), "{}", text(&out));
    let out = agent.cli(&["resume", "--queue", "deploys", "--reason", "incident over"]);
    assert!(out.status.success() && text(&out).contains("queue deploys resumed"), "{}", text(&out));
    wait_until(&c, &mut events, &deploy, "the deploy after the resume", success).await;
    assert!(text(&agent.cli(&["pauses"])).contains("nothing is paused"));

    let rows = audit_of(&agent, &id);
    let moves: Vec<(&str, &str)> =
        rows.iter().map(|r| (r["to"].as_str().unwrap_or(""), r["reason"].as_str().unwrap_or(""))).collect();
    assert!(moves.contains(&("paused", "queue deploys paused: incident 42")), "{rows:#?}");
    assert!(moves.contains(&("resumed", "queue deploys resumed: incident over")), "{rows:#?}");
    assert!(rows.iter().all(|r| !r["actor"].as_str().unwrap_or("").is_empty()), "{rows:#?}");
}

#[tokio::test]
async fn a_pause_until_ends_by_itself_and_a_schedule_firing_during_it_creates_its_instance_which_runs_after() {
    let tick = "task: tick\nschedule: '* * * * * *'\nsteps:\n  - plugin: shell\n    params: {command: 'echo tick'}\n";
    bin_dir();
    let agent = Agent::builder().config("scheduler:\n  lease: 3s\n").task("tick.yaml", tick).start();
    let until = (Utc::now() + chrono::Duration::seconds(6)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let out = agent.cli(&["pause", "--all", "--until", &until, "--reason", "change freeze"]);
    assert!(out.status.success() && text(&out).contains("it resumes by itself at"), "{}", text(&out));
    // In force from here (a fire in the same second may have come first).
    let paused = Utc::now();
    let until: DateTime<Utc> = until.parse().unwrap();
    let (c, mut events) = agent.watch().await;
    // The first instance the schedule creates during the pause…
    let first = loop {
        let (_, listed) = agent.cli_json(&["ls", "--task", "tick"]);
        let during = |i: &&serde_json::Value| {
            i["created_at"].as_str().and_then(|t| t.parse::<DateTime<Utc>>().ok()) > Some(paused)
        };
        let mut ids: Vec<String> = listed
            .as_array()
            .unwrap()
            .iter()
            .filter(during)
            .filter_map(|i| i["id"].as_str().map(str::to_string))
            .collect();
        ids.sort();
        if let Some(id) = ids.first() {
            break id.clone();
        }
        wait_event(&mut events, "a scheduled instance", |_| true).await;
    };
    let inst = get(&c, &first).await;
    assert!(inst.created_at < until, "{inst:?}");
    // …runs once the pause ends by itself, not before.
    let done = wait_until(&c, &mut events, &first, "the scheduled instance", success).await;
    assert!(done.started_at.unwrap() >= until, "started {:?} before {until}", done.started_at);
    // The end is recorded (by the maintenance tick) and audited.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, audit) = agent.cli_json(&["audit", "--limit", "500"]);
        let ended = audit.as_array().unwrap().iter().any(|r| {
            r["to"] == "resumed" && r["actor"] == "schedule" && r["reason"].as_str().unwrap_or("").contains("reached")
        });
        if ended {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no resumed row: {audit:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(text(&agent.cli(&["pauses"])).contains("nothing is paused"));
}

#[tokio::test]
async fn a_freeze_window_holds_its_queue_and_lets_it_go_when_it_closes() {
    // The binaries first (a build would eat the window).
    bin_dir();
    let (from, until) = (Utc::now() - chrono::Duration::seconds(1), Utc::now() + chrono::Duration::seconds(6));
    let stamp = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let conf = format!(
        "scheduler:\n  freezes:\n    - name: year-end\n      from: {}\n      until: {}\n      queues: [deploys]\n      \
         reason: no deploys over the holidays\n",
        stamp(from),
        stamp(until)
    );
    let agent = Agent::builder().config(&conf).task("deploy.yaml", DEPLOY).task("report.yaml", REPORT).start();
    let status = text(&agent.cli(&["status"]));
    assert!(status.contains("queue deploys: freeze window year-end since"), "{status}");
    assert!(status.contains("no deploys over the holidays"), "{status}");
    let (c, mut events) = agent.watch().await;
    let deploy = trigger(&c, "deploy", json!({})).await;
    let report = trigger(&c, "report", json!({})).await;
    wait_until(&c, &mut events, &report, "the report", success).await;
    let waiting = get(&c, &deploy).await;
    assert!(Utc::now() < until, "the machine was too slow for this test's window");
    assert_eq!(waiting.state, TaskState::Pending, "{waiting:?}");
    assert!(waiting.waiting.unwrap_or_default().contains("freeze window year-end"));
    // An operator cannot resume a window: it says what it is.
    let out = agent.cli(&["resume", "--queue", "deploys", "--reason", "now"]);
    assert!(!out.status.success() && text(&out).contains("a freeze window ends with its window"), "{}", text(&out));
    let done = wait_until(&c, &mut events, &deploy, "the deploy after the window", success).await;
    assert!(done.started_at.unwrap() >= until, "started {:?} before {until}", done.started_at);
}

#[test]
fn a_bad_freeze_window_is_named_by_check() {
    let conf = "scheduler:\n  freezes:\n    - name: weekend\n      cron: '0 18 * * FRY'\n      duration: 60h\n      \
                reason: weekend\n    - name: both\n      from: 2026-12-20T00:00:00Z\n      cron: '0 0 * * *'\n      \
                reason: x\n";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("apollo.yaml"), conf).unwrap();
    let out = std::process::Command::new(agent_bin())
        .current_dir(dir.path())
        .args(["check", "--config", "apollo.yaml"])
        .output()
        .unwrap();
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("scheduler.freezes[0] (weekend).cron:") && said.contains("day of week"), "{said}");
    assert!(said.contains("scheduler.freezes[1] (both): give either from and until"), "{said}");
}

#[tokio::test]
async fn on_postgresql_a_pause_through_one_agent_holds_on_the_other_and_a_resume_there_lets_it_claim() {
    let schema = PgSchema::new("pauses");
    let start = |name: &str| {
        let conf = format!("{}agent:\n  name: {name}\nscheduler:\n  lease: 2s\n", schema.config());
        Agent::builder().config(&conf).task("deploy.yaml", DEPLOY).task("report.yaml", REPORT).start()
    };
    let a = start("a");
    let b = start("b");
    let out = a.cli(&["pause", "--task", "deploy", "--reason", "db failover"]);
    assert!(out.status.success(), "{}", text(&out));
    // Created through b, which did not pause: b claims nothing of it either.
    let (c, mut events) = b.watch().await;
    let ids: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(trigger(&c, "deploy", json!({})).await);
        }
        v
    };
    let report = trigger(&c, "report", json!({})).await;
    wait_until(&c, &mut events, &report, "the report", success).await;
    for id in &ids {
        let i = get(&c, id).await;
        assert_eq!(i.state, TaskState::Pending, "{i:?}\n{}\n{}", a.log(), b.log());
    }
    let status = text(&b.cli(&["status"]));
    assert!(status.contains("task deploy: paused by"), "{status}");
    let out = b.cli(&["resume", "--task", "deploy", "--reason", "failover done"]);
    assert!(out.status.success(), "{}", text(&out));
    for id in &ids {
        wait_until(&c, &mut events, id, "a deploy after the resume", success).await;
    }
}
