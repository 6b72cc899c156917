//! The store conformance suite: the same cases, with the same
//! expectations, on both backends — a real SQLite file, and a schema of its
//! own on the machine's PostgreSQL (`APOLLO_TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`), dropped afterwards. Group
//! commit and savepoint isolation, claims by priority then age within
//! limits, dedup keys, recovery, the append-only history, the archive, and
//! a schema newer than the build is refused.

use apollo_agent::bus::Bus;
use apollo_agent::store::{
    postgres::Target, ClaimTerms, FailurePlan, Followed, Location, NewInstance, QueuePolicy, Recover, Store,
    StoreError, Then,
};
use apollo_shared::protocol::AlertKind;
use apollo_shared::state::{StepState, TaskState};
use serde_json::{json, Map};
use std::collections::HashMap;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn pg_url() -> String {
    std::env::var("APOLLO_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.into())
}

/// A database for one case: a temp dir's SQLite file, or a fresh
/// PostgreSQL schema that is dropped when this is.
struct TestDb {
    dir: tempfile::TempDir,
    schema: Option<String>,
}

impl TestDb {
    fn sqlite() -> TestDb {
        TestDb { dir: tempfile::tempdir().unwrap(), schema: None }
    }

    fn postgres(case: &str) -> TestDb {
        let schema = format!("apollo_t_{case}_{}", std::process::id());
        let db = TestDb { dir: tempfile::tempdir().unwrap(), schema: Some(schema) };
        db.sql(&format!("DROP SCHEMA IF EXISTS {0} CASCADE", db.schema.as_ref().unwrap()));
        db
    }

    /// Runs SQL on the PostgreSQL server, off the async runtime.
    fn sql(&self, sql: &str) {
        let (url, sql) = (pg_url(), sql.to_string());
        std::thread::spawn(move || {
            let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap_or_else(|e| {
                panic!("PostgreSQL at {url} is unreachable ({e}); start it or set APOLLO_TEST_DATABASE_URL")
            });
            c.batch_execute(&sql).unwrap();
        })
        .join()
        .unwrap();
    }

    fn location(&self) -> Location {
        match &self.schema {
            None => {
                Location::Sqlite { path: self.dir.path().join("apollo.db"), synchronous_full: true, reclaim: false }
            }
            Some(schema) => Location::Postgres {
                target: Box::new(Target::new(&pg_url(), schema, None).unwrap()),
                read: None,
                pool: 4,
            },
        }
    }

    /// Opens the store (again, as after a crash), off the async runtime.
    fn try_open(&self) -> anyhow::Result<Store> {
        let location = self.location();
        std::thread::spawn(move || Store::open_at(location, Bus::default(), "agent:test".into())).join().unwrap()
    }

    fn open(&self) -> Store {
        self.try_open().unwrap_or_else(|e| panic!("{e:#}"))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(schema) = &self.schema {
            self.sql(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
        }
    }
}

/// Each case, once per backend: `sqlite::case` and `postgres::case`.
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::TestDb::sqlite()).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::TestDb::postgres(stringify!($case))).await
                }
            )*
        }
    };
}

conformance!(
    one_failing_write_does_not_fail_its_batch_mates,
    claims_go_by_priority_then_age_within_queue_and_task_limits,
    a_dedup_key_creates_one_instance,
    recovery_takes_running_instances_and_marks_interrupted_steps,
    the_history_is_append_only,
    finished_instances_past_retention_move_to_the_archive_and_stay_readable,
    a_schema_newer_than_the_build_is_refused,
    transitions_the_table_forbids_are_refused,
    dedicated_and_ordered_queues_shape_the_claims,
    a_steps_success_starts_the_next_step_or_ends_the_instance_in_one_write,
    steps_successes_written_together_move_each_instance_as_alone,
    a_retry_is_claimed_as_the_next_attempt_with_its_lease,
    a_create_claims_and_starts_its_first_step_in_one_write_when_nothing_comes_first,
    a_claim_starts_the_first_steps_it_is_handed_in_the_same_write,
    a_claim_takes_all_of_an_instances_locks_or_none_and_an_end_releases_them,
    a_lock_is_kept_through_a_backoff_and_waited_for_after_a_manual_retry,
    every_listing_shape_reads_an_index_and_none_scans,
);

/// Every combination of the listing's filters, hot and archived: the
/// backend's plan reads an index for each and scans no table (nor sorts
/// what it read). `IS NULL OR` filters, as the listing once had, fail this.
async fn every_listing_shape_reads_an_index_and_none_scans(db: TestDb) {
    let store = db.open();
    let since = chrono::Utc::now() - chrono::TimeDelta::hours(1);
    let mut shapes = 0;
    for bits in 0..32u32 {
        let on = |b: u32| bits & (1 << b) != 0;
        let f = || apollo_agent::store::ListFilter {
            state: on(0).then_some(TaskState::Failed),
            task: on(1).then(|| "probe".to_string()),
            queue: on(2).then(|| "q1".to_string()),
            limit: 50,
            before: on(3).then(|| "01M9000000000000000000000Z".to_string()),
            since: on(4).then_some(since),
        };
        for archived in [false, true] {
            let plan = store.list_plan(f(), archived).await.unwrap();
            let text = plan.join(" / ");
            let table = if archived { "archive" } else { "task_instances" };
            let filtered = bits & 0b111 != 0;
            let bad = match &db.schema {
                None => {
                    plan.iter().any(|l| l.starts_with(&format!("SCAN {table}")) && (filtered || !l.contains("INDEX")))
                        || text.contains("TEMP B-TREE")
                }
                Some(_) => text.contains("Seq Scan") || text.contains("Sort"),
            };
            assert!(!bad, "listing {:?} (archived: {archived}) scans: {text}", f());
            shapes += 1;
        }
    }
    assert_eq!(shapes, 64);
    store.close();
}

