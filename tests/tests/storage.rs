//! A store that cannot be written: the agent's data dir on a small
//! filesystem the test mounts (tmpfs), filled to the last byte while work
//! runs; and the database made immutable (`chattr +i`). The agent refuses new
//! work with a clear error, raises an alert, keeps answering reads, and
//! resumes by itself when space returns or the files are writable again;
//! nothing acknowledged is lost. Needs root (mount, chattr), as CI and the
//! development machines run.

use apollo_shared::protocol::{code, AgentStatus};
use apollo_shared::state::TaskState;
use apollo_tests::*;
use apollo_tui::client::ClientError;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

/// Unmounts (lazily) when the test ends, however it ends.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_new_work_keeps_reads_and_resumes_when_space_returns() {
    let builder = Agent::builder()
        .config("scheduler:\n  lease: 2s\n")
        .task("work.yaml", "task: work\nsteps:\n  - plugin: sleep\n    params:\n      seconds: 0.3\n  - plugin: sleep\n    params:\n      seconds: 0.3\n");
    let data = builder.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let status = Command::new("mount").args(["-t", "tmpfs", "-o", "size=6m", "tmpfs"]).arg(&data).status().unwrap();
    assert!(status.success(), "mounting a tmpfs at {} needs root", data.display());
    let _mount = Mount(data.clone());
    let mut agent = builder.start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks, Topic::Alerts]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mut acked = Vec::new();
    for _ in 0..3 {
        acked.push(trigger(&c, "work", json!({})).await);
    }
    // Fill the filesystem to its last byte.
    let filler = data.join("filler");
    {
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![7u8; 16 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.flush();
        while f.write_all(&[7u8]).is_ok() {}
    }
    // Writes go on while SQLite's journal has room, then are refused with a
    // clear error (the agent tells why and what to do); every trigger it
    // acknowledged before that is kept.
    let mut refused = None;
    for _ in 0..5000 {
        match try_trigger(&c, "work", json!({})).await {
            Ok(id) => acked.push(id),
            Err(ClientError::Rpc(e)) => {
                refused = Some(e);
                break;
            }
            Err(e) => panic!("the connection failed instead of an error answer: {e}"),
        }
    }
    let e = refused.expect("a full disk refuses new work");
    assert_eq!(e.code, code::BUSY, "{}", e.message);
    assert!(e.message.contains("cannot be written") && e.message.contains("free space"), "{}", e.message);
    // Reads still answer, and the status says what is wrong.
    let st: AgentStatus = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
    assert!(st.store_error.as_deref().unwrap_or_default().contains("cannot be written"), "{st:?}");
    let (code, list) = agent.cli_json(&["ls", "--limit", "5"]);
    assert_eq!(code, 0, "{list:#}");
    // The alert reached subscribers.
    wait_event(&mut events, "the store_unwritable alert", |e| {
        e.topic == Topic::Alerts && e.data.json()["kind"] == "store_unwritable"
    })
    .await;
    // Space returns: the agent notices by itself at its next write (the lease
    // renewal of its maintenance tick) and says so.
    std::fs::remove_file(&filler).unwrap();
    wait_event(&mut events, "the store_writable alert", |e| {
        e.topic == Topic::Alerts && e.data.json()["kind"] == "store_writable"
    })
    .await;
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let after = trigger(&c, "work", json!({})).await;
    acked.push(after);
    for id in &acked {
        let inst = wait_until(&c, &mut events, id, "the instance to finish", ended).await;
        assert_eq!(inst.state, TaskState::Success, "{inst:#?}");
        apollo_tests::chaos::check_history(&inst);
    }
    let st: AgentStatus = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
    assert_eq!(st.store_error, None);
    let alerts = alerts_text(&c).await;
    let text = alerts.to_string();
    assert!(text.contains("store_unwritable") && text.contains("store_writable"), "{alerts:#}");
    println!("disk full: {} acknowledged triggers kept, all finished", acked.len());
    agent.kill9();
}

/// Sets or clears the immutable attribute: even root cannot write the file
/// then, through descriptors already open too.
fn immutable(path: &std::path::Path, on: bool) {
    let flag = if on { "+i" } else { "-i" };
    let status = Command::new("chattr").arg(flag).arg(path).status().unwrap();
    assert!(status.success(), "chattr {flag} {} (needs root and a file system with attributes)", path.display());
}

/// Clears the attribute when the test ends, however it ends.
struct Writable(Vec<PathBuf>);

impl Drop for Writable {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = Command::new("chattr").arg("-i").arg(p).status();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_store_refuses_new_work_keeps_reads_and_resumes_when_writable() {
    let mut agent = Agent::builder()
        .config("scheduler:\n  lease: 2s\n")
        .task("work.yaml", "task: work\nsteps:\n  - plugin: sleep\n    params:\n      seconds: 0.3\n")
        .start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks, Topic::Alerts]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mut acked = vec![trigger(&c, "work", json!({})).await];
    let files: Vec<PathBuf> =
        ["apollo.db", "apollo.db-wal"].iter().map(|f| agent.path().join("data").join(f)).collect();
    let _guard = Writable(files.clone());
    for f in &files {
        immutable(f, true);
    }
    let e = match try_trigger(&c, "work", json!({})).await {
        Err(ClientError::Rpc(e)) => e,
        other => panic!("a read-only store must refuse new work: {other:?}"),
    };
    assert_eq!(e.code, code::BUSY, "{}", e.message);
    assert!(e.message.contains("cannot be written"), "{}", e.message);
    let st: AgentStatus = c.request::<m::AgentStatus>(NoParams {}).await.unwrap();
    assert!(st.store_error.is_some(), "{st:?}");
    let _ = try_get(&c, &acked[0]).await.unwrap();
    for f in &files {
        immutable(f, false);
    }
    wait_event(&mut events, "the store_writable alert", |e| {
        e.topic == Topic::Alerts && e.data.json()["kind"] == "store_writable"
    })
    .await;
    let c = agent.client().await;
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    acked.push(trigger(&c, "work", json!({})).await);
    for id in &acked {
        let inst = wait_until(&c, &mut events, id, "the instance to finish", ended).await;
        assert_eq!(inst.state, TaskState::Success, "{inst:#?}");
    }
    agent.kill9();
}
