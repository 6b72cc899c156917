//! Claims: by priority then age within limits, retries, locks, queues,
//! and the first step started in the claim's write.

use super::*;

pub(super) async fn a_claim_takes_all_of_an_instances_locks_or_none_and_an_end_releases_them(db: TestDb) {
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

pub(super) async fn a_lock_is_kept_through_a_backoff_and_waited_for_after_a_manual_retry(db: TestDb) {
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

pub(super) async fn claims_go_by_priority_then_age_within_queue_and_task_limits(db: TestDb) {
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

/// A claim moves new and retrying instances together: each RUNNING, held
/// with a lease, the retry's attempt counted up, and each history row says
/// which it was.
pub(super) async fn a_retry_is_claimed_as_the_next_attempt_with_its_lease(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    store.create(new("R1", "t", "q", 50, None, None), "test").await.unwrap();
    claim_and_start(&store, "R1").await;
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

pub(super) async fn a_create_claims_and_starts_its_first_step_in_one_write_when_nothing_comes_first(db: TestDb) {
    let store = db.open();
    store.put_def("h1", "t", "t.yaml", "task: t").await.unwrap();
    let terms = |limits: &[(&str, u32)]| {
        let limits = limits.iter().map(|(q, l)| (q.to_string(), *l)).collect();
        Some(ClaimTerms { lease: lease(), policy: QueuePolicy { limits, ..Default::default() } })
    };
    // What the write hands on of the instance it made and claimed is what
    // reading it back gives (SQLite makes it from what it wrote), its
    // context as kept: the whole one made of it is the one read back.
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
    assert_eq!(claimed.context, json!({"work_root": "/w", "event": {"k": "v"}}));
    assert_eq!(Context::of(&claimed).to_value(), read.context);
    read.context = claimed.context.clone();
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

pub(super) async fn a_claim_starts_the_first_steps_it_is_handed_in_the_same_write(db: TestDb) {
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

pub(super) async fn dedicated_and_ordered_queues_shape_the_claims(db: TestDb) {
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