fn new(id: &str, task: &str, queue: &str, priority: u8, max_active: Option<u32>, dedup: Option<&str>) -> NewInstance {
    NewInstance {
        id: id.into(),
        task: task.into(),
        def_hash: "h1".into(),
        queue: queue.into(),
        priority,
        max_active,
        params: Map::new(),
        context: json!({}),
        trace_id: format!("trace-{id}"),
        trigger: "test".into(),
        dedup_key: dedup.map(str::to_string),
        steps: vec![("a".into(), "sleep".into())],
        expected_secs: 1.0,
        pins: Default::default(),
        locks: Vec::new(),
    }
}

async fn a_claim_takes_all_of_an_instances_locks_or_none_and_an_end_releases_them(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    let locked = |id: &str, task: &str, locks: &[&str]| NewInstance {
        locks: locks.iter().map(|l| l.to_string()).collect(),
        ..new(id, task, "q", 50, None, None)
    };
    store.create(locked("L1", "a", &["db:eu", "dns"]), "test").await.unwrap();
    store.create(locked("L2", "b", &["db:eu"]), "test").await.unwrap();
    store.create(locked("L3", "c", &["dns", "db:us"]), "test").await.unwrap();
    store.create(locked("L4", "d", &["db:us"]), "test").await.unwrap();
    // One claim: L1 takes db:eu and dns; L2 (db:eu) and L3 (dns) wait
    // though L3's db:us is free (none or all); L4 takes db:us.
    let ids = |c: &[apollo_agent::store::Claimed]| c.iter().map(|i| i.id.clone()).collect::<Vec<_>>();
    let claimed = store.claim(10, lease(), QueuePolicy::default()).await.unwrap();
    assert_eq!(ids(&claimed), ["L1", "L4"]);
    let held = store.lock_holders().await.unwrap();
    let holders: Vec<(String, String)> = held.iter().map(|h| (h.lock.clone(), h.id.clone())).collect();
    assert!(holders.contains(&("db:eu".into(), "L1".into())) && holders.contains(&("db:us".into(), "L4".into())));
    assert!(store.claim(10, lease(), QueuePolicy::default()).await.unwrap().is_empty());
    // L1's end releases db:eu and dns: L2 runs; L3 still waits for db:us.
    store.step_start("L1", 0, "1.0.0", &json!({})).await.unwrap();
    store.step_success("L1", 0, &json!({}).to_string(), apollo_agent::store::Then::Finish).await.unwrap();
    assert_eq!(ids(&store.claim(10, lease(), QueuePolicy::default()).await.unwrap()), ["L2"]);
    store.close();
}

async fn a_lock_is_kept_through_a_backoff_and_waited_for_after_a_manual_retry(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    let locked = |id: &str| NewInstance { locks: vec!["db:eu".into()], ..new(id, "t", "q", 50, None, None) };
    store.create(locked("K1"), "test").await.unwrap();
    store.create(locked("K2"), "test").await.unwrap();
    let ids = |c: &[apollo_agent::store::Claimed]| c.iter().map(|i| i.id.clone()).collect::<Vec<_>>();
    let claim = || store.claim(10, lease(), QueuePolicy::default());
    assert_eq!(ids(&claim().await.unwrap()), ["K1"]);
    // K1 fails and waits out its backoff: it keeps db:eu, K2 still waits
    // (and is the only one waiting).
    let due = chrono::Utc::now() + chrono::Duration::milliseconds(300);
    store.fail("K1", "boom", FailurePlan::Retry(due), "test").await.unwrap();
    let holders = |h: Vec<apollo_shared::protocol::LockHolder>| h.into_iter().map(|h| h.id).collect::<Vec<_>>();
    assert_eq!(holders(store.lock_holders().await.unwrap()), ["K1"]);
    assert!(claim().await.unwrap().is_empty());
    let listed = store.locks().await.unwrap();
    assert_eq!((listed.len(), listed[0].waiting), (1, 1), "{listed:?}");
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(ids(&claim().await.unwrap()), ["K1"], "the retry is claimed, the lock its own");
    // K1 ends FAILED: db:eu goes to K2. Retried by hand, K1 waits for it.
    store.fail("K1", "boom", FailurePlan::Stop, "test").await.unwrap();
    assert_eq!(ids(&claim().await.unwrap()), ["K2"]);
    store.manual_retry("K1", "again", "op").await.unwrap();
    assert_eq!(holders(store.lock_holders().await.unwrap()), ["K2"]);
    assert!(claim().await.unwrap().is_empty());
    store.close();
}

