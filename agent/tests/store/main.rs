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
use apollo_shared::context::Context;
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

mod claims;
mod writes;
use claims::*;
use writes::*;

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
    the_counts_follow_every_move_and_the_archive,
);

/// `agent.status`'s counts per state equal the instances in each, through
/// every kind of move (create, claim, success, a stop, a retry's backoff, a
/// rollback) and the archive taking the ended ones away — on SQLite the
/// ended states are kept by triggers and the live ones counted when read
/// (schema 27), so both halves are checked.
async fn the_counts_follow_every_move_and_the_archive(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    for id in ["C0", "C1", "C2", "C3", "C4", "C5"] {
        store.create(new(id, "t", "q", 50, None, None), "test").await.unwrap();
    }
    store.claim(5, lease(), QueuePolicy::default()).await.unwrap();
    let listed = store.list(apollo_agent::store::ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    let running: Vec<String> = listed.into_iter().filter(|i| i.state == TaskState::Running).map(|i| i.id).collect();
    assert_eq!(running.len(), 5);
    store.step_start(&running[0], 0, "1.0.0", &json!({})).await.unwrap();
    store.step_success(&running[0], 0, "{}", Then::Finish).await.unwrap();
    store.fail(&running[1], "stop", FailurePlan::Stop, "test").await.unwrap();
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    store.fail(&running[2], "again", FailurePlan::Retry(later), "test").await.unwrap();
    store.fail(&running[3], "undo", FailurePlan::Rollback, "test").await.unwrap();
    store.finish_rolled_back(&running[3]).await.unwrap();
    counted(
        &store,
        [("PENDING", 1), ("RUNNING", 1), ("SUCCESS", 1), ("FAILED", 1), ("RETRYING", 1), ("ROLLED_BACK", 1)],
    )
    .await;
    // The ended ones (SUCCESS, ROLLED_BACK, the stopped FAILED) leave.
    let moved = store.archive(chrono::Utc::now() + chrono::Duration::seconds(1), 100).await.unwrap();
    assert_eq!(moved, 3);
    counted(
        &store,
        [("PENDING", 1), ("RUNNING", 1), ("SUCCESS", 0), ("FAILED", 0), ("RETRYING", 1), ("ROLLED_BACK", 0)],
    )
    .await;
    store.close();
}

/// The store's counts per state are `want`, and so are its instances listed.
async fn counted(store: &Store, want: [(&str, u64); 6]) {
    let counts = store.counts().await.unwrap();
    let listed = store.list(apollo_agent::store::ListFilter { limit: 100, ..Default::default() }).await.unwrap();
    for (state, n) in want {
        let seen = listed.iter().filter(|i| i.state.as_str() == state).count() as u64;
        assert_eq!((state, counts[state], seen), (state, n, n), "{counts:?}");
    }
}

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

/// Claims the one instance waiting, `id`, and starts its first step.
async fn claim_and_start(store: &Store, id: &str) {
    store.claim(1, lease(), QueuePolicy::default()).await.unwrap();
    store.step_start(id, 0, "1.0.0", &json!({})).await.unwrap();
}

fn lease() -> std::time::Duration {
    std::time::Duration::from_secs(30)
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
        "INSERT INTO transitions (instance_id, id, step_seq, from_code, to_code, reason_code, actor, at_lag) \
         VALUES ('K1', ?1, NULL, 'PENDING', 'PENDING', 'written an hour ahead', 'agent:test', 0)",
        [ahead],
    )
    .unwrap();
    drop(c);
    let store = db.open();
    store.claim(1, lease(), QueuePolicy::default()).await.unwrap();
    // The claim's row keeps its states and reason as codes, and its time as
    // how far it lies behind its number: here an hour, as the number went
    // on above the row written ahead (schema 26). The row written above
    // keeps its text.
    let c = rusqlite::Connection::open(db.dir.path().join("apollo.db")).unwrap();
    let sql = "SELECT typeof(to_code), typeof(reason_code), to_state, at_lag, at FROM transitions \
               WHERE instance_id = 'K1' ORDER BY id";
    let kept: Vec<(String, String, String, i64, i64)> = c
        .prepare(sql)
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let [.., ahead_row, claimed] = &kept[..] else { panic!("{kept:?}") };
    assert_eq!(
        (ahead_row.0.as_str(), ahead_row.1.as_str(), ahead_row.2.as_str(), ahead_row.3),
        ("text", "text", "PENDING", 0)
    );
    assert_eq!((claimed.0.as_str(), claimed.1.as_str(), claimed.2.as_str()), ("integer", "integer", "RUNNING"));
    assert!(claimed.3 > 3_590_000_000, "{kept:?}");
    assert!((claimed.4 - chrono::Utc::now().timestamp_micros()).abs() < 60_000_000, "{kept:?}");
    drop(c);
    let inst = store.get("K1").await.unwrap();
    let reasons: Vec<String> = inst.transitions.unwrap().into_iter().map(|t| t.reason).collect();
    assert_eq!(
        reasons[reasons.len() - 2..],
        ["written an hour ahead".to_string(), "claimed".to_string()],
        "{reasons:?}"
    );
    store.close();
}
