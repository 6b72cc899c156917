//! Finished instances move to the archive after the retention window —
//! SUCCESS, ROLLED_BACK and FAILED alike — and stay browsable: `apollo ls
//! --archived` with the usual filters, `apollo show` by id, and their dedup
//! keys still refuse a duplicate.

use apollo_shared::state::StepState;
use apollo_tests::*;
use serde_json::json;
use std::collections::BTreeSet;

async fn trigger_keyed(c: &apollo_tui::client::Client, task: &str, key: &str) -> TriggerResult {
    let p = TriggerParams { task: task.into(), params: Default::default(), dedup_key: Some(key.into()), reason: None };
    c.request::<m::TasksTrigger>(p).await.unwrap()
}

#[tokio::test]
async fn past_retention_every_finished_instance_is_archived_yet_browsable() {
    let agent = Agent::builder()
        .config("scheduler:\n  retention: 1s\n  lease: 3s\n")
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")
        .task("bad.yaml", "task: bad\non_failure: stop\nsteps:\n  - plugin: shell\n    retry: 0\n    params:\n      command: exit 3\n")
        .task("undo.yaml", "task: undo\nsteps:\n  - plugin: shell\n    retry: 0\n    params:\n      command: exit 3\n")
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mut ids = Vec::new();
    for task in ["ok", "bad", "undo"] {
        ids.push(trigger_keyed(&c, task, &format!("key-{task}")).await.id);
    }
    // Woken by the archive's own events.
    let mut archived = BTreeSet::new();
    while archived.len() < 3 {
        let ev =
            wait_event(&mut events, "an instance to be archived", |e| e.kind() == EventKind::InstanceArchived).await;
        archived.insert(ev.data.json()["id"].as_str().unwrap().to_string());
    }
    assert_eq!(archived, ids.iter().cloned().collect());
    let (code, live) = agent.cli_json(&["ls"]);
    assert_eq!((code, live), (0, json!([])), "moved out of the live table");
    let (code, list) = agent.cli_json(&["ls", "--archived"]);
    assert_eq!(code, 0, "{list:#}");
    let states: BTreeSet<&str> = list.as_array().unwrap().iter().map(|i| i["state"].as_str().unwrap()).collect();
    assert_eq!(states, BTreeSet::from(["FAILED", "ROLLED_BACK", "SUCCESS"]), "{list:#}");
    let (_, failed) = agent.cli_json(&["ls", "--archived", "--state", "FAILED"]);
    assert_eq!(failed.as_array().unwrap().len(), 1);
    assert_eq!(failed[0]["id"], json!(ids[1]));
    for id in &ids {
        let (code, shown) = agent.cli_json(&["show", id]);
        assert_eq!(code, 0, "{shown:#}");
        assert!(shown["transitions"].as_array().is_some_and(|t| t.len() >= 4), "{shown:#}");
    }
    // The dedup key of an archived instance still refuses a duplicate.
    let again = trigger_keyed(&c, "ok", "key-ok").await;
    assert_eq!((again.created, again.id.as_str()), (false, ids[0].as_str()));
}

#[tokio::test]
async fn past_archive_retention_an_instance_is_deleted_and_an_export_kept_it_first() {
    let agent = Agent::builder()
        .config("scheduler:\n  retention: 1s\n  archive_retention: 1h\n  lease: 3s\n")
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let id = trigger_keyed(&c, "ok", "kept").await.id;
    wait_event(&mut events, "the instance archived", |e| e.kind() == EventKind::InstanceArchived).await;
    // Exported while it is in the archive: one JSON line, read back without an agent.
    let file = agent.path().join("export.jsonl");
    let tomorrow = (chrono::Utc::now() + chrono::Duration::days(1)).format("%Y-%m-%d").to_string();
    let out = agent.cli(&["archive", "export", "--before", &tomorrow, file.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success() && said.contains("1 archived instance(s)"), "{said}");
    let again = agent.cli(&["archive", "export", "--before", &tomorrow, file.to_str().unwrap()]);
    assert!(!again.status.success(), "an export never overwrites");
    assert!(String::from_utf8_lossy(&again.stderr).contains("cannot write the export there"));
    // Deleted once past archive_retention, lowered to 2 s (a restart, so
    // the export above cannot race the deletion): read by polling, as
    // nothing is published for a deletion.
    let mut agent = agent;
    shorten_archive_retention(&mut agent);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while agent.cli(&["show", &id]).status.success() {
        assert!(std::time::Instant::now() < deadline, "still archived after 30 s");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let shown = std::process::Command::new(cli_bin())
        .args(["--json", "show", &id, "--file", file.to_str().unwrap()])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!((doc["id"].as_str(), doc["state"].as_str()), (Some(id.as_str()), Some("SUCCESS")), "{doc:#}");
    assert!(doc["transitions"].as_array().is_some_and(|t| t.len() >= 4), "{doc:#}");
    // Its dedup key goes with it; the store gives deleted pages back.
    let c = agent.client().await;
    assert!(trigger_keyed(&c, "ok", "kept").await.created);
    let db = agent.path().join("data/apollo.db");
    let mode = std::process::Command::new("sqlite3").arg(&db).arg("PRAGMA auto_vacuum").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&mode.stdout).trim(), "2", "incremental vacuum");
}

