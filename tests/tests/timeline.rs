//! The incident timeline (`apollo timeline`): every event of the instances
//! chosen — step attempts, operators' actions with their reasons, approvals,
//! the pauses that held them, lock waits, rollouts of their plugins, alerts,
//! their children — in time order, as a table, Markdown and JSON.

use apollo_tests::*;
use serde_json::Value;

/// `apollo timeline`: an instance that fails, is retried by an operator with
/// a reason and succeeds, in all three formats; once archived, the same
/// timeline from the archive.
#[tokio::test]
async fn a_timeline_lists_each_attempt_and_the_operators_retry_in_order_in_every_format() {
    let agent = Agent::builder()
        .config("scheduler:\n  retention: 3s\n")
        .task(
            "flaky.yaml",
            "task: flaky\non_failure: stop\nsteps:\n  - name: check\n    plugin: shell\n    retry: 0\n    params:\n      command: test -e ok || { echo 'no ok file' >&2; exit 3; }\n",
        )
        .start();
    let c = agent.client().await;
    c.subscribe(&[apollo_shared::protocol::Topic::Tasks]).await.unwrap();
    let mut pushed = c.take_events().unwrap();
    let (code, inst) = agent.cli_json(&["run", "flaky", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    let id = inst["id"].as_str().unwrap().to_string();
    let work = agent.path().join("data/work").join(&id);
    std::fs::write(work.join("ok"), "").unwrap();
    let (code, _) = agent.cli_json(&["retry", &id, "--wait", "--reason", "created the ok file"]);
    assert_eq!(code, 0);

    let (code, t) = agent.cli_json(&["timeline", &id]);
    assert_eq!(code, 0, "{t:#}");
    let events = t["events"].as_array().unwrap();
    let find = |pred: &dyn Fn(&Value) -> bool, what: &str| {
        events.iter().position(pred).unwrap_or_else(|| panic!("no {what}: {t:#}"))
    };
    let failed = find(&|e| e["kind"] == "step" && e["to"] == "FAILED", "step failure");
    let retry = find(&|e| e["kind"] == "instance" && e["to"] == "RETRYING" && e["operator"] == true, "operator retry");
    let ok = find(&|e| e["kind"] == "step" && e["to"] == "SUCCESS", "step success");
    assert!(failed < retry && retry < ok, "in order: {t:#}");
    let f = &events[failed];
    assert_eq!((f["step"].as_str(), f["from"].as_str()), (Some("check"), Some("RUNNING")), "{f:#}");
    assert!(f["error"].as_str().unwrap().contains("exit code 3"), "{f:#}");
    assert!(f["duration_secs"].as_f64().is_some(), "{f:#}");
    let r = &events[retry];
    assert!(r["reason"].as_str().unwrap().contains("created the ok file"), "{r:#}");
    assert!(r["actor"].as_str().unwrap().ends_with("(uid 0)"), "{r:#}");
    let offsets: Vec<f64> = events.iter().map(|e| e["offset_secs"].as_f64().unwrap()).collect();
    assert!(offsets[0] == 0.0 && offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    assert_eq!(t["instances"][0]["state"], "SUCCESS");

    let human = String::from_utf8_lossy(&agent.cli(&["timeline", &id]).stdout).to_string();
    let lines: Vec<&str> = human.lines().collect();
    let at =
        |needle: &str| lines.iter().position(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle}: {human}"));
    assert!(
        at("check: RUNNING -> FAILED") < at("created the ok file")
            && at("created the ok file") < at("check: RUNNING -> SUCCESS")
    );
    assert!(lines[0].starts_with("+00:00:00  "), "{human}");

    let md = String::from_utf8_lossy(&agent.cli(&["timeline", &id, "--md"]).stdout).to_string();
    for section in [
        "## Timeline",
        "- **Started:** flaky (manual by root",
        "- **Lasted:**",
        "- **Outcome:** flaky",
        "SUCCESS",
        "- **Who acted:** ",
        "| + | UTC | instance | what | detail |",
    ] {
        assert!(md.contains(section), "{section}: {md}");
    }
    assert!(md.contains("created the ok file") && md.contains("check: RUNNING -> FAILED"), "{md}");

    // Unknown ids are named; once archived, the timeline reads the archive.
    let out = agent.cli(&["timeline", "01ZZZZZZZZZZZZZZZZZZZZZZZZ"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no instance 01ZZZZZZZZZZZZZZZZZZZZZZZZ (not among"));
    // One character changed (never to the one it was: a ULID ends in X one time in 32).
    let typo = format!("{}{}", &id[..25], if id.ends_with('X') { 'Y' } else { 'X' });
    let out = agent.cli(&["timeline", &typo]);
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(said.contains(&format!("no instance {typo} (did you mean {id}?)")), "{said}");
    wait_event(&mut pushed, "the instance archived", |e| {
        e.kind() == apollo_shared::protocol::EventKind::InstanceArchived
    })
    .await;
    let (code, archived) = agent.cli_json(&["timeline", &id]);
    assert_eq!((code, archived["events"].as_array().map(Vec::len)), (0, Some(events.len())), "{archived:#}");
}

/// A sub-runbook's child joins its parent's trace: one trace id gives both
/// instances' timeline; a window says what it read, and an empty one is
/// no error.
#[test]
fn a_timeline_by_trace_id_joins_a_parent_and_its_child_and_an_empty_window_says_so() {
    let agent = Agent::builder()
        .task("child.yaml", "task: child\nsteps:\n  - name: work\n    plugin: sleep\n")
        .task("parent.yaml", "task: parent\nsteps:\n  - name: call\n    task: child\n")
        .task("other.yaml", "task: other\nsteps:\n  - plugin: sleep\n")
        .start();
    let (code, parent) = agent.cli_json(&["run", "parent", "--wait"]);
    assert_eq!(code, 0, "{parent:#}");
    assert_eq!(agent.cli_json(&["run", "other", "--wait"]).0, 0);
    let trace = parent["trace_id"].as_str().unwrap();
    let (code, t) = agent.cli_json(&["timeline", "--trace", trace]);
    assert_eq!(code, 0, "{t:#}");
    let mut tasks: Vec<&str> = t["instances"].as_array().unwrap().iter().map(|i| i["task"].as_str().unwrap()).collect();
    tasks.sort();
    assert_eq!(tasks, ["child", "parent"], "{t:#}");
    assert_eq!(t["read"], serde_json::json!(["hot", "archive"]));
    let child = t["instances"].as_array().unwrap().iter().find(|i| i["task"] == "child").unwrap()["id"].clone();
    let steps: Vec<(&str, &str)> = t["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "step" && e["to"] == "SUCCESS")
        .map(|e| (e["step"].as_str().unwrap(), e["instance"].as_str().unwrap()))
        .collect();
    assert_eq!(steps.len(), 2, "{t:#}");
    assert_eq!(steps[0], ("work", child.as_str().unwrap()), "the child's step ends before its parent's: {t:#}");
    assert_eq!(steps[1].0, "call");

    let (_, by_task) = agent.cli_json(&["timeline", "--since", "1h", "--task", "other"]);
    assert_eq!(by_task["instances"].as_array().map(Vec::len), Some(1), "{by_task:#}");
    let empty = agent.cli(&["timeline", "--since", "1h", "--queue", "nothing-here"]);
    assert_eq!(empty.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&empty.stdout).contains("no instance in the window (read: hot, archive)"));
}

const RELEASE: &str = r#"task: release
queue: releases
on_failure: stop
steps:
  - name: check
    plugin: shell
    retry: 0
    params:
      command: test -e ok || { echo 'no ok file' >&2; exit 3; }
  - name: gate
    plugin: approval
    params:
      message: ship it?
      approvers: {users: [nobody]}
      distinct_approver: true
  - name: finish
    plugin: sleep
"#;

/// The issue's incident: an instance fails, an operator retries it with a
/// reason, it waits for an approval that another user grants while its
/// queue is paused, the queue is resumed and it succeeds. Its timeline has
/// each of those in order, with actors and reasons, in all three formats.
#[tokio::test]
async fn a_timeline_holds_the_failure_the_retry_the_approval_by_another_user_the_pause_and_the_end() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let agent = Agent::builder().config("socket:\n  operators: ['65534']\n").task("release.yaml", RELEASE).start();
    std::fs::set_permissions(agent.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&agent.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (c, mut events) = agent.watch().await;
    let (code, inst) = agent.cli_json(&["run", "release", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    let id = inst["id"].as_str().unwrap().to_string();
    std::fs::write(agent.path().join("data/work").join(&id).join("ok"), "").unwrap();
    assert!(agent.cli(&["retry", &id, "--reason", "created the ok file"]).status.success());
    let parked = |i: &apollo_shared::protocol::Instance| {
        i.waiting.as_deref().is_some_and(|w| w.starts_with("waiting for approval"))
    };
    wait_until(&c, &mut events, &id, "the approval's wait", parked).await;
    let out = agent.cli(&["pause", "--queue", "releases", "--reason", "incident 42: hold releases"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = std::process::Command::new(cli_bin())
        .arg("--socket")
        .arg(&agent.socket)
        .args(["approve", &id, "--reason", "CHG-7 go"])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(out.status.success(), "nobody approves: {}", String::from_utf8_lossy(&out.stderr));
    let held = |i: &apollo_shared::protocol::Instance| i.waiting.as_deref().is_some_and(|w| w.contains("paused by"));
    wait_until(&c, &mut events, &id, "the pause's hold", held).await;
    assert!(agent.cli(&["resume", "--queue", "releases", "--reason", "incident 42 over"]).status.success());
    let done = wait_until(&c, &mut events, &id, "the end", ended).await;
    assert_eq!(done.state.as_str(), "SUCCESS", "{done:?}");

    let (code, t) = agent.cli_json(&["timeline", &id]);
    assert_eq!(code, 0, "{t:#}");
    let events = t["events"].as_array().unwrap();
    let find = |what: &str, pred: &dyn Fn(&Value) -> bool| {
        events.iter().position(pred).unwrap_or_else(|| panic!("no {what}: {t:#}"))
    };
    let is = |e: &Value, kind: &str, to: &str| e["kind"] == kind && e["to"] == to;
    let failed = find("check's failure", &|e| is(e, "step", "FAILED") && e["step"] == "check");
    let alert = find("the failure's alert", &|e| is(e, "alert", "instance_failed"));
    let retry = find("the retry", &|e| is(e, "instance", "RETRYING") && e["operator"] == true);
    let asked = find("the approval's request", &|e| is(e, "alert", "approval_requested"));
    let paused = find("the pause", &|e| is(e, "pause", "paused"));
    let approved = find("the approval", &|e| e["step"] == "gate" && e["operator"] == true);
    let resumed = find("the resume", &|e| is(e, "pause", "resumed"));
    let ended = find("the end", &|e| is(e, "instance", "SUCCESS"));
    let order = [failed, alert, retry, asked, paused, approved, resumed, ended];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "in order {order:?}: {t:#}");
    let e = &events[retry];
    assert!(
        e["actor"].as_str().unwrap().ends_with("(uid 0)") && e["reason"] == "retry requested: created the ok file",
        "{e:#}"
    );
    let e = &events[paused];
    assert!(e["actor"].as_str().unwrap().ends_with("(uid 0)") && e["operator"] == true, "{e:#}");
    assert!(e["reason"].as_str().unwrap().contains("incident 42: hold releases"), "{e:#}");
    assert!(e["instance"].as_str().unwrap().starts_with("pause-"), "{e:#}");
    let e = &events[approved];
    assert!(e["actor"].as_str().unwrap().contains("nobody") && e["operator"] == true, "{e:#}");
    assert!(e["reason"].as_str().unwrap().contains("CHG-7 go"), "{e:#}");
    assert!(events[resumed]["reason"].as_str().unwrap().contains("incident 42 over"), "{t:#}");
    assert!(events[asked]["reason"].as_str().unwrap().contains("ship it?"), "{t:#}");
    assert_eq!((events[alert]["instance"].as_str(), events[alert]["operator"].as_bool()), (Some(&id[..]), Some(false)));

    let human = String::from_utf8_lossy(&agent.cli(&["timeline", &id]).stdout).to_string();
    let at = |needle: &str| human.find(needle).unwrap_or_else(|| panic!("{needle}: {human}"));
    let said = [
        "check: RUNNING -> FAILED",
        "alert instance_failed",
        "created the ok file",
        "alert approval_requested",
        "incident 42: hold releases",
        "CHG-7 go",
        "incident 42 over",
        "finish: RUNNING -> SUCCESS",
    ];
    assert!(said.windows(2).all(|w| at(w[0]) < at(w[1])), "in order: {human}");
    assert!(human.contains("pause…"), "{human}");

    let md = String::from_utf8_lossy(&agent.cli(&["timeline", &id, "--md"]).stdout).to_string();
    for section in ["## Timeline", "- **Started:** release (manual by root", "- **Outcome:** release", "| + | UTC |"] {
        assert!(md.contains(section), "{section}: {md}");
    }
    let who = md.lines().find(|l| l.starts_with("- **Who acted:** ")).unwrap_or_default();
    assert!(who.contains("(uid 0)") && who.contains("nobody"), "{md}");
    assert!(said.iter().all(|s| md.contains(s)), "{md}");
}

/// A lock wait is recorded once, when the claim first finds the lock held
/// (its history row names the lock and the holder), and the timeline shows
/// it between the instance's creation and its claim.
#[tokio::test]
async fn a_lock_wait_is_in_the_timeline_once_naming_the_lock_and_its_holder() {
    use apollo_shared::state::TaskState;
    let w = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 4\n")
        .task("migrate.yaml", &super::locks::holder("migrate", w.path()))
        .task("backup.yaml", &super::locks::holder("backup", w.path()))
        .start();
    let (c, mut events) = agent.watch().await;
    let first = trigger(&c, "migrate", serde_json::json!({"r": "eu", "block": "yes"})).await;
    wait_until(&c, &mut events, &first, "the holder running", |i| i.state == TaskState::Running).await;
    let second = trigger(&c, "backup", serde_json::json!({"r": "eu"})).await;
    // Claims pass the waiter again and again while these run.
    for _ in 0..3 {
        let other = trigger(&c, "migrate", serde_json::json!({"r": "us"})).await;
        wait_until(&c, &mut events, &other, "another lock's instance", ended).await;
    }
    std::fs::write(w.path().join("gate"), "").unwrap();
    let done = wait_until(&c, &mut events, &second, "the waiter's end", ended).await;
    assert_eq!(done.state, TaskState::Success, "{done:?}");

    let (code, t) = agent.cli_json(&["timeline", &second]);
    assert_eq!(code, 0, "{t:#}");
    let events = t["events"].as_array().unwrap();
    let waits: Vec<usize> = (0..events.len()).filter(|&n| events[n]["kind"] == "lock").collect();
    assert_eq!(waits.len(), 1, "one lock wait, however many claims passed it: {t:#}");
    let wait = &events[waits[0]];
    let reason = wait["reason"].as_str().unwrap();
    assert!(reason.starts_with(&format!("waiting for lock res:eu held by {first} (task migrate)")), "{wait:#}");
    assert_eq!(
        (wait["from"].as_str(), wait["to"].as_str(), wait["operator"].as_bool()),
        (Some("PENDING"), Some("PENDING"), Some(false))
    );
    let created = events.iter().position(|e| e["kind"] == "instance" && e["to"] == "PENDING").unwrap();
    let claimed = events.iter().position(|e| e["kind"] == "instance" && e["to"] == "RUNNING").unwrap();
    assert!(created < waits[0] && waits[0] < claimed, "{t:#}");
    let human = String::from_utf8_lossy(&agent.cli(&["timeline", &second]).stdout).to_string();
    assert!(human.contains("waits for a lock") && human.contains("waiting for lock res:eu held by"), "{human}");
    // The waiting instance's own history has it too.
    let shown = String::from_utf8_lossy(&agent.cli(&["show", &second]).stdout).to_string();
    assert!(shown.contains("waiting for lock res:eu held by"), "{shown}");
}

/// An instance that ran a rollout's arm has the rollout's start and end in
/// its timeline; a parent's timeline holds its child, named as such.
#[test]
fn a_timeline_shows_the_rollout_its_arm_came_from_and_a_parents_child() {
    let b = Agent::builder();
    let plugins = super::rollout::versions(b.path(), &[("1.0.0", false), ("2.0.0", false)]);
    let agent = b
        .config(&plugins)
        .task("canary.yaml", "task: canary\nsteps:\n  - name: work\n    plugin: ver\n    version: \">=1\"\n")
        .task("child.yaml", "task: child\nsteps:\n  - name: work\n    plugin: sleep\n")
        .task("parent.yaml", "task: parent\nsteps:\n  - name: call\n    task: child\n")
        .start();
    let out = agent.cli(&["rollout", "start", "ver", "2.0.0", "--share", "100", "--reason", "canary of 2.0.0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, inst) = agent.cli_json(&["run", "canary", "--wait"]);
    assert_eq!(code, 0, "{inst:#}");
    let id = inst["id"].as_str().unwrap();
    assert!(agent.cli(&["rollout", "abort", "ver", "--reason", "seen enough"]).status.success());
    let (_, t) = agent.cli_json(&["timeline", id]);
    let rollout: Vec<(&str, &str)> = t["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "rollout")
        .map(|e| (e["to"].as_str().unwrap(), e["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(rollout.len(), 2, "{t:#}");
    assert_eq!(rollout[0].0, "running");
    assert!(rollout[0].1.contains("canary of 2.0.0"), "{t:#}");
    assert_eq!(rollout[1].0, "aborted");
    assert!(rollout[1].1.contains("seen enough"), "{t:#}");
    let human = String::from_utf8_lossy(&agent.cli(&["timeline", id]).stdout).to_string();
    assert!(human.contains("rollout running") && human.contains("rollout…"), "{human}");

    let (code, parent) = agent.cli_json(&["run", "parent", "--wait"]);
    assert_eq!(code, 0, "{parent:#}");
    let pid = parent["id"].as_str().unwrap();
    let (_, t) = agent.cli_json(&["timeline", pid]);
    let instances = t["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 2, "the parent and its child: {t:#}");
    let child = instances.iter().find(|i| i["task"] == "child").unwrap();
    assert_eq!(child["parent"].as_str(), Some(pid), "{t:#}");
    let child_id = child["id"].as_str().unwrap();
    assert!(t["events"].as_array().unwrap().iter().any(|e| e["instance"] == child_id && e["step"] == "work"), "{t:#}");
    let md = String::from_utf8_lossy(&agent.cli(&["timeline", pid, "--md"]).stdout).to_string();
    assert!(md.contains(&format!("child {child_id} SUCCESS (child of {pid})")), "{md}");
}

/// A timeline too large for one answer (1,000 instances, 5,000 events:
/// more than a frame holds) comes in pages, which the CLI joins: every
/// event, in order.
#[tokio::test]
async fn a_timeline_larger_than_one_answer_comes_whole_in_pages() {
    let agent = Agent::builder()
        .config("scheduler:\n  concurrency: 16\n")
        .task("tick.yaml", "task: tick\nqueue: ticks\nsteps:\n  - plugin: sleep\n")
        .start();
    let c = agent.client().await;
    for _ in 0..1000 {
        trigger(&c, "tick", serde_json::json!({})).await;
    }
    loop {
        let s = status(&c).await.unwrap();
        if s.counts.get("SUCCESS").and_then(Value::as_u64) == Some(1000) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let p = apollo_shared::protocol::TimelineParams {
        queue: Some("ticks".into()),
        until: Some(chrono::Utc::now()),
        ..Default::default()
    };
    let first = c.request::<m::TasksTimeline>(p).await.unwrap();
    assert!(first.next_event.is_some() && first.events.len() < 5000, "one answer holds part of it");
    let (code, t) = agent.cli_json(&["timeline", "--since", "1h", "--queue", "ticks"]);
    assert_eq!(code, 0);
    let events = t["events"].as_array().unwrap();
    assert_eq!((t["instances"].as_array().unwrap().len(), events.len()), (1000, 5000));
    let at: Vec<chrono::DateTime<chrono::Utc>> =
        events.iter().map(|e| e["at"].as_str().unwrap().parse().unwrap()).collect();
    assert!(at.windows(2).all(|w| w[0] <= w[1]), "in time order across the pages");
    assert!(t.get("next_event").is_none(), "{:?}", t.get("next_event"));
}