fn lease() -> std::time::Duration {
    std::time::Duration::from_secs(30)
}

async fn one_failing_write_does_not_fail_its_batch_mates(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    // Many concurrent writes land in shared batches; the illegal ones are
    // refused alone and the rest commit.
    let mut handles = Vec::new();
    for i in 0..200 {
        let s = store.clone();
        handles.push(tokio::spawn(async move {
            let id = format!("I{i:04}");
            s.create(new(&id, "t", "q", 50, None, None), "test").await.unwrap();
            if i % 2 == 0 {
                // PENDING -> SUCCESS is illegal.
                s.finish_success(&id).await
            } else {
                Ok(())
            }
        }));
    }
    let mut refused = 0;
    for h in handles {
        match h.await.unwrap() {
            Err(StoreError::Illegal(e)) => {
                assert!(e.to_string().contains("PENDING -> SUCCESS"));
                refused += 1;
            }
            other => other.unwrap(),
        }
    }
    assert_eq!(refused, 100);
    let counts = store.counts().await.unwrap();
    assert_eq!(counts["PENDING"], 200, "{counts:?}");
    let alerts = store.alerts(500).await.unwrap();
    assert_eq!(alerts.iter().filter(|a| a.kind == AlertKind::IllegalTransition).count(), 100);
    store.close();
}

async fn claims_go_by_priority_then_age_within_queue_and_task_limits(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    store.create(new("A1", "low", "q", 25, None, None), "test").await.unwrap();
    store.create(new("A2", "high", "q", 75, None, None), "test").await.unwrap();
    store.create(new("A3", "high", "q", 75, None, None), "test").await.unwrap();
    store.create(new("B1", "one", "r", 90, Some(1), None), "test").await.unwrap();
    store.create(new("B2", "one", "r", 90, Some(1), None), "test").await.unwrap();
    store.create(new("C1", "c", "limited", 100, None, None), "test").await.unwrap();
    store.create(new("C2", "c", "limited", 100, None, None), "test").await.unwrap();
    let limits = QueuePolicy { limits: HashMap::from([("limited".to_string(), 1)]), ..Default::default() };
    let claimed = store.claim(10, lease(), limits.clone()).await.unwrap();
    // Each comes as the claim left it, with its steps.
    for i in &claimed {
        let steps: Vec<(String, StepState)> = i.steps.iter().flatten().map(|s| (s.name.clone(), s.state)).collect();
        assert_eq!(
            (i.state, i.lease_owner.is_some(), steps),
            (TaskState::Running, true, vec![("a".into(), StepState::Pending)]),
            "{}",
            i.id
        );
    }
    let claimed: Vec<String> = claimed.into_iter().map(|i| i.id).collect();
    // C2 waits for the queue limit, B2 for max_active; the rest by priority, then age.
    assert_eq!(claimed, ["C1", "B1", "A2", "A3", "A1"]);
    assert!(store.claim(10, lease(), limits.clone()).await.unwrap().is_empty());
    store.step_start("C1", 0, "1.0.0", &json!({})).await.unwrap();
    store.step_success("C1", 0, &json!({}).to_string(), Then::Nothing).await.unwrap();
    store.finish_success("C1").await.unwrap();
    let next: Vec<String> = store.claim(10, lease(), limits).await.unwrap().into_iter().map(|i| i.id).collect();
    assert_eq!(next, ["C2"]);
    store.close();
}

async fn a_dedup_key_creates_one_instance(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    let (a, created_a) = store.create(new("D1", "t", "q", 50, None, Some("k")), "test").await.unwrap();
    let (b, created_b) = store.create(new("D2", "t", "q", 50, None, Some("k")), "test").await.unwrap();
    assert_eq!((a.as_str(), created_a, b.as_str(), created_b), ("D1", true, "D1", false));
    assert_eq!(store.counts().await.unwrap()["PENDING"], 1);
    store.close();
}

async fn recovery_takes_running_instances_and_marks_interrupted_steps(db: TestDb) {
    {
        let store = db.open();
        store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
        store.create(new("R1", "t", "q", 50, None, None), "test").await.unwrap();
        store.claim(1, lease(), QueuePolicy::default()).await.unwrap();
        store.step_start("R1", 0, "1.0.0", &json!({})).await.unwrap();
        store.close();
    }
    // A new store on the same database, as after a crash.
    let store = db.open();
    // Expired-only recovery leaves a live lease alone.
    assert!(store.recover(lease(), Recover::Expired { held: Vec::new(), capable: None }).await.unwrap().is_empty());
    let found = store.recover(lease(), Recover::All).await.unwrap();
    assert_eq!(found.len(), 1);
    let inst = store.get("R1").await.unwrap();
    assert_eq!(inst.state, TaskState::Running);
    let step = &inst.steps.unwrap()[0];
    assert_eq!(step.state, apollo_shared::StepState::Failed);
    assert_eq!(step.failures, 0, "an interruption is not a failure");
    assert!(step.error.as_deref().unwrap().starts_with("interrupted"));
    store.close();
}

