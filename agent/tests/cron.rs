//! Scheduled triggers with an injected clock, on a real store: fires on
//! time, catch-up policies after downtime, no duplicate across a restart or
//! a clock going back, daylight-saving transitions.

use apollo_agent::bus::Bus;
use apollo_agent::catalog::{self, Catalog};
use apollo_agent::config::Config;
use apollo_agent::plugins::{Plugins, Registry};
use apollo_agent::scheduler::Scheduler;
use apollo_agent::settings::Settings;
use apollo_agent::store::{ListFilter, Store};
use apollo_agent::triggers::clock::ManualClock;
use apollo_agent::triggers::cron::CronRunner;
use apollo_agent::triggers::Triggers;
use chrono::{DateTime, Utc};
use std::sync::{Arc, RwLock};
use tokio_util::sync::CancellationToken;

fn t(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

struct Rig {
    _dir: tempfile::TempDir,
    store: Store,
    clock: Arc<ManualClock>,
    runner: CronRunner,
}

/// An agent's trigger path in-process: store, catalog, scheduler (not
/// running, so instances stay PENDING and can be counted), cron runner.
fn rig(dir: tempfile::TempDir, defs: &[(&str, &str)], start: DateTime<Utc>) -> Rig {
    let tasks = dir.path().join("tasks");
    std::fs::create_dir_all(&tasks).unwrap();
    for (file, yaml) in defs {
        std::fs::write(tasks.join(file), yaml).unwrap();
    }
    let config = Config { tasks: Some(tasks.clone()), data_dir: Some(dir.path().join("data")), ..Default::default() };
    let store = Store::open(&dir.path().join("data/apollo.db"), true, Bus::default(), "agent:test".into()).unwrap();
    let registry = Arc::new(Plugins::new(Registry::new(&[], &Default::default()), "test"));
    let cat: Catalog = catalog::load_dir(&tasks, &registry.get());
    assert!(cat.errors.is_empty(), "{:?}", cat.errors);
    let catalog = Arc::new(RwLock::new(cat));
    let scheduler =
        Scheduler::new(store.clone(), catalog, registry, Arc::new(Settings::new(config)), CancellationToken::new());
    let triggers = Arc::new(Triggers::new(scheduler.handles()));
    let clock = Arc::new(ManualClock::new(start));
    let runner = CronRunner::new(triggers, clock.clone(), Default::default());
    Rig { _dir: dir, store, clock, runner }
}

async fn instances(store: &Store, task: &str) -> Vec<String> {
    let list = store.list(ListFilter { task: Some(task.into()), limit: 1000, ..Default::default() }).await.unwrap();
    let mut keys: Vec<String> = list.into_iter().map(|i| i.dedup_key.unwrap_or_default()).collect();
    keys.sort();
    keys
}

const DAILY: &str = "task: daily\nschedule: '0 6 * * *'\ntimezone: UTC\nsteps:\n  - plugin: sleep\n";

#[tokio::test]
async fn a_schedule_fires_on_time_once() {
    let r = rig(tempfile::tempdir().unwrap(), &[("d.yaml", DAILY)], t("2026-06-01T05:59:58Z"));
    let next = r.runner.tick().await;
    assert_eq!(next, Some(t("2026-06-01T06:00:00Z")));
    assert!(instances(&r.store, "daily").await.is_empty());
    r.clock.set(t("2026-06-01T05:59:59Z"));
    r.runner.tick().await;
    assert!(instances(&r.store, "daily").await.is_empty(), "fired early");
    r.clock.set(t("2026-06-01T06:00:00Z"));
    let next = r.runner.tick().await;
    assert_eq!(instances(&r.store, "daily").await, ["cron:daily:2026-06-01T06:00:00+00:00"]);
    assert_eq!(next, Some(t("2026-06-02T06:00:00Z")));
    r.runner.tick().await;
    assert_eq!(instances(&r.store, "daily").await.len(), 1, "fired twice");
}

#[tokio::test]
async fn catch_up_after_downtime_follows_each_policy() {
    let defs = [
        ("skip.yaml", "task: skip\nschedule: '0 6 * * *'\ntimezone: UTC\ncatchup: skip\nsteps:\n  - plugin: sleep\n"),
        ("latest.yaml", "task: latest\nschedule: '0 6 * * *'\ntimezone: UTC\nsteps:\n  - plugin: sleep\n"),
        ("all.yaml", "task: all\nschedule: '0 6 * * *'\ntimezone: UTC\ncatchup: all\nsteps:\n  - plugin: sleep\n"),
    ];
    let r = rig(tempfile::tempdir().unwrap(), &defs, t("2026-01-01T12:00:00Z"));
    r.runner.tick().await;
    // The agent is down for three days and comes back at 09:00.
    r.clock.set(t("2026-01-04T09:00:00Z"));
    r.runner.tick().await;
    assert!(instances(&r.store, "skip").await.is_empty());
    assert_eq!(instances(&r.store, "latest").await, ["cron:latest:2026-01-04T06:00:00+00:00"]);
    assert_eq!(
        instances(&r.store, "all").await,
        [
            "cron:all:2026-01-02T06:00:00+00:00",
            "cron:all:2026-01-03T06:00:00+00:00",
            "cron:all:2026-01-04T06:00:00+00:00"
        ]
    );
    // Back on schedule, every policy fires on time.
    r.clock.set(t("2026-01-05T06:00:00Z"));
    r.runner.tick().await;
    for task in ["skip", "latest", "all"] {
        assert!(instances(&r.store, task).await.iter().any(|k| k.ends_with("2026-01-05T06:00:00+00:00")), "{task}");
    }
}

#[tokio::test]
async fn no_duplicate_when_the_agent_restarts_around_a_fire_or_the_clock_goes_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let r = rig(dir, &[("d.yaml", DAILY)], t("2026-06-01T05:00:00Z"));
    r.runner.tick().await;
    r.clock.set(t("2026-06-01T06:00:00Z"));
    r.runner.tick().await;
    // As if the agent died after creating the instance but before recording
    // the fire: the schedule state still says 05:00.
    r.store.set_cron_fire("daily", t("2026-06-01T05:00:00Z")).await.unwrap();
    r.store.close();
    drop(r.runner);
    let again = Store::open(&path.join("data/apollo.db"), true, Bus::default(), "agent:test".into()).unwrap();
    assert_eq!(instances(&again, "daily").await.len(), 1);
    again.close();
    let r2 = rig(r._dir, &[("d.yaml", DAILY)], t("2026-06-01T06:00:30Z"));
    r2.runner.tick().await;
    assert_eq!(
        instances(&r2.store, "daily").await,
        ["cron:daily:2026-06-01T06:00:00+00:00"],
        "the restart created a duplicate"
    );
    // The clock goes back an hour: nothing fires again.
    r2.clock.set(t("2026-06-01T05:10:00Z"));
    r2.runner.tick().await;
    r2.clock.set(t("2026-06-01T06:00:00Z"));
    r2.runner.tick().await;
    assert_eq!(instances(&r2.store, "daily").await.len(), 1, "fired again after the clock went back");
}

