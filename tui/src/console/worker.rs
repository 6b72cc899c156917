//! The agent worker: owns the connection, off the UI's path. It connects
//! (reconnecting with backoff and saying so), subscribes, loads what the
//! views show, refreshes it when the agent pushes a change (debounced — no
//! polling loop), and runs the console's actions. It reports through
//! [`News`] values; the UI reads the latest.

use super::app::{Cmd, FleetState, News};

use crate::client::{Client, ClientError, Target};
use apollo_shared::protocol::methods as m;
use apollo_shared::protocol::{EventKind, IdParams, LimitParams, ListParams, LogsParams, NoParams, StatsParams, Topic};
use apollo_shared::state::StepState;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::mpsc;

mod requests;
use requests::{lost, Ended};

/// Changes are coalesced for this long before the views are refreshed.
const DEBOUNCE: Duration = Duration::from_millis(150);

#[derive(Default)]
struct Watch {
    query: ListParams,
    instance: Option<String>,
    /// The logs pane is open on this instance: its logs are followed.
    logs: Option<u32>,
}

/// An instance's logs being followed for the logs pane: where each step's
/// log was read up to.
struct Following {
    id: String,
    offsets: HashMap<u32, u64>,
    /// Nothing sent yet: the first text replaces what the pane held.
    fresh: bool,
    /// The step the last round waited on, while it still runs.
    running: Option<u32>,
}

/// How long one `steps.logs` call waits for the followed log to grow (the
/// agent answers at once when it does, or when the attempt ends).
const FOLLOW_WAIT_MS: u64 = 10_000;

/// A round of following as it ended: the follow, and the text it read with
/// whether a step runs.
type Round = (Following, Result<(String, bool), ClientError>);

/// One round of following: what every step's log holds past its offset,
/// then (when a step runs and nothing was new) a wait for it to grow. The
/// text comes in the order it was read, each attempt opened by the agent's
/// `[apollo: step NAME, attempt N]` line. Also says whether a step runs
/// (then the next round starts at once; else at the instance's next move).
async fn follow_round(client: &Client, mut f: Following) -> Round {
    async fn read(
        client: &Client,
        f: &mut Following,
        seq: u32,
        wait_ms: Option<u64>,
    ) -> Result<(String, Option<StepState>), ClientError> {
        let offset = f.offsets.get(&seq).copied().unwrap_or(0);
        let p = LogsParams { id: f.id.clone(), step: seq.into(), offset: Some(offset), wait_ms, item: None };
        let r = client.request::<m::StepsLogs>(p).await?;
        f.offsets.insert(seq, r.next_offset);
        Ok((r.text, r.step_state))
    }
    // While the step it waited on still runs, the next round waits on it
    // again without reading the instance (`f.running`).
    if let Some(seq) = f.running.take() {
        return match read(client, &mut f, seq, Some(FOLLOW_WAIT_MS)).await {
            Ok((text, state)) => {
                f.running = (state == Some(StepState::Running)).then_some(seq);
                (f, Ok((text, true)))
            }
            Err(e) => (f, Err(e)),
        };
    }
    let r = async {
        let inst = client.request::<m::TasksGet>(IdParams { id: f.id.clone(), reason: None }).await?;
        let steps = inst.steps.unwrap_or_default();
        let mut text = String::new();
        for s in steps.iter().filter(|s| s.attempts > 0) {
            text.push_str(&read(client, &mut f, s.seq, None).await?.0);
        }
        let running = steps.iter().find(|s| s.state == StepState::Running);
        if let (Some(s), true) = (running, text.is_empty()) {
            let (more, state) = read(client, &mut f, s.seq, Some(FOLLOW_WAIT_MS)).await?;
            text.push_str(&more);
            f.running = (state == Some(StepState::Running)).then_some(s.seq);
        }
        Ok((text, running.is_some()))
    }
    .await;
    (f, r)
}