async fn the_history_is_append_only(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    store.create(new("H1", "t", "q", 50, None, None), "test").await.unwrap();
    store.close();
    let refused = |sql: &str| -> String {
        match &db.schema {
            None => {
                let conn = rusqlite::Connection::open(db.dir.path().join("apollo.db")).unwrap();
                conn.execute(sql, []).unwrap_err().to_string()
            }
            Some(schema) => {
                let (url, sql) = (pg_url(), format!("SET search_path TO {schema}; {sql}"));
                std::thread::spawn(move || {
                    let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
                    let e = c.batch_execute(&sql).unwrap_err();
                    e.as_db_error().map(|d| d.message().to_string()).unwrap_or_else(|| e.to_string())
                })
                .join()
                .unwrap()
            }
        }
    };
    for sql in ["UPDATE transitions SET reason = 'rewritten'", "DELETE FROM transitions"] {
        let e = refused(sql);
        assert!(e.contains("append-only"), "{sql}: {e}");
    }
}

async fn a_schema_newer_than_the_build_is_refused(db: TestDb) {
    db.open().close();
    match &db.schema {
        None => {
            let conn = rusqlite::Connection::open(db.dir.path().join("apollo.db")).unwrap();
            conn.pragma_update(None, "user_version", 999).unwrap();
        }
        Some(schema) => db.sql(&format!("UPDATE {schema}.schema_version SET version = 999")),
    }
    let e = format!("{:#}", db.try_open().err().expect("a newer schema is refused"));
    assert!(e.contains("schema is version 999, newer than this agent knows"), "{e}");
}

async fn transitions_the_table_forbids_are_refused(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    store.create(new("T1", "t", "q", 50, None, None), "test").await.unwrap();
    // Not held: a step of a PENDING instance may not start.
    let e = store.step_start("T1", 0, "1.0.0", &json!({})).await.unwrap_err();
    assert!(e.to_string().contains("is PENDING"), "{e}");
    assert!(matches!(store.finish_rolled_back("T1").await, Err(StoreError::Illegal(_))));
    store.claim(1, lease(), QueuePolicy::default()).await.unwrap();
    store.step_start("T1", 0, "1.0.0", &json!({})).await.unwrap();
    store.step_success("T1", 0, &json!({"n": 1}).to_string(), Then::Nothing).await.unwrap();
    store.finish_success("T1").await.unwrap();
    // SUCCESS is final.
    assert!(matches!(store.manual_retry("T1", "again", "op").await, Err(StoreError::Illegal(_))));
    let inst = store.get("T1").await.unwrap();
    assert_eq!(inst.state, TaskState::Success);
    // The context is made again from the row and the steps' outputs.
    assert_eq!(inst.context["steps"], json!({"a": {"n": 1}}));
    assert_eq!((inst.context["task_id"].as_str(), inst.context["trace_id"].as_str()), (Some("T1"), Some("trace-T1")));
    assert_eq!(inst.lease_owner, None, "a finished instance is held by nobody");
    store.close();
}

async fn a_steps_success_starts_the_next_step_or_ends_the_instance_in_one_write(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    let mut two = new("S1", "t", "q", 50, None, None);
    two.steps.push(("b".into(), "sleep".into()));
    store.create(two, "test").await.unwrap();
    store.claim(1, lease(), QueuePolicy::default()).await.unwrap();
    store.step_start("S1", 0, "1.0.0", &json!({})).await.unwrap();
    let start = Then::Start { seq: 1, version: "1.0.0", params: &json!({"p": 1}) };
    let followed = store.step_success("S1", 0, &json!({"n": 1}).to_string(), start).await.unwrap();
    assert_eq!(followed, Followed::Started(1));
    let inst = store.get("S1").await.unwrap();
    let steps = inst.steps.clone().unwrap();
    assert_eq!((steps[0].state, steps[1].state), (StepState::Success, StepState::Running));
    assert_eq!(steps[1].params, Some(json!({"p": 1})));
    assert_eq!(inst.context["steps"], json!({"a": {"n": 1}}));
    // A follow-up the table refuses (step 0 cannot start again: it is
    // SUCCESS) leaves the step's SUCCESS recorded, and says nothing followed.
    let again = Then::Start { seq: 0, version: "1.0.0", params: &json!({}) };
    let followed = store.step_success("S1", 1, &json!({}).to_string(), again).await.unwrap();
    assert_eq!(followed, Followed::Nothing);
    let inst = store.get("S1").await.unwrap();
    assert_eq!(inst.steps.as_ref().unwrap()[1].state, StepState::Success);
    assert_eq!(inst.state, TaskState::Running);
    // The history has each move once, in order.
    let moves: Vec<(Option<u32>, String)> = inst.transitions.unwrap().into_iter().map(|h| (h.step, h.to)).collect();
    let want = [
        (None, "PENDING"),
        (None, "RUNNING"),
        (Some(0), "RUNNING"),
        (Some(0), "SUCCESS"),
        (Some(1), "RUNNING"),
        (Some(1), "SUCCESS"),
    ];
    assert_eq!(moves, want.map(|(s, m)| (s, m.to_string())));

    // The last step's SUCCESS ends the instance in the same write.
    store.create(new("S2", "t", "q", 50, None, None), "test").await.unwrap();
    store.claim(1, lease(), QueuePolicy::default()).await.unwrap();
    store.step_start("S2", 0, "1.0.0", &json!({})).await.unwrap();
    let followed = store.step_success("S2", 0, &json!({}).to_string(), Then::Finish).await.unwrap();
    assert_eq!(followed, Followed::Finished);
    let inst = store.get("S2").await.unwrap();
    assert_eq!(inst.state, TaskState::Success);
    assert_eq!(inst.lease_owner, None);
    store.close();
}