#[tokio::test]
async fn daylight_saving_forward_and_back_fire_once_a_day() {
    let berlin = "task: berlin\nschedule: '30 2 * * *'\ntimezone: Europe/Berlin\nsteps:\n  - plugin: sleep\n";
    let r = rig(tempfile::tempdir().unwrap(), &[("b.yaml", berlin)], t("2026-03-28T12:00:00Z"));
    r.runner.tick().await;
    // Walk the clock through the spring-forward night in 10-minute steps.
    let mut now = t("2026-03-28T12:00:00Z");
    while now < t("2026-03-30T12:00:00Z") {
        now += chrono::Duration::minutes(10);
        r.clock.set(now);
        r.runner.tick().await;
    }
    assert_eq!(
        instances(&r.store, "berlin").await,
        ["cron:berlin:2026-03-29T01:00:00+00:00", "cron:berlin:2026-03-30T00:30:00+00:00"],
        "02:30 does not exist on 29 March: it fires once, at 03:00 CEST"
    );
    // And through the fall-back night, when 02:30 happens twice.
    r.clock.set(t("2026-10-24T12:00:00Z"));
    r.store.set_cron_fire("berlin", t("2026-10-24T12:00:00Z")).await.unwrap();
    let mut now = t("2026-10-24T12:00:00Z");
    while now < t("2026-10-26T12:00:00Z") {
        now += chrono::Duration::minutes(10);
        r.clock.set(now);
        r.runner.tick().await;
    }
    let autumn: Vec<String> =
        instances(&r.store, "berlin").await.into_iter().filter(|k| k.contains("2026-10")).collect();
    assert_eq!(autumn, ["cron:berlin:2026-10-25T00:30:00+00:00", "cron:berlin:2026-10-26T01:30:00+00:00"]);
}

#[tokio::test]
async fn catch_up_all_is_bounded_by_catchup_max_keeping_the_latest_fires() {
    let all = "task: all\nschedule: '0 6 * * *'\ntimezone: UTC\ncatchup: all\nsteps:\n  - plugin: sleep\n";
    let r = rig(tempfile::tempdir().unwrap(), &[("all.yaml", all)], t("2026-01-01T12:00:00Z"));
    let h = &r.runner.triggers.h;
    let mut config = (*h.config()).clone();
    config.scheduler.catchup_max = 2;
    h.settings.apply(config);
    r.runner.tick().await;
    r.clock.set(t("2026-01-06T09:00:00Z"));
    r.runner.tick().await;
    assert_eq!(
        instances(&r.store, "all").await,
        ["cron:all:2026-01-05T06:00:00+00:00", "cron:all:2026-01-06T06:00:00+00:00"]
    );
}
