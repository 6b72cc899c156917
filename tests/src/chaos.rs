//! The promises under faults, checked the same way by the kill loop and the
//! fail point tests:
//!
//! - I1: every acknowledged trigger exists and has finished;
//! - I2: no step ran again after its SUCCESS was committed;
//! - I3: every instance's history is legal under the transition tables;
//! - I4: no instance is RUNNING without a live owner;
//! - I5: no step process of an earlier agent life is alive, and no step ever
//!   ran twice at the same time.
//!
//! The chain task's steps write `B <key> <attempt>` when they begin and `E …`
//! when they end to a witness file, holding a lock named after the step
//! while they run: a copy that finds the lock taken (an earlier copy, or an
//! orphan of a killed agent, still running) writes `OVERLAP`.

use crate::{ended, m, status, try_trigger, Agent, Topic};
use apollo_shared::protocol::{Instance, ListParams};
use apollo_shared::state::{check_step, check_task, StepState, TaskState};
use apollo_tui::client::Client;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// The shell command of one chain step: lock, begin, wait, end.
pub const STEP: &str = r#"W="$APOLLO_WORK_DIR/../../witness"; K="$APOLLO_IDEMPOTENCY_KEY"; exec 9>>"$W.$K.lock"; flock -n 9 || echo "OVERLAP $K $APOLLO_ATTEMPT" >> "$W"; echo "B $K $APOLLO_ATTEMPT" >> "$W"; sleep {{ params.delay }}; echo "E $K $APOLLO_ATTEMPT" >> "$W""#;

/// A task of `steps` shell steps that write the witness.
pub fn chain(task: &str, steps: usize) -> String {
    let mut y = format!("task: {task}\nparams:\n  delay: {{default: 0.01}}\nsteps:\n");
    for i in 0..steps {
        y.push_str(&format!("  - name: s{i}\n    plugin: shell\n    retry: 0\n    params:\n      command: '{STEP}'\n"));
    }
    y
}

/// A small deterministic generator, seeded per run (the seed is printed).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

pub fn witness_path(agent: &Agent) -> PathBuf {
    agent.path().join("data/witness")
}

/// I4 right after a start: every RUNNING instance is held by this agent
/// (whose name ends with its pid) under a lease that has not run out.
pub async fn check_owners(c: &Client, pid: i32) {
    let query = ListParams { state: Some(TaskState::Running), limit: Some(1000), ..Default::default() };
    let page = c.request::<m::TasksList>(query).await.unwrap();
    for i in page.items {
        let owner = i.lease_owner.clone().unwrap_or_default();
        assert!(owner.ends_with(&format!(":{pid}")), "I4: {} is RUNNING, held by {owner:?}, not agent pid {pid}", i.id);
    }
}

/// I3: the history replays under the tables (a row whose from and to are
/// the same is a note, such as a recovery), and ends in the states shown.
pub fn check_history(i: &Instance) {
    let rows = i.transitions.as_ref().expect("tasks.get carries the history");
    let mut task: Option<TaskState> = None;
    let mut steps: HashMap<u32, StepState> = HashMap::new();
    for (n, t) in rows.iter().enumerate() {
        let from = t.from.as_deref();
        match t.step {
            None => {
                let to: TaskState = t.to.parse().unwrap();
                match (task, from) {
                    (None, None) => assert_eq!(to, TaskState::Pending, "I3: {} row {n} creates it as {to}", i.id),
                    (Some(cur), Some(f)) => {
                        let f: TaskState = f.parse().unwrap();
                        assert_eq!(f, cur, "I3: {} row {n} moves from {f}, but it was {cur}: {t:?}", i.id);
                        assert!(f == to || check_task(f, to).is_ok(), "I3: {} row {n}: {f} -> {to} is illegal", i.id);
                    }
                    _ => panic!("I3: {} row {n} has from {from:?} while the instance is {task:?}: {t:?}", i.id),
                }
                task = Some(to);
            }
            Some(seq) => {
                let cur = *steps.get(&seq).unwrap_or(&StepState::Pending);
                let f: StepState = from.expect("a step row names its from state").parse().unwrap();
                let to: StepState = t.to.parse().unwrap();
                assert_eq!(f, cur, "I3: {} step {seq} row {n} moves from {f}, but it was {cur}", i.id);
                assert!(check_step(f, to).is_ok(), "I3: {} step {seq} row {n}: {f} -> {to} is illegal", i.id);
                steps.insert(seq, to);
            }
        }
    }
    assert_eq!(task, Some(i.state), "I3: {} history ends in {task:?} but the instance is {}", i.id, i.state);
    for s in i.steps.iter().flatten() {
        assert_eq!(*steps.get(&s.seq).unwrap_or(&StepState::Pending), s.state, "I3: {} step {}", i.id, s.seq);
    }
}