/// Steps' SUCCESS writes of many instances at once: on PostgreSQL those of
/// one batch are made in one statement. Each instance moves exactly as its
/// write alone would, whatever follows it; a refused one is refused alone.
async fn steps_successes_written_together_move_each_instance_as_alone(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    let n = 60;
    for i in 0..n {
        let mut two = new(&format!("M{i:03}"), "t", "q", 50, None, None);
        two.steps.push(("b".into(), "sleep".into()));
        store.create(two, "test").await.unwrap();
    }
    assert_eq!(store.claim(n, lease(), QueuePolicy::default()).await.unwrap().len(), n);
    // Every fourth instance's step 0 is left PENDING: its SUCCESS is refused.
    for i in (0..n).filter(|i| i % 4 != 3) {
        store.step_start(&format!("M{i:03}"), 0, "1.0.0", &json!({})).await.unwrap();
    }
    let merged = || apollo_agent::metrics::get().merged_writes.get();
    let before = merged();
    // Two rounds: the instances whose writes all succeed, then all of them
    // (the refused ones fail their batches, which run again one by one).
    for round in [|i: usize| i % 4 != 3, |_| true] {
        let mut handles = Vec::new();
        for i in (0..n).filter(|i| round(*i)) {
            let s = store.clone();
            handles.push(tokio::spawn(async move {
                let (id, output, params) = (format!("M{i:03}"), json!({"i": i}), json!({"p": i}));
                let then = match i % 4 {
                    0 => Then::Start { seq: 1, version: "2.0.0", params: &params },
                    1 => Then::Finish,
                    _ => Then::Nothing,
                };
                (i, s.step_success(&id, 0, &output.to_string(), then).await)
            }));
        }
        for h in handles {
            let (i, followed) = h.await.unwrap();
            let want = match i % 4 {
                0 => Followed::Started(1),
                1 => Followed::Finished,
                _ => Followed::Nothing,
            };
            match followed {
                Err(StoreError::Illegal(e)) if i % 4 == 3 => assert!(e.to_string().contains("PENDING -> SUCCESS")),
                // The second round's writes for instances done in the first.
                Err(StoreError::Illegal(_) | StoreError::Invalid(_)) if i % 4 != 3 => {}
                other => assert_eq!(other.unwrap(), want, "M{i:03}"),
            }
        }
        if db.schema.is_some() && merged() == before {
            panic!("no two SUCCESS writes were made together in one statement");
        }
    }
    for i in 0..n {
        let inst = store.get(&format!("M{i:03}")).await.unwrap();
        let steps = inst.steps.clone().unwrap();
        let moves: Vec<(Option<u32>, String)> =
            inst.transitions.clone().unwrap().into_iter().map(|h| (h.step, h.to)).collect();
        let mut want = vec![(None, "PENDING"), (None, "RUNNING")];
        if i % 4 != 3 {
            want.extend([(Some(0), "RUNNING"), (Some(0), "SUCCESS")]);
            assert_eq!(steps[0].output, Some(json!({"i": i})), "M{i:03}");
            assert_eq!(inst.context["steps"]["a"], json!({"i": i}), "M{i:03}");
        }
        match i % 4 {
            0 => {
                want.push((Some(1), "RUNNING"));
                assert_eq!((steps[1].state, steps[1].attempts), (StepState::Running, 1), "M{i:03}");
                assert_eq!(steps[1].params, Some(json!({"p": i})), "M{i:03}");
                assert_eq!(steps[1].plugin_version.as_deref(), Some("2.0.0"), "M{i:03}");
            }
            1 => {
                want.push((None, "SUCCESS"));
                assert_eq!((inst.state, inst.lease_owner.as_deref()), (TaskState::Success, None), "M{i:03}");
                assert!(inst.finished_at.is_some(), "M{i:03}");
            }
            _ => assert_eq!(inst.state, TaskState::Running, "M{i:03}"),
        }
        if i % 4 == 3 {
            assert_eq!(steps[0].state, StepState::Pending, "M{i:03}");
        }
        assert_eq!(moves, want.iter().map(|(s, m)| (*s, m.to_string())).collect::<Vec<_>>(), "M{i:03}");
    }
    let counts = store.counts().await.unwrap();
    assert_eq!((counts["SUCCESS"], counts["RUNNING"]), (15, 45), "{counts:?}");
    store.close();
}

