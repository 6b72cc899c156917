//! Events, live definitions and plugin versions against a real agent.

use apollo_shared::state::TaskState;
use apollo_tests::*;
use apollo_tui::client::Client;
use serde_json::{json, Value};
use std::path::Path;

const LISTENER_ALL: &str = r#"task: on_upload
on_event: sales.uploaded
steps:
  - plugin: shell
    params:
      command: echo "{{ event.file }} from {{ event.region }}" > ../../seen-$APOLLO_TASK_ID
"#;
const LISTENER_EU: &str =
    "task: on_upload_eu\non_event: sales.uploaded\nfilter: {region: eu}\nsteps:\n  - plugin: sleep\n";
const LISTENER_OTHER: &str = "task: on_other\non_event: other.thing\nsteps:\n  - plugin: sleep\n";

fn emit(agent: &Agent, args: &[&str]) -> Value {
    let mut a = vec!["emit"];
    a.extend_from_slice(args);
    let (code, v) = agent.cli_json(&a);
    assert_eq!(code, 0, "{v:#}");
    v
}

#[test]
fn events_create_one_instance_per_matching_definition_once() {
    let agent = Agent::builder()
        .task("all.yaml", LISTENER_ALL)
        .task("eu.yaml", LISTENER_EU)
        .task("other.yaml", LISTENER_OTHER)
        .start();
    let us = emit(&agent, &["sales.uploaded", "--data", r#"{"region": "us", "file": "us.csv"}"#]);
    assert_eq!(us["instances"].as_array().unwrap().len(), 1, "the eu filter must not match: {us:#}");
    let eu = emit(&agent, &["sales.uploaded", "--data", r#"{"region": "eu", "file": "eu.csv"}"#, "--dedup-key", "k1"]);
    assert_eq!(eu["instances"].as_array().unwrap().len(), 2, "{eu:#}");
    let again =
        emit(&agent, &["sales.uploaded", "--data", r#"{"region": "eu", "file": "eu.csv"}"#, "--dedup-key", "k1"]);
    assert_eq!(
        (again["duplicate"].as_bool(), again["instances"].as_array().unwrap().len()),
        (Some(true), 0),
        "{again:#}"
    );
    let none = emit(&agent, &["nobody.listens", "--data", "{}"]);
    assert_eq!(none["instances"], json!([]));
    // Every event is kept and visible, the unmatched one too.
    let (_, events) = agent.cli_json(&["events"]);
    let names: Vec<&str> = events.as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["nobody.listens", "sales.uploaded", "sales.uploaded"], "{events:#}");
    // The payload reached the step's params.
    let id = eu["instances"].as_array().unwrap().iter().map(|i| i.as_str().unwrap()).find(|id| {
        let (_, i) = agent.cli_json(&["show", id]);
        i["task"] == "on_upload"
    });
    let id = id.expect("an on_upload instance");
    let (_, ls) = agent.cli_json(&["ls", "--task", "on_upload"]);
    assert_eq!(ls.as_array().unwrap().len(), 2);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = agent.client().await;
        c.subscribe(&[Topic::Tasks]).await.unwrap();
        let mut ev = c.take_events().unwrap();
        wait_until(&c, &mut ev, id, "the end", ended).await;
    });
    let seen = std::fs::read_to_string(agent.path().join(format!("data/seen-{id}"))).unwrap();
    assert_eq!(seen.trim(), "eu.csv from eu");
}

const V1: &str = r#"task: versioned
steps:
  - name: first
    plugin: shell
    params:
      command: echo v1 >> ../../log-$APOLLO_TASK_ID
  - name: wait
    plugin: shell
    params:
      command: "while [ ! -f ../../go ]; do sleep 0.05; done"
  - name: last
    plugin: shell
    params:
      command: echo v1 >> ../../log-$APOLLO_TASK_ID
"#;

async fn wait_for_reload(events: &mut tokio::sync::mpsc::Receiver<apollo_shared::protocol::Event>) -> Value {
    loop {
        let ev = tokio::time::timeout(std::time::Duration::from_secs(30), events.recv())
            .await
            .expect("no reload within 30s")
            .expect("connection closed");
        if ev.kind() == EventKind::DefsReloaded {
            return ev.data.json();
        }
    }
}

fn write_atomically(path: &Path, text: &str) {
    // As editors do: write a temp file, then rename it over the definition.
    let tmp = path.with_extension("yaml.tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn editing_a_definition_takes_effect_for_new_instances_only() {
    let agent = Agent::builder().task("versioned.yaml", V1).start();
    let file = agent.path().join("tasks/versioned.yaml");
    let c: Client = agent.client().await;
    c.subscribe(&[Topic::Tasks, Topic::Defs]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let old = trigger(&c, "versioned", json!({})).await;
    wait_until(&c, &mut events, &old, "the old instance to wait", |i| {
        i.steps.as_ref().unwrap()[1].state == apollo_shared::StepState::Running
    })
    .await;
    // A rename-based save of the new version while the old instance runs.
    write_atomically(&file, &V1.replace("v1", "v2"));
    let change = wait_for_reload(&mut events).await;
    assert_eq!(change["changed"], json!(["versioned"]), "{change:#}");
    let new = trigger(&c, "versioned", json!({})).await;
    std::fs::write(agent.path().join("data/go"), "").unwrap();
    let a = wait_until(&c, &mut events, &old, "the old instance", ended).await;
    let b = wait_until(&c, &mut events, &new, "the new instance", ended).await;
    assert_eq!((a.state, b.state), (TaskState::Success, TaskState::Success));
    assert_ne!(a.def_hash, b.def_hash);
    let log = |id: &str| std::fs::read_to_string(agent.path().join(format!("data/log-{id}"))).unwrap();
    assert_eq!(log(&old), "v1\nv1\n", "the running instance switched versions");
    assert_eq!(log(&new), "v2\nv2\n");

    // An invalid edit: the error is raised with file and line; v2 stays in force.
    std::fs::write(
        &file,
        V1.replace(
            "plugin: shell\n    params:\n      command: echo v1",
            "plugin: shell\n    timeout: soon\n    params:\n      command: echo v3",
        ),
    )
    .unwrap();
    let change = wait_for_reload(&mut events).await;
    let err = change["errors"][0].as_str().unwrap().to_string();
    assert!(err.contains("versioned.yaml: line 5: steps[0].timeout"), "{err}");
    let alerts = c.request::<m::AlertsList>(Default::default()).await.unwrap();
    assert!(alerts.iter().any(|a| a.message.contains("line 5: steps[0].timeout")), "{alerts:?}");
    let (_, defs) = agent.cli_json(&["defs"]);
    let d = &defs.as_array().unwrap()[0];
    assert_eq!(d["hash"].as_str(), Some(b.def_hash.as_str()), "the previous version is still in force");
    assert!(d["errors"][0].as_str().unwrap().contains("timeout"));
    let still = trigger(&c, "versioned", json!({})).await;
    let s = wait_until(&c, &mut events, &still, "an instance of the kept version", ended).await;
    assert_eq!(s.def_hash, b.def_hash);

    // Deleting the file disables the task for new instances, with a clear error.
    std::fs::remove_file(&file).unwrap();
    // The invalid edit above is a plain (non-atomic) write, which the watcher
    // may report as two changes: a second reload of it can still be on its
    // way. The removal is the first reload that removes something.
    let change = loop {
        let change = wait_for_reload(&mut events).await;
        if change["removed"] != json!([]) && !change["removed"].is_null() {
            break change;
        }
    };
    assert_eq!(change["removed"], json!(["versioned"]));
    let out = agent.cli(&["run", "versioned"]);
    assert_eq!(out.status.code(), Some(1));
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("task \"versioned\" is disabled: its file") && msg.contains("was deleted"), "{msg}");
}

#[tokio::test]
async fn sighup_reloads_when_watching_is_off() {
    let mut agent =
        Agent::builder().config("watch_tasks: false\n").task("a.yaml", "task: a\nsteps:\n  - plugin: sleep\n").start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Defs]).await.unwrap();
    let mut events = c.take_events().unwrap();
    std::fs::write(agent.path().join("tasks/b.yaml"), "task: b\nsteps:\n  - plugin: sleep\n").unwrap();
    assert_eq!(agent.cli(&["run", "b"]).status.code(), Some(1), "b must not be known before the reload");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.pid()), nix::sys::signal::Signal::SIGHUP).unwrap();
    let change = wait_for_reload(&mut events).await;
    assert_eq!(change["changed"], json!(["b"]));
    assert_eq!(agent.cli(&["run", "b"]).status.code(), Some(0));
    assert_eq!(agent.stop().code(), Some(0));
}