/// What the witness says of each step key: attempts begun and ended.
#[derive(Default, Debug)]
pub struct Runs {
    pub began: Vec<u32>,
    pub ended: Vec<u32>,
}

pub fn read_witness(agent: &Agent) -> (BTreeMap<String, Runs>, Vec<String>) {
    let text = std::fs::read_to_string(witness_path(agent)).unwrap_or_default();
    let mut runs: BTreeMap<String, Runs> = BTreeMap::new();
    let mut overlaps = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f[..] {
            ["B", key, a] => runs.entry(key.into()).or_default().began.push(a.parse().unwrap()),
            ["E", key, a] => runs.entry(key.into()).or_default().ended.push(a.parse().unwrap()),
            ["OVERLAP", ..] => overlaps.push(line.to_string()),
            _ => {}
        }
    }
    (runs, overlaps)
}

/// Processes alive with one of these instances' step keys in their environment.
pub fn leftover_processes(ids: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(env) = std::fs::read(e.path().join("environ")) else { continue };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        if stat.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')) {
            continue;
        }
        for kv in env.split(|b| *b == 0) {
            let kv = String::from_utf8_lossy(kv);
            if let Some(key) = kv.strip_prefix("APOLLO_IDEMPOTENCY_KEY=") {
                if ids.iter().any(|id| key.starts_with(&format!("{id}:"))) {
                    found.push(format!("pid {} ({key})", e.file_name().to_string_lossy()));
                }
            }
        }
    }
    found
}

/// Waits for every acknowledged instance to finish, then checks I1–I5.
/// Returns the instances, for checks of their own.
pub async fn check_all(agent: &Agent, c: &Client, acked: &[String]) -> Vec<Instance> {
    c.subscribe(&[Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let mut done = Vec::new();
    for id in acked {
        // I1: it exists (get would fail otherwise) and it finishes.
        let inst = crate::wait_until(c, &mut events, id, "the instance to finish", ended).await;
        check_history(&inst); // I3
        done.push(inst);
    }
    check_owners(c, agent.pid()).await; // I4
    let (runs, overlaps) = read_witness(agent);
    assert!(overlaps.is_empty(), "I5: steps ran twice at the same time: {overlaps:?}");
    for inst in &done {
        for s in inst.steps.iter().flatten() {
            let key = format!("{}:{}", inst.id, s.seq);
            let r = runs.get(&key);
            if s.state == StepState::Success {
                // I2: the attempt whose SUCCESS was committed ran to its end, and none after it.
                let r = r.unwrap_or_else(|| panic!("I2: {key} is SUCCESS but never ran"));
                assert!(
                    r.ended.contains(&s.attempts),
                    "I2: {key} SUCCESS at attempt {} but it never ended: {r:?}",
                    s.attempts
                );
                assert!(r.began.iter().all(|a| *a <= s.attempts), "I2: {key} ran again after its SUCCESS: {r:?}");
            }
        }
    }
    let ids: Vec<String> = acked.to_vec();
    let left = tokio::task::spawn_blocking(move || leftover_processes(&ids)).await.unwrap();
    assert!(left.is_empty(), "I5: step processes still alive after every instance finished: {left:?}");
    done
}

/// Triggers `n` chain instances; returns the ids the agent acknowledged
/// (a call cut by a crash is not acknowledged).
pub async fn trigger_some(c: &Client, task: &str, n: usize, delay: f64) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        match try_trigger(c, task, serde_json::json!({"delay": delay})).await {
            Ok(id) => ids.push(id),
            Err(_) => break,
        }
    }
    ids
}

/// Instances not finished (PENDING, RUNNING or RETRYING), by the agent's counts.
pub async fn in_flight(c: &Client) -> u64 {
    let st = status(c).await.unwrap();
    ["PENDING", "RUNNING", "RETRYING"].iter().map(|k| st.counts.get(*k).and_then(|v| v.as_u64()).unwrap_or(0)).sum()
}