/// A claim moves new and retrying instances together: each RUNNING, held
/// with a lease, the retry's attempt counted up, and each history row says
/// which it was.
async fn a_retry_is_claimed_as_the_next_attempt_with_its_lease(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    store.create(new("R1", "t", "q", 50, None, None), "test").await.unwrap();
    store.claim(1, lease(), QueuePolicy::default()).await.unwrap();
    store.step_start("R1", 0, "1.0.0", &json!({})).await.unwrap();
    let past = chrono::Utc::now() - chrono::Duration::seconds(1);
    let retry: apollo_agent::store::Decide = Box::new(move |_| (FailurePlan::Retry(past), "retry".into()));
    store.fail_step("R1", 0, "boom", true, retry).await.unwrap();
    store.create(new("N1", "t", "q", 50, None, None), "test").await.unwrap();
    // Each is made ready as the claim leaves it: the retry as its attempt 2.
    let ready = |i: &apollo_agent::store::Claimed| {
        let want = if i.id == "R1" { 2 } else { 1 };
        assert_eq!((i.state, i.attempt), (TaskState::Running, want), "{}", i.id);
        None::<((), String, String)>
    };
    let (claimed, _) = store.claim_starting(5, lease(), QueuePolicy::default(), ready).await.unwrap();
    let mut claimed: Vec<_> = claimed.into_iter().map(|(i, _)| i).collect();
    claimed.sort_by(|a, b| a.id.cmp(&b.id));
    let got: Vec<(&str, TaskState, u32)> = claimed.iter().map(|i| (i.id.as_str(), i.state, i.attempt)).collect();
    assert_eq!(got, [("N1", TaskState::Running, 1), ("R1", TaskState::Running, 2)]);
    for id in ["N1", "R1"] {
        let inst = store.get(id).await.unwrap();
        assert_eq!((inst.state, inst.lease_owner.as_deref()), (TaskState::Running, Some("agent:test")), "{id}");
        assert!(inst.lease_expires_at.is_some_and(|t| t > chrono::Utc::now()), "{id}: {inst:?}");
        let last = inst.transitions.unwrap().pop().unwrap();
        let want = if id == "R1" { ("RETRYING", "claimed for retry") } else { ("PENDING", "claimed") };
        assert_eq!((last.from.as_deref(), last.to.as_str(), last.reason.as_str()), (Some(want.0), "RUNNING", want.1));
    }
    store.close();
}

async fn a_create_claims_and_starts_its_first_step_in_one_write_when_nothing_comes_first(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    let terms = |limits: &[(&str, u32)]| {
        let limits = limits.iter().map(|(q, l)| (q.to_string(), *l)).collect();
        Some(ClaimTerms { lease: lease(), policy: QueuePolicy { limits, ..Default::default() } })
    };
    // What the write hands on of the instance it made and claimed is what
    // reading it back gives (SQLite makes it from what it wrote).
    let mut made = new("M1", "t", "elsewhere", 50, None, Some("m"));
    made.params = json!({"n": 2.5, "s": "x", "l": [1, null]}).as_object().unwrap().clone();
    made.context = json!({"work_root": "/w", "event": {"k": "v"}});
    made.steps.push(("b".into(), "shell".into()));
    made.locks = vec!["db".into()];
    let done = store.create_claiming(made, "test", terms(&[]), Then::Nothing).await.unwrap();
    let claimed = done.claimed.into_iter().next().expect("M1 claimed");
    let mut read = store.get("M1").await.unwrap();
    read.transitions = None;
    let (a, b) = (claimed.lease_expires_at.unwrap(), read.lease_expires_at.unwrap());
    assert!((a - b).num_milliseconds().abs() < 1000, "lease ends {a} and {b}");
    read.lease_expires_at = claimed.lease_expires_at;
    assert_eq!(claimed, read);

    let params = json!({"p": 1});
    let first = Then::Start { seq: 0, version: "1.0.0", params: &params };
    // Nothing waits: the new instance is claimed and its first step started.
    let done = store.create_claiming(new("N1", "t", "q", 50, None, None), "test", terms(&[]), first).await.unwrap();
    assert!(done.created);
    assert_eq!(done.claimed.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["N1"]);
    assert_eq!(done.followed, Followed::Started(1));
    let inst = store.get("N1").await.unwrap();
    assert_eq!(inst.state, TaskState::Running);
    assert_eq!(inst.lease_owner.as_deref(), Some("agent:test"));
    let step = &inst.steps.as_ref().unwrap()[0];
    assert_eq!((step.state, step.attempts, step.params.clone()), (StepState::Running, 1, Some(params.clone())));
    let moves: Vec<(Option<u32>, String)> = inst.transitions.unwrap().into_iter().map(|h| (h.step, h.to)).collect();
    let want = [(None, "PENDING"), (None, "RUNNING"), (Some(0), "RUNNING")];
    assert_eq!(moves, want.map(|(s, m)| (s, m.to_string())));

    // Something of higher priority waits: that is what the write claims, and
    // the new instance waits its turn with its first step not started.
    store.create(new("W1", "t", "q", 90, None, None), "test").await.unwrap();
    let done = store.create_claiming(new("N2", "t", "q", 50, None, None), "test", terms(&[]), first).await.unwrap();
    assert_eq!(done.claimed.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["W1"]);
    assert_eq!(done.followed, Followed::Nothing);
    let inst = store.get("N2").await.unwrap();
    assert_eq!((inst.state, inst.steps.unwrap()[0].state), (TaskState::Pending, StepState::Pending));
    assert_eq!(store.get("W1").await.unwrap().steps.unwrap()[0].state, StepState::Pending);

    // A full queue: nothing is claimed (N2 is the oldest waiting there).
    let done = store.create_claiming(new("N3", "t", "q", 99, None, None), "test", terms(&[("q", 2)]), first).await;
    let done = done.unwrap();
    assert!(done.created && done.claimed.is_empty() && done.followed == Followed::Nothing, "{done:?}");
    // A duplicate dedup key creates nothing and claims nothing.
    store.create(new("K1", "t", "other", 1, None, Some("k")), "test").await.unwrap();
    let done = store.create_claiming(new("K2", "t", "r", 1, None, Some("k")), "test", terms(&[]), first).await.unwrap();
    assert_eq!((done.id.as_str(), done.created, done.claimed.len()), ("K1", false, 0));
    store.close();
}