/// Waits (30 s at most, looking every 100 ms: nothing is published when a
/// file goes) until `path` exists no more.
async fn until_gone(path: &std::path::Path, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while path.exists() {
        assert!(std::time::Instant::now() < deadline, "{what} still there after 30 s: {}", path.display());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn an_instances_work_directory_ends_with_it_and_its_logs_with_its_archived_copy() {
    files_end_with_their_instance("").await;
}

#[tokio::test]
async fn on_postgresql_an_instances_work_directory_and_logs_end_with_it_too() {
    let schema = PgSchema::new("archive_files");
    files_end_with_their_instance(&schema.config()).await;
}

/// An instance's work directory goes once it is archived, its logs once
/// the archive lets it go; a hot instance keeps its own (`store`: the
/// agent's store configuration, empty for SQLite).
async fn files_end_with_their_instance(store: &str) {
    let agent = Agent::builder()
        .config(&format!("{store}scheduler:\n  retention: 1s\n  archive_retention: 1h\n  lease: 3s\n"))
        .task(
            "files.yaml",
            "task: files\nsteps:\n  - plugin: shell\n    params: {command: 'echo kept > made.txt; echo said'}\n",
        )
        .task(
            "held.yaml",
            "task: held\nsteps:\n  - plugin: shell\n    params: {command: 'echo kept > made.txt'}\n  \
             - plugin: approval\n    params: {message: go?}\n",
        )
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    // One instance stays hot (parked on its approval) past the retention.
    let held = trigger_keyed(&c, "held", "held").await.id;
    wait_until(&c, &mut events, &held, "the held instance to park", |i| {
        i.steps.as_ref().is_some_and(|s| s[0].state == StepState::Success)
    })
    .await;
    let id = trigger_keyed(&c, "files", "files").await.id;
    wait_event(&mut events, "the instance archived", |e| {
        e.kind() == EventKind::InstanceArchived && e.data.json()["id"] == json!(id)
    })
    .await;
    let data = agent.path().join("data");
    until_gone(&data.join("work").join(&id), "the archived instance's work directory").await;
    // Its logs stay while the archive keeps it, and read as before.
    let logs = agent.cli(&["logs", &id]);
    assert!(String::from_utf8_lossy(&logs.stdout).contains("said"), "{logs:?}");
    assert!(data.join("logs").join(&id).is_dir());
    // The hot instance keeps its files, however old.
    assert!(data.join("work").join(&held).join("made.txt").is_file(), "a hot instance's work directory was removed");
    // Deleted from the archive: its logs go with it.
    let mut agent = agent;
    shorten_archive_retention(&mut agent);
    until_gone(&data.join("logs").join(&id), "the deleted instance's logs").await;
    assert!(!agent.cli(&["show", &id]).status.success(), "gone from the archive");
    assert!(data.join("work").join(&held).join("made.txt").is_file(), "a hot instance's work directory was removed");
}

/// Restarts `agent` with `archive_retention: 2s` in place of `1h`.
fn shorten_archive_retention(agent: &mut Agent) {
    let config = agent.path().join("apollo.yaml");
    let text = std::fs::read_to_string(&config).unwrap();
    assert_eq!(agent.stop().code(), Some(0));
    std::fs::write(&config, text.replace("archive_retention: 1h", "archive_retention: 2s")).unwrap();
    agent.spawn();
}

#[test]
fn an_archive_retention_shorter_than_the_retention_is_refused() {
    let agent = Agent::builder().start();
    let cfg = agent.path().join("bad.yaml");
    std::fs::write(&cfg, "scheduler:\n  retention: 30d\n  archive_retention: 7d\n").unwrap();
    let out = std::process::Command::new(agent_bin())
        .args(["--config", cfg.to_str().unwrap(), "check"])
        .current_dir(agent.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("scheduler.archive_retention: 7d is shorter than scheduler.retention (30d)"), "{said}");
}

#[tokio::test]
async fn on_postgresql_the_archive_ends_and_its_export_reads_back() {
    let schema = PgSchema::new("archive_ends");
    let mut agent = Agent::builder()
        .config(&format!("{}scheduler:\n  retention: 1s\n  archive_retention: 1h\n  lease: 3s\n", schema.config()))
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let id = trigger_keyed(&c, "ok", "pg-kept").await.id;
    wait_event(&mut events, "the instance archived", |e| e.kind() == EventKind::InstanceArchived).await;
    let file = agent.path().join("export.jsonl");
    let tomorrow = (chrono::Utc::now() + chrono::Duration::days(1)).format("%Y-%m-%d").to_string();
    let out = agent.cli(&["archive", "export", "--before", &tomorrow, file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 archived instance(s)"));
    shorten_archive_retention(&mut agent);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while agent.cli(&["show", &id]).status.success() {
        assert!(std::time::Instant::now() < deadline, "still archived after 30 s");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(schema.sql("SELECT COUNT(*) FROM archive")[0][0].as_deref(), Some("0"));
    let shown = agent.cli(&["show", &id, "--file", file.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&shown.stdout).contains(&format!("SUCCESS ok {id}")));
}

/// SQLite keeps an archived instance compressed (a few hundred bytes, not
/// its 1.5 KB of JSON); it reads back whole — its context too — in `show`,
/// the export and a promotion to PostgreSQL, which keeps it as text.
#[tokio::test]
async fn an_archived_instance_is_kept_compressed_and_reads_back_whole_here_in_an_export_and_on_postgresql() {
    let schema = PgSchema::new("archived_docs");
    let mut agent = Agent::builder()
        .config("scheduler:\n  retention: 1s\n")
        .task("ok.yaml", "task: ok\nparams:\n  who: {default: ops}\nsteps:\n  - name: hello\n    plugin: sleep\n")
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let (code, hot) = agent.cli_json(&["run", "ok", "--wait"]);
    assert_eq!(code, 0, "{hot:#}");
    let id = hot["id"].as_str().unwrap().to_string();
    wait_event(&mut events, "the instance archived", |e| e.kind() == EventKind::InstanceArchived).await;
    let db = agent.path().join("data/apollo.db");
    let kept = std::process::Command::new("sqlite3")
        .arg(&db)
        .arg(format!("SELECT typeof(doc), length(doc) FROM archive WHERE id = '{id}'"))
        .output()
        .unwrap();
    let kept = String::from_utf8_lossy(&kept.stdout).trim().to_string();
    let (kind, bytes) = kept.split_once('|').unwrap_or_else(|| panic!("{kept}"));
    assert_eq!(kind, "blob", "{kept}");
    assert!(bytes.parse::<usize>().unwrap() < 600, "{kept}");
    let (code, archived) = agent.cli_json(&["show", &id]);
    assert_eq!(code, 0, "{archived:#}");
    let context = &archived["context"];
    assert_eq!(
        (context["task"].as_str(), context["task_id"].as_str()),
        (Some("ok"), Some(id.as_str())),
        "{archived:#}"
    );
    assert_eq!(context["params"]["who"], "ops", "{archived:#}");
    assert_eq!(context["steps"]["hello"], archived["steps"][0]["output"], "{archived:#}");
    assert_eq!(archived["transitions"], hot["transitions"], "the history as it was");
    let file = agent.path().join("export.jsonl");
    let tomorrow = (chrono::Utc::now() + chrono::Duration::days(1)).format("%Y-%m-%d").to_string();
    assert!(agent.cli(&["archive", "export", "--before", &tomorrow, file.to_str().unwrap()]).status.success());
    let line: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&file).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(line["context"], archived["context"], "the export has the whole context");

    drop(c);
    agent.stop();
    let out = std::process::Command::new(agent_bin())
        .current_dir(agent.path())
        .args(["--data-dir", "data", "--tasks", "tasks", "migrate", "--to", &pg_url(), "--schema", &schema.name])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let text = schema.sql(&format!("SELECT doc FROM archive WHERE id = '{id}'"));
    assert!(text[0][0].as_deref().unwrap_or("").starts_with('{'), "kept as JSON text on PostgreSQL: {text:?}");
    std::fs::write(agent.path().join("apollo.yaml"), schema.config()).unwrap();
    agent.spawn();
    let (_, promoted) = agent.cli_json(&["show", &id]);
    assert_eq!(promoted, archived);
}
