//! Writes: batches and their failures, dedup keys, recovery, the
//! append-only history, the schema's version, the transition table, steps'
//! successes, the archive.

use super::*;

pub(super) async fn one_failing_write_does_not_fail_its_batch_mates(db: TestDb) {
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

pub(super) async fn a_dedup_key_creates_one_instance(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    let (a, created_a) = store.create(new("D1", "t", "q", 50, None, Some("k")), "test").await.unwrap();
    let (b, created_b) = store.create(new("D2", "t", "q", 50, None, Some("k")), "test").await.unwrap();
    assert_eq!((a.as_str(), created_a, b.as_str(), created_b), ("D1", true, "D1", false));
    assert_eq!(store.counts().await.unwrap()["PENDING"], 1);
    store.close();
}

pub(super) async fn recovery_takes_running_instances_and_marks_interrupted_steps(db: TestDb) {
    {
        let store = db.open();
        store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
        store.create(new("R1", "t", "q", 50, None, None), "test").await.unwrap();
        claim_and_start(&store, "R1").await;
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

pub(super) async fn the_history_is_append_only(db: TestDb) {
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
    for sql in ["UPDATE transitions SET actor = 'rewritten'", "DELETE FROM transitions"] {
        let e = refused(sql);
        assert!(e.contains("append-only"), "{sql}: {e}");
    }
}

pub(super) async fn a_schema_newer_than_the_build_is_refused(db: TestDb) {
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

pub(super) async fn transitions_the_table_forbids_are_refused(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    store.create(new("T1", "t", "q", 50, None, None), "test").await.unwrap();
    // Not held: a step of a PENDING instance may not start.
    let e = store.step_start("T1", 0, "1.0.0", &json!({})).await.unwrap_err();
    assert!(e.to_string().contains("is PENDING"), "{e}");
    assert!(matches!(store.finish_rolled_back("T1").await, Err(StoreError::Illegal(_))));
    claim_and_start(&store, "T1").await;
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

pub(super) async fn a_steps_success_starts_the_next_step_or_ends_the_instance_in_one_write(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    let mut two = new("S1", "t", "q", 50, None, None);
    two.steps.push(("b".into(), "sleep".into()));
    store.create(two, "test").await.unwrap();
    claim_and_start(&store, "S1").await;
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
    claim_and_start(&store, "S2").await;
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
pub(super) async fn steps_successes_written_together_move_each_instance_as_alone(db: TestDb) {
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

pub(super) async fn finished_instances_past_retention_move_to_the_archive_and_stay_readable(db: TestDb) {
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