async fn a_claim_starts_the_first_steps_it_is_handed_in_the_same_write(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    for id in ["C1", "C2", "C3", "C4"] {
        store.create(new(id, "t", "q", 50, None, None), "test").await.unwrap();
    }
    // C2's first step is left to its executor; the others start with the
    // claim. Each is made ready as the claim leaves it.
    let ready = |i: &apollo_agent::store::Claimed| {
        assert_eq!((i.state, i.lease_owner.as_deref(), i.attempt), (TaskState::Running, Some("agent:test"), 1));
        (i.id != "C2").then(|| (i.id.clone(), "1.0.0".to_string(), json!({"for": i.id}).to_string()))
    };
    let (claimed, _) = store.claim_starting(3, lease(), QueuePolicy::default(), ready).await.unwrap();
    let got: Vec<(String, Option<(String, u32)>)> = claimed.into_iter().map(|(i, s)| (i.id, s)).collect();
    let started = |id: &str| (id.to_string(), Some((id.to_string(), 1)));
    assert_eq!(got, [started("C1"), ("C2".to_string(), None), started("C3")]);
    for id in ["C1", "C3"] {
        let inst = store.get(id).await.unwrap();
        let step = &inst.steps.as_ref().unwrap()[0];
        assert_eq!((step.state, step.attempts, step.params.clone()), (StepState::Running, 1, Some(json!({"for": id}))));
        let moves: Vec<(Option<u32>, String)> = inst.transitions.unwrap().into_iter().map(|h| (h.step, h.to)).collect();
        let want = [(None, "PENDING"), (None, "RUNNING"), (Some(0), "RUNNING")];
        assert_eq!(moves, want.map(|(s, m)| (s, m.to_string())), "{id}");
    }
    let c2 = store.get("C2").await.unwrap();
    assert_eq!((c2.state, c2.steps.unwrap()[0].state), (TaskState::Running, StepState::Pending));
    let (rest, waiting) = store.claim_starting(5, lease(), QueuePolicy::default(), ready).await.unwrap();
    assert_eq!((rest.len(), waiting), (1, false), "C4 claimed, nothing left");
    store.close();
}