pub async fn run(target: Target, mut cmds: mpsc::Receiver<Cmd>, news: mpsc::Sender<News>) {
    let mut watch = Watch { query: ListParams { limit: Some(200), ..Default::default() }, ..Default::default() };
    let mut attempt = 0u32;
    loop {
        let _ = news.send(News::Connecting).await;
        let client = match target.connect().await {
            Ok(c) => c,
            Err(e) => {
                attempt += 1;
                let _ = news.send(News::Lost { attempt, reason: e.to_string() }).await;
                if !wait_backoff(attempt, &mut cmds, &news, &mut watch).await {
                    return;
                }
                continue;
            }
        };
        match session(&client, &mut cmds, &news, &mut watch).await {
            Ended::Quit => return,
            Ended::Lost(reason) => {
                attempt = 1;
                let _ = news.send(News::Lost { attempt, reason }).await;
                if !wait_backoff(attempt, &mut cmds, &news, &mut watch).await {
                    return;
                }
            }
        }
    }
}

/// Waits before the next connection attempt, answering commands meanwhile.
/// Returns false when the console quit.
async fn wait_backoff(
    attempt: u32,
    cmds: &mut mpsc::Receiver<Cmd>,
    news: &mpsc::Sender<News>,
    watch: &mut Watch,
) -> bool {
    let delay = Duration::from_millis(200 * 2u64.pow(attempt.min(5))).min(Duration::from_secs(5));
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = &mut sleep => return true,
            cmd = cmds.recv() => match cmd {
                None | Some(Cmd::Quit) => return false,
                Some(Cmd::Watch { query, instance, logs }) => *watch = Watch { query, instance, logs },
                Some(_) => {
                    let _ = news.send(News::Done(Err("not connected to the agent; reconnecting".into()))).await;
                }
            },
        }
    }
}