fn versioned_plugin(version: &str) -> String {
    format!(
        "#!/bin/sh\ncase \"$1\" in describe) echo '{{\"version\": \"{version}\"}}' ;; validate) echo '{{\"ok\": true}}' ;; *) cat >/dev/null; echo '{{\"by\": \"{version}\"}}' ;; esac\n"
    )
}

#[test]
fn version_pins_pick_the_highest_match_and_record_it() {
    let builder = Agent::builder()
        .config("plugins:\n  - {name: deploy, command: p/deploy-1.sh}\n  - {name: deploy, command: p/deploy-2.sh}\n  - {name: deploy, command: p/deploy-1b.sh}\n")
        .task("pinned.yaml", "task: pinned\nsteps:\n  - plugin: deploy\n    version: \"^1\"\n")
        .task("latest.yaml", "task: latest\nsteps:\n  - plugin: deploy\n")
        .task("impossible.yaml", "task: impossible\nsteps:\n  - plugin: deploy\n    version: \"^3\"\n");
    {
        use std::os::unix::fs::PermissionsExt;
        let dir = builder_dir(&builder).join("p");
        std::fs::create_dir_all(&dir).unwrap();
        for (f, v) in [("deploy-1.sh", "1.0.0"), ("deploy-2.sh", "2.1.0"), ("deploy-1b.sh", "1.4.2")] {
            std::fs::write(dir.join(f), versioned_plugin(v)).unwrap();
            std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    let agent = builder.start();
    let (code, inst) = agent.cli_json(&["run", "pinned", "--wait"]);
    assert_eq!(code, 0, "{inst:#}");
    assert_eq!(inst["steps"][0]["plugin_version"], "1.4.2");
    assert_eq!(inst["steps"][0]["output"]["by"], "1.4.2");
    let (_, inst) = agent.cli_json(&["run", "latest", "--wait"]);
    assert_eq!(inst["steps"][0]["plugin_version"], "2.1.0");
    let (_, defs) = agent.cli_json(&["defs"]);
    let bad =
        defs.as_array().unwrap().iter().find(|d| d["file"].as_str().unwrap().ends_with("impossible.yaml")).unwrap();
    let err = bad["errors"][0].as_str().unwrap();
    assert!(err.contains("no version matching \"^3\" (available: 1.0.0, 1.4.2, 2.1.0)"), "{err}");
    let (_, alerts) = agent.cli_json(&["alerts"]);
    assert!(alerts.as_array().unwrap().iter().any(|a| a["message"].as_str().unwrap().contains("no version matching")));
    let (_, plugins) = agent.cli_json(&["plugins"]);
    let versions: Vec<&str> = plugins
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"] == "deploy")
        .map(|p| p["version"].as_str().unwrap())
        .collect();
    assert_eq!(versions, ["1.0.0", "1.4.2", "2.1.0"]);
}

fn builder_dir(b: &AgentBuilder) -> std::path::PathBuf {
    b.path().to_path_buf()
}

#[test]
fn a_schedule_shows_its_next_fire_and_check_covers_triggers() {
    let agent = Agent::builder()
        .task("cron.yaml", "task: nightly\nschedule: '0 3 * * *'\ntimezone: UTC\nsteps:\n  - plugin: sleep\n")
        .start();
    let (_, defs) = agent.cli_json(&["defs"]);
    let next = defs[0]["next_fire"].as_str().expect("next_fire");
    assert!(next.contains("T03:00:00"), "{next}");
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("tasks");
    std::fs::create_dir_all(&t).unwrap();
    std::fs::write(t.join("a.yaml"), "task: a\nschedule: '0 25 * * *'\nsteps:\n  - plugin: sleep\n").unwrap();
    std::fs::write(
        t.join("b.yaml"),
        "task: b\nschedule: '0 3 * * *'\ntimezone: Moon/Base\nsteps:\n  - plugin: sleep\n",
    )
    .unwrap();
    std::fs::write(t.join("c.yaml"), "task: c\nfilter: {x: 1}\nsteps:\n  - plugin: sleep\n").unwrap();
    std::fs::write(t.join("d.yaml"), "task: d\nsteps:\n  - plugin: sleep\n    version: '>=2'\n").unwrap();
    let out = std::process::Command::new(agent_bin()).current_dir(dir.path()).arg("check").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    for fragment in [
        "a.yaml: line 2: schedule",
        "b.yaml: line 3: timezone",
        "c.yaml: line 2: filter",
        "d.yaml: line 3: steps[0].plugin: plugin \"sleep\" has no version matching",
    ] {
        assert!(text.contains(fragment), "{fragment}:\n{text}");
    }
}