async fn finished_instances_past_retention_move_to_the_archive_and_stay_readable(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    store.create(new("OLD", "t", "q", 50, None, None), "test").await.unwrap();
    store.create(new("LIVE", "t", "q", 50, None, None), "test").await.unwrap();
    store.claim(1, lease(), QueuePolicy::default()).await.unwrap();
    let first = store.list(apollo_agent::store::ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    let running = first.iter().find(|i| i.state == TaskState::Running).unwrap().id.clone();
    store.step_start(&running, 0, "1.0.0", &json!({})).await.unwrap();
    store.step_success(&running, 0, &json!({"ok": true}).to_string(), Then::Nothing).await.unwrap();
    store.finish_success(&running).await.unwrap();
    // Everything finished before "now + 1s" is past a zero retention window.
    let moved = store.archive(chrono::Utc::now() + chrono::Duration::seconds(1), 100).await.unwrap();
    assert_eq!(moved, 1);
    let counts = store.counts().await.unwrap();
    assert_eq!((counts["SUCCESS"], counts["PENDING"]), (0, 1), "only the finished one moved");
    let archived = store.get(&running).await.unwrap();
    assert_eq!(archived.state, TaskState::Success);
    assert_eq!(archived.steps.unwrap()[0].output, Some(json!({"ok": true})));
    assert!(archived.transitions.unwrap().len() >= 5, "the history moved with it");
    store.close();
}

async fn dedicated_and_ordered_queues_shape_the_claims(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    // O1..O3 in an ordered queue: O3 has the highest priority, yet O1 (the
    // oldest) goes first and alone. X1 is in a queue dedicated elsewhere.
    store.create(new("O1", "ord", "serial", 25, None, None), "test").await.unwrap();
    store.create(new("O2", "ord", "serial", 50, None, None), "test").await.unwrap();
    store.create(new("O3", "ord", "serial", 90, None, None), "test").await.unwrap();
    store.create(new("X1", "other", "special", 99, None, None), "test").await.unwrap();
    let policy = QueuePolicy { excluded: vec!["special".into()], ordered: vec!["serial".into()], ..Default::default() };
    let ids = |v: Vec<apollo_shared::protocol::Instance>| v.into_iter().map(|i| i.id).collect::<Vec<_>>();
    assert_eq!(ids(store.claim(10, lease(), policy.clone()).await.unwrap()), ["O1"]);
    assert!(store.claim(10, lease(), policy.clone()).await.unwrap().is_empty(), "O2 waits for O1");
    store.step_start("O1", 0, "1.0.0", &json!({})).await.unwrap();
    store.step_success("O1", 0, &json!({}).to_string(), Then::Nothing).await.unwrap();
    store.finish_success("O1").await.unwrap();
    assert_eq!(ids(store.claim(10, lease(), policy.clone()).await.unwrap()), ["O2"]);
    // The agent the queue is dedicated to claims X1.
    let mine = QueuePolicy { ordered: vec!["serial".into()], ..Default::default() };
    assert_eq!(ids(store.claim(10, lease(), mine).await.unwrap()), ["X1"]);
    store.close();
}

/// PostgreSQL only: what one agent announces reaches another agent on the
/// schema, whatever its text holds — quotes, or the tag that quotes the
/// notification when it rides with the commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announcements_reach_the_other_agents_whatever_their_text() {
    use apollo_shared::protocol::{EventData, Raised, Topic};
    let db = TestDb::postgres("announcements");
    let a = db.open();
    let location = db.location();
    let b =
        std::thread::spawn(move || Store::open_at(location, Bus::default(), "agent:b".into())).join().unwrap().unwrap();
    let mut heard = b.bus().subscribe();
    let (listening_tx, mut listening) = tokio::sync::mpsc::unbounded_channel();
    let stop = tokio_util::sync::CancellationToken::new();
    let wake = std::sync::Arc::new(move |_| {
        let _ = listening_tx.send(());
    });
    let tasks = apollo_agent::shutdown::Shutdown::new(stop.clone());
    let _listener = b.listen(wake, &tasks).expect("a PostgreSQL store listens");
    // B listens (it wakes its scheduler once LISTEN is in place).
    tokio::time::timeout(std::time::Duration::from_secs(10), listening.recv()).await.expect("B listens");
    let texts = ["it's a plain one", "holds $apollo_note$ and ends with $apollo_note$", "a \\ back'slash"];
    for t in texts {
        let raised = Raised { kind: AlertKind::Other, message: t.to_string(), instance: None };
        a.announce(Topic::Alerts, EventData::AlertRaised(raised));
    }
    let mut got = Vec::new();
    while got.len() < texts.len() {
        let ev = tokio::time::timeout(std::time::Duration::from_secs(10), heard.recv())
            .await
            .unwrap_or_else(|_| panic!("B heard only {got:?}"))
            .unwrap();
        if ev.topic == Topic::Alerts {
            got.push(ev.data.json()["message"].as_str().unwrap().to_string());
        }
    }
    // Each in its own write: the writers may commit them in any order.
    got.sort();
    let mut want = texts.map(str::to_string).to_vec();
    want.sort();
    assert_eq!(got, want);
    stop.cancel();
    a.close();
    b.close();
}

/// SQLite numbers history rows from the clock: after a restart with the
/// clock gone back, an unfinished instance's new rows still come after its
/// old ones (the numbering starts above them at open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_an_instances_history_stays_in_order_across_a_restart_with_the_clock_gone_back() {
    let db = TestDb::sqlite();
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    store.create(new("K1", "t", "q", 50, None, None), "test").await.unwrap();
    store.close();
    // A row written while the clock was an hour ahead of where it is now.
    let ahead = chrono::Utc::now().timestamp_micros() + 3_600_000_000;
    let c = rusqlite::Connection::open(db.dir.path().join("apollo.db")).unwrap();
    c.execute(
        "INSERT INTO transitions (instance_id, id, step_seq, from_state, to_state, reason, actor, at) \
         VALUES ('K1', ?1, NULL, 'PENDING', 'PENDING', 'written an hour ahead', 'agent:test', ?1)",
        [ahead],
    )
    .unwrap();
    drop(c);
    let store = db.open();
    store.claim(1, lease(), QueuePolicy::default()).await.unwrap();
    let inst = store.get("K1").await.unwrap();
    let reasons: Vec<String> = inst.transitions.unwrap().into_iter().map(|t| t.reason).collect();
    assert_eq!(
        reasons[reasons.len() - 2..],
        ["written an hour ahead".to_string(), "claimed".to_string()],
        "{reasons:?}"
    );
    store.close();
}