async fn session(
    client: &Client,
    cmds: &mut mpsc::Receiver<Cmd>,
    news: &mpsc::Sender<News>,
    watch: &mut Watch,
) -> Ended {
    let hello = match client.hello("apollo-tui").await {
        Ok(h) => h,
        Err(e) => return lost(e),
    };
    if let Err(e) = client.subscribe(&[Topic::Tasks, Topic::Defs, Topic::Alerts, Topic::Queues]).await {
        return lost(e);
    }
    let Some(mut events) = client.take_events() else { return Ended::Lost("no event stream".into()) };
    let _ = news.send(News::Connected(hello)).await;
    if let Err(e) = refresh(client, news, watch, true).await {
        return lost(e);
    }
    let mut due: Option<tokio::time::Instant> = None;
    let mut defs_changed = false;
    // The logs pane's instance, followed a round at a time: the round in
    // flight (kept across turns of the loop, so its wait on the agent is
    // not dropped and asked again), or the follow parked between rounds
    // until the instance moves.
    let mut followed: Option<String> = None;
    let mut round: Option<futures::future::BoxFuture<'_, Round>> = None;
    let mut parked: Option<Following> = None;
    let mut again = false;
    // What ended over the last hour is read from the store (`agent.stats`),
    // never counted from the news: right after the first views are filled,
    // again after instances change (at most every STATS_GAP, and never more
    // than a tenth of the time, so a big store is not read back to back),
    // and as each minute passes (the hour's window slides on).
    let mut stats = Throttle::new(tokio::time::Instant::now());
    let mut next_minute = tokio::time::Instant::now() + until_next_minute();
    loop {
        let want = watch.logs.and(watch.instance.clone());
        if want != followed {
            round = None;
            parked = want.clone().map(|id| Following { id, offsets: HashMap::new(), fresh: true, running: None });
            followed = want;
            again = true;
        }
        if round.is_none() && again {
            if let Some(f) = parked.take() {
                round = Some(Box::pin(follow_round(client, f)));
                again = false;
            }
        }
        let timer = async {
            match due {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ev = events.recv() => match ev {
                None => return Ended::Lost("the agent closed the connection".into()),
                Some(ev) => {
                    defs_changed |= matches!(ev.topic, Topic::Defs | Topic::Alerts) || ev.kind() == EventKind::Resync;
                    // The followed instance moved: a parked follow goes on.
                    again |= ev.kind() == EventKind::Resync || followed.as_deref().is_some_and(|id| ev.data.instance() == Some(id));
                    if matches!(ev.topic, Topic::Tasks) || ev.kind() == EventKind::Resync {
                        stats.want(tokio::time::Instant::now() + DEBOUNCE);
                    }
                    due.get_or_insert(tokio::time::Instant::now() + DEBOUNCE);
                    let _ = news.send(News::Event(ev)).await;
                }
            },
            _ = sleep_until(stats.due) => {
                let began = tokio::time::Instant::now();
                match client.request::<m::AgentStats>(StatsParams { minutes: Some(60) }).await {
                    Ok(s) => {
                        let _ = news.send(News::Stats(s)).await;
                    }
                    // An older agent has no agent.stats: the hour stays as it is.
                    Err(ClientError::Rpc(_)) => {}
                    Err(e) => return lost(e),
                }
                stats.done(began);
            }
            _ = tokio::time::sleep_until(next_minute) => {
                next_minute += Duration::from_secs(60);
                stats.want(tokio::time::Instant::now());
            }
            (mut f, r) = async { round.as_mut().expect("a round").await }, if round.is_some() => {
                round = None;
                match r {
                    Ok((text, running)) => {
                        if !text.is_empty() || f.fresh {
                            let _ = news.send(News::Logs { id: f.id.clone(), text, reset: f.fresh }).await;
                            f.fresh = false;
                        }
                        again = running;
                        parked = Some(f);
                    }
                    // An instance that went away (archived, a wrong id): nothing to follow.
                    Err(ClientError::Rpc(_)) => {}
                    Err(e) => return lost(e),
                }
            }
            _ = timer => {
                due = None;
                if let Err(e) = refresh(client, news, watch, std::mem::take(&mut defs_changed)).await {
                    return lost(e);
                }
            }
            cmd = cmds.recv() => {
                let Some(cmd) = cmd else { return Ended::Quit };
                match cmd {
                    Cmd::Quit => return Ended::Quit,
                    Cmd::Watch { query, instance, logs } => {
                        *watch = Watch { query, instance, logs };
                        if let Err(e) = refresh(client, news, watch, false).await {
                            return lost(e);
                        }
                    }
                    other => {
                        if let Err(Ended::Lost(r)) = requests::act(client, other, news).await {
                            return Ended::Lost(r);
                        }
                    }
                }
            }
        }
    }
}

/// The shortest time between two reads of `agent.stats`.
const STATS_GAP: Duration = Duration::from_secs(1);

/// When `agent.stats` is read next: wanted reads are held to [`STATS_GAP`]
/// apart, and to ten times as long as the last read took.
struct Throttle {
    due: Option<tokio::time::Instant>,
    earliest: tokio::time::Instant,
}

impl Throttle {
    fn new(first: tokio::time::Instant) -> Throttle {
        Throttle { due: Some(first), earliest: first }
    }

    fn want(&mut self, at: tokio::time::Instant) {
        self.due.get_or_insert(at.max(self.earliest));
    }

    fn done(&mut self, began: tokio::time::Instant) {
        let took = began.elapsed();
        self.due = None;
        self.earliest = tokio::time::Instant::now() + STATS_GAP.max(took * 10);
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// From now to the start of the next minute of the wall clock.
fn until_next_minute() -> Duration {
    let now = chrono::Utc::now();
    let into = now.timestamp().rem_euclid(60) as u64 * 1000 + u64::from(now.timestamp_subsec_millis());
    Duration::from_millis(60_000 - into.min(59_999))
}

/// Reloads what the views show. The tasks view gets one page; more pages
/// come when the user scrolls to them.
async fn refresh(
    client: &Client,
    news: &mpsc::Sender<News>,
    watch: &Watch,
    everything: bool,
) -> Result<(), ClientError> {
    let status = client.request::<m::AgentStatus>(NoParams {}).await?;
    let _ = news.send(News::Status(status)).await;
    let _ = news.send(News::Queues(client.request::<m::QueuesStats>(NoParams {}).await?)).await;
    // An older agent has no agents.list: the view stays empty.
    if let Ok(agents) = client.request::<m::AgentsList>(NoParams {}).await {
        let _ = news.send(News::Agents(agents)).await;
    }
    let page = client.request::<m::TasksList>(watch.query.clone()).await?;
    let _ = news.send(News::Tasks { items: page.items, next_cursor: page.next_cursor, append: false }).await;
    if let Some(id) = &watch.instance {
        if let Ok(i) = client.request::<m::TasksGet>(IdParams { id: id.clone(), reason: None }).await {
            let fans: Vec<u32> = i.steps.iter().flatten().filter(|s| s.items.is_some()).map(|s| s.seq).collect();
            let _ = news.send(News::Instance(Box::new(i))).await;
            // A fan-out step's items (its first page) for the items pane.
            for seq in fans {
                let p = apollo_shared::protocol::ItemsParams { id: id.clone(), step: seq.into(), from: 0, limit: None };
                if let Ok(items) = client.request::<m::StepsItems>(p).await {
                    let _ = news.send(News::Items { id: id.clone(), seq, items }).await;
                }
            }
        }
    }
    if everything {
        let _ = news.send(News::Defs(client.request::<m::DefsList>(NoParams {}).await?)).await;
        let _ = news.send(News::Plugins(client.request::<m::PluginsList>(NoParams {}).await?)).await;
        if let Ok(r) = client.request::<m::RolloutsList>(NoParams {}).await {
            let _ = news.send(News::Rollouts(r)).await;
        }
        let _ = news.send(News::Alerts(client.request::<m::AlertsList>(LimitParams { limit: Some(200) }).await?)).await;
    }
    Ok(())
}

/// Keeps `News::Fleet` coming for every context: each has its own task, so
/// an unreachable one is marked without holding up the others. Each asks
/// its agent for its status every second, each call bounded by a timeout.
pub async fn fleet(contexts: Vec<crate::contexts::Context>, news: mpsc::Sender<News>) {
    let polls = contexts.into_iter().map(|c| {
        let news = news.clone();
        async move {
            let name = c.name.clone();
            let target = Target::of(&c);
            let limit = Duration::from_secs(2);
            loop {
                let client = match tokio::time::timeout(limit, target.connect()).await {
                    Ok(Ok(client)) => client,
                    Ok(Err(e)) => {
                        let _ = news.send(News::Fleet(name.clone(), FleetState::Unreachable(e.to_string()))).await;
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                    Err(_) => {
                        let why = format!("no answer in {}s", limit.as_secs());
                        let _ = news.send(News::Fleet(name.clone(), FleetState::Unreachable(why))).await;
                        continue;
                    }
                };
                loop {
                    let state = match tokio::time::timeout(limit, client.request::<m::AgentStatus>(NoParams {})).await {
                        Ok(Ok(s)) => FleetState::Up {
                            agent: s.agent,
                            counts: s.counts.iter().filter_map(|(k, v)| Some((k.clone(), v.as_u64()?))).collect(),
                            store_error: s.store_error,
                        },
                        Ok(Err(e)) => FleetState::Unreachable(e.to_string()),
                        Err(_) => FleetState::Unreachable(format!("no answer in {}s", limit.as_secs())),
                    };
                    let down = matches!(state, FleetState::Unreachable(_));
                    if news.send(News::Fleet(name.clone(), state)).await.is_err() {
                        return;
                    }
                    if down {
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    });
    futures::future::join_all(polls).await;
}
