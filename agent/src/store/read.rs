//! Queries. They run on read-only connections (and, inside a write, on the
//! writer's connection) and change nothing.

use super::db::Db;
use super::rows::{self, parse_ts, ts, SUMMARY_COLS};
use super::value::{p, V};
use super::whole::whole;
use super::{Result, Store, StoreError};
use apollo_shared::protocol::{Alert, AuditEntry, EventRecord, Instance, QueueStats};
use apollo_shared::state::{StepState, TaskState};
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

/// Filters of `tasks.list`.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub state: Option<TaskState>,
    pub task: Option<String>,
    pub queue: Option<String>,
    pub limit: u32,
    /// Only instances with an id lower than this (newest first paging).
    pub before: Option<String>,
    /// Only instances created at or after this (ids are ULIDs: their time
    /// comes first, so this is an id bound too).
    pub since: Option<chrono::DateTime<chrono::Utc>>,
}

impl ListFilter {
    /// The listing's statement over `table` (its columns `cols`) with only
    /// the filters given, each an equality or a bound of its id, so every
    /// shape is served by an index (`(state, id)`, `(task, id)`, `(queue,
    /// id)`, the id itself) rather than a scan: the `?1 IS NULL OR …` form
    /// keeps SQLite off them. The `INDEXED BY` names (SQLite's; dropped on
    /// PostgreSQL) pick the one index when several filters are given.
    pub fn statement(&self, cols: &str, table: &str) -> (String, Vec<V>) {
        let (mut conds, mut params) = (Vec::new(), Vec::new());
        let mut add = |cond: &str, v: V| {
            params.push(v);
            conds.push(format!("{cond} ?{}", params.len()));
        };
        if let Some(t) = &self.task {
            add("task =", V::from(t.as_str()));
        }
        if let Some(s) = self.state {
            add("state =", V::from(s.as_str()));
        }
        if let Some(q) = &self.queue {
            add("queue =", V::from(q.as_str()));
        }
        if let Some(b) = &self.before {
            add("id <", V::from(b.as_str()));
        }
        if let Some(since) = self.since {
            let floor = ulid::Ulid::from_parts(since.timestamp_millis().max(0) as u64, 0).to_string();
            add("id >=", V::from(floor.as_str()));
        }
        // The most selective index first: a task, a state, a queue.
        let index = match (self.task.is_some(), self.state.is_some(), self.queue.is_some(), table) {
            (true, _, _, "task_instances") => " INDEXED BY task_instances_task",
            (false, true, _, "task_instances") => " INDEXED BY task_instances_state",
            (false, false, true, "task_instances") => " INDEXED BY task_instances_queue",
            (true, _, _, "archive") => " INDEXED BY archive_task",
            (false, true, _, "archive") => " INDEXED BY archive_state",
            (false, false, true, "archive") => " INDEXED BY archive_queue",
            _ => "",
        };
        let wheres = if conds.is_empty() { String::new() } else { format!(" WHERE {}", conds.join(" AND ")) };
        params.push(V::from(self.limit));
        let sql = format!("SELECT {cols} FROM {table}{index}{wheres} ORDER BY id DESC LIMIT ?{}", params.len());
        (sql, params)
    }
}

impl Store {
    /// One instance with its steps and history; archived instances too.
    pub async fn get(&self, id: &str) -> Result<Instance> {
        let id = id.to_string();
        self.read(move |c| whole(c, &id)?.ok_or_else(|| StoreError::NotFound(format!("no instance {id}")))).await
    }

    /// An instance's steps as `steps.logs` needs them: (seq, name, state,
    /// attempts), one small query (no history, no context); an archived
    /// instance's from its document.
    pub async fn step_states(&self, id: &str) -> Result<Vec<(u32, String, StepState, u32)>> {
        let id = id.to_string();
        let rows = self
            .read(move |c| {
                c.query(
                    "SELECT seq, name, state, attempts FROM step_runs WHERE instance_id = ?1 ORDER BY seq",
                    p![id.as_str()],
                )?
                .iter()
                .map(|r| Ok((r.get::<u32>(0)?, r.get::<String>(1)?, r.get::<String>(2)?, r.get::<u32>(3)?)))
                .collect::<Result<Vec<_>>>()
            })
            .await?;
        rows.into_iter().map(|(seq, name, s, a)| Ok((seq, name, s.parse().map_err(StoreError::Invalid)?, a))).collect()
    }

    /// Instances newest first, as summaries: no steps, no context.
    pub async fn list(&self, f: ListFilter) -> Result<Vec<Instance>> {
        self.read(move |c| {
            let (sql, params) = f.statement(SUMMARY_COLS, "task_instances");
            c.query(&sql, &params)?.iter().map(rows::instance).collect()
        })
        .await
    }

    /// Archived instances newest first, as summaries, with the same filters.
    pub async fn list_archived(&self, f: ListFilter) -> Result<Vec<Instance>> {
        self.read(move |c| {
            let (sql, params) = f.statement("doc", "archive");
            let docs = c.query(&sql, &params)?;
            Ok(docs
                .iter()
                .filter_map(|r| super::docs::read(&r.0[0]))
                .map(|mut i| {
                    i.context = serde_json::Value::Null;
                    i.steps = None;
                    i.transitions = None;
                    i
                })
                .collect())
        })
        .await
    }

    /// The backend's plan for the listing `f` (of the archive when
    /// `archived`): a line per step, for the test that no listing scans.
    pub async fn list_plan(&self, f: ListFilter, archived: bool) -> Result<Vec<String>> {
        self.read(move |c| {
            let (sql, params) = f.statement(
                if archived { "doc" } else { SUMMARY_COLS },
                if archived { "archive" } else { "task_instances" },
            );
            c.driver().explain(c, &sql, &params)
        })
        .await
    }

    pub async fn counts(&self) -> Result<BTreeMap<String, u64>> {
        self.read(|c| {
            let mut out: BTreeMap<String, u64> = TaskState::ALL.iter().map(|s| (s.to_string(), 0)).collect();
            for (state, n) in c.driver().state_counts(c)? {
                out.insert(state, n);
            }
            Ok(out)
        })
        .await
    }

    /// Per queue: running, pending, retrying and the oldest pending age.
    /// Instances that ended since `since`, counted per minute (`YYYY-MM-DDTHH:MM`),
    /// queue and state.
    pub async fn ended_since(&self, since: DateTime<Utc>) -> Result<Vec<(String, String, String, u64)>> {
        let since = ts(since);
        self.read(move |c| {
            c.query(
                "SELECT substr(finished_at, 1, 16), queue, state, COUNT(*) FROM task_instances \
                 WHERE finished_at >= ?1 AND state IN ('SUCCESS', 'FAILED', 'ROLLED_BACK') GROUP BY 1, 2, 3",
                p![since.as_str()],
            )?
            .iter()
            .map(|r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .collect()
        })
        .await
    }

    pub async fn queue_stats(&self) -> Result<Vec<QueueStats>> {
        self.read(|c| {
            let now = Utc::now();
            c.query(
                "SELECT queue, COUNT(CASE WHEN state = 'RUNNING' THEN 1 END), COUNT(CASE WHEN state = 'PENDING' THEN 1 END), \
                 COUNT(CASE WHEN state = 'RETRYING' THEN 1 END), MIN(CASE WHEN state = 'PENDING' THEN created_at END) \
                 FROM task_instances WHERE state IN ('RUNNING', 'PENDING', 'RETRYING') GROUP BY queue ORDER BY queue",
                &[],
            )?
            .iter()
            .map(|r| {
                    let oldest = parse_ts(r.get(4)?);
                    Ok(QueueStats {
                        queue: r.get(0)?,
                        running: r.get(1)?,
                        limit: None,
                        pending: r.get(2)?,
                        retrying: r.get(3)?,
                        oldest_pending_secs: oldest.map(|t| (now - t).num_milliseconds() as f64 / 1000.0),
                        paused: None,
                    })
                })
            .collect()
        })
        .await
    }

    /// What operators did, newest first: every history row an operator (not
    /// an agent, not the schedule) caused, with the instance's task.
    pub async fn audit(&self, limit: u32) -> Result<Vec<AuditEntry>> {
        self.read(move |c| {
            c.query(
                &format!(
                    "SELECT t.at, t.actor, t.instance_id, COALESCE(i.task, a.task, r.plugin), t.step_seq, t.from_state, \
                     t.to_state, t.reason FROM transitions t INDEXED BY transitions_operator \
                     LEFT JOIN task_instances i ON i.id = t.instance_id LEFT JOIN archive a ON a.id = t.instance_id \
                     LEFT JOIN rollouts r ON r.id = t.instance_id \
                     WHERE {} ORDER BY t.id DESC LIMIT ?1",
                    c.driver().operator_rows("t")
                ),
                p![limit],
            )?
            .iter()
            .map(|r| {
                Ok(AuditEntry {
                    at: r.get::<super::value::When>(0)?.0.map(ts).unwrap_or_default(),
                    actor: r.get(1)?,
                    instance: r.get(2)?,
                    task: r.get(3)?,
                    step: r.get(4)?,
                    from: r.get(5)?,
                    to: r.get(6)?,
                    reason: r.get(7)?,
                })
            })
            .collect()
        })
        .await
    }

    /// The attempts of a plugin version's latest `n` finished steps, newest
    /// first: (failed, seconds). Every attempt counts, the failed ones kept in
    /// `step_attempts` as well as each step's last: a step that failed twice
    /// and then succeeded is two failures and a success, and a step rolled
    /// back after it succeeded is a success. An interrupted attempt (a
    /// restart, a cancel) is not the plugin's doing and does not count.
    /// With `since`, only steps finished since then (a rollout's figures).
    pub async fn plugin_runs(
        &self,
        plugin: &str,
        version: &str,
        n: u32,
        since: Option<&str>,
    ) -> Result<Vec<(bool, f64)>> {
        let (p, v, since) = (plugin.to_string(), version.to_string(), since.unwrap_or("").to_string());
        self.read(move |c| {
            let steps = "SELECT instance_id, seq, state, error, started_at, finished_at \
                 FROM step_runs INDEXED BY step_runs_plugin \
                 WHERE plugin = ?1 AND finished_at IS NOT NULL AND plugin_version = ?2 AND finished_at >= ?4 \
                 ORDER BY finished_at DESC LIMIT ?3";
            attempts_of(c, steps, p![p.as_str(), v.as_str(), n, since.as_str()], n)
        })
        .await
    }

    /// [`Store::plugin_runs`] of one definition step: the attempts of step
    /// `step` of `task`'s latest `n` instances where it finished under this
    /// plugin version (what `timeout: auto` learns from; the plugin's runs
    /// in other steps do other work). Read from the task's instances newest
    /// first, each one's step by its key.
    pub async fn step_runs_of(
        &self,
        task: &str,
        step: &str,
        plugin: &str,
        version: &str,
        n: u32,
    ) -> Result<Vec<(bool, f64)>> {
        let (t, st, p, v) = (task.to_string(), step.to_string(), plugin.to_string(), version.to_string());
        self.read(move |c| {
            let steps = "SELECT r.instance_id, r.seq, r.state, r.error, r.started_at, r.finished_at \
                 FROM task_instances i INDEXED BY task_instances_task CROSS JOIN step_runs r \
                 WHERE i.task = ?4 AND r.instance_id = i.id AND r.name = ?5 AND r.plugin = ?1 \
                   AND r.plugin_version = ?2 AND r.finished_at IS NOT NULL \
                 ORDER BY i.id DESC LIMIT ?3";
            attempts_of(c, steps, p![p.as_str(), v.as_str(), n, t.as_str(), st.as_str()], n)
        })
        .await
    }

    pub async fn alerts(&self, limit: u32) -> Result<Vec<Alert>> {
        self.read(move |c| {
            c.query("SELECT id, at, kind, message, instance_id FROM alerts ORDER BY id DESC LIMIT ?1", p![limit])?
                .iter()
                .map(rows::alert)
                .collect()
        })
        .await
    }

    /// When the first RETRYING instance due after `after` becomes runnable.
    pub async fn next_retry_due(&self, after: DateTime<Utc>) -> Result<Option<DateTime<Utc>>> {
        self.read(move |c| {
            let t: Option<Option<String>> = c.value(
                "SELECT MIN(next_run_at) FROM task_instances WHERE state = 'RETRYING' AND next_run_at > ?1",
                p![super::rows::ts(after)],
            )?;
            Ok(parse_ts(t.flatten()))
        })
        .await
    }

    /// The definition text an instance was created with.
    pub async fn def_source(&self, hash: &str) -> Result<(String, String)> {
        let hash = hash.to_string();
        self.read(move |c| {
            let row = c
                .query_opt("SELECT file, source FROM task_defs WHERE hash = ?1", p![hash.as_str()])?
                .ok_or_else(|| StoreError::NotFound(format!("no definition version {hash}")))?;
            Ok((row.get(0)?, row.get(1)?))
        })
        .await
    }

    /// Received events, newest first: id, name, data, dedup key, time, instances created.
    pub async fn events(&self, limit: u32) -> Result<Vec<EventRecord>> {
        self.read(move |c| {
            c.query(
                "SELECT id, name, data, dedup_key, received_at, instances FROM events ORDER BY id DESC LIMIT ?1",
                p![limit],
            )?
            .iter()
            .map(|r| {
                let data: Option<String> = r.get(2)?;
                let instances: String = r.get(5)?;
                Ok(EventRecord {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    data: data.and_then(|d| serde_json::from_str(&d).ok()),
                    dedup_key: r.get(3)?,
                    received_at: r.get(4)?,
                    instances: serde_json::from_str(&instances).unwrap_or_default(),
                })
            })
            .collect()
        })
        .await
    }

    /// The event stored under a dedup key: its id and the instances it created.
    pub async fn event_by_key(&self, key: &str) -> Result<Option<(String, serde_json::Value)>> {
        let key = key.to_string();
        self.read(move |c| {
            let Some(row) = c.query_opt("SELECT id, instances FROM events WHERE dedup_key = ?1", p![key.as_str()])?
            else {
                return Ok(None);
            };
            let (id, i): (String, String) = (row.get(0)?, row.get(1)?);
            Ok(Some((id, serde_json::from_str(&i).unwrap_or_default())))
        })
        .await
    }

    /// Every agent that has used the store, by name.
    pub async fn agents(&self) -> Result<Vec<apollo_shared::protocol::AgentInfo>> {
        self.read(|c| {
            c.query(
                "SELECT name, id, host, version, queues, running, started_at, heartbeat_at, \
                 CASE WHEN heartbeat_at < apollo_now_plus(-(lease_secs / 2)) THEN 1 ELSE 0 END, \
                 CASE WHEN stopped_at IS NULL THEN 0 ELSE 1 END, apollo_now(), plugins FROM agents ORDER BY name",
                &[],
            )?
            .iter()
            .map(|r| {
                let heartbeat = parse_ts(r.get(7)?).unwrap_or_default();
                let now = parse_ts(r.get(10)?).unwrap_or_default();
                Ok(apollo_shared::protocol::AgentInfo {
                    name: r.get(0)?,
                    id: r.get(1)?,
                    host: r.get(2)?,
                    version: r.get(3)?,
                    queues: serde_json::from_str(&r.get::<String>(4)?).unwrap_or_default(),
                    running: r.get(5)?,
                    started_at: parse_ts(r.get(6)?).unwrap_or_default(),
                    heartbeat_at: heartbeat,
                    heartbeat_age_secs: (now - heartbeat).num_milliseconds().max(0) as f64 / 1000.0,
                    late: r.get(8)?,
                    stopped: r.get(9)?,
                    tasks: Vec::new(),
                    plugins: r
                        .get::<Option<String>>(11)?
                        .and_then(|p| serde_json::from_str(&p).ok())
                        .unwrap_or_default(),
                })
            })
            .collect()
        })
        .await
    }

    /// The last fire of every schedule.
    pub async fn cron_state(&self) -> Result<std::collections::HashMap<String, DateTime<Utc>>> {
        self.read(|c| {
            let mut out = std::collections::HashMap::new();
            for r in c.query("SELECT task, last_fire FROM cron_state", &[])? {
                if let Some(at) = parse_ts(r.get(1)?) {
                    out.insert(r.get::<String>(0)?, at);
                }
            }
            Ok(out)
        })
        .await
    }
}

/// The attempts of the steps `steps` selects (instance_id, seq, state,
/// error, started_at, finished_at; `?1` the plugin, `?2` its version), newest
/// first, at most `n`: (failed, seconds). See [`Store::plugin_runs`].
fn attempts_of(c: &dyn Db, steps: &str, params: &[V], n: u32) -> Result<Vec<(bool, f64)>> {
    let mut runs: Vec<(bool, String, f64)> = c
        .query(
            &format!(
                "WITH s AS ({steps}) \
                 SELECT 0, started_at, finished_at FROM s \
                     WHERE state = 'SUCCESS' OR (state = 'ROLLED_BACK' AND error IS NULL) \
                 UNION ALL \
                 SELECT 1, a.started_at, a.finished_at FROM step_attempts a \
                     JOIN s ON a.instance_id = s.instance_id AND a.seq = s.seq \
                     WHERE a.plugin_version = ?2 AND COALESCE(a.outcome, \
                         CASE WHEN a.error LIKE 'interrupted:%' OR a.error LIKE 'cancelled:%' \
                              THEN 'interrupted' ELSE 'failed' END) = 'failed'"
            ),
            params,
        )?
        .iter()
        .map(|r| {
            let failed: i64 = r.get(0)?;
            let (start, end): (Option<String>, Option<String>) = (r.get(1)?, r.get(2)?);
            let secs = match (parse_ts(start), parse_ts(end.clone())) {
                (Some(a), Some(b)) => (b - a).num_microseconds().unwrap_or(0) as f64 / 1e6,
                _ => 0.0,
            };
            Ok((failed == 1, end.unwrap_or_default(), secs))
        })
        .collect::<Result<_>>()?;
    runs.sort_by(|a, b| b.1.cmp(&a.1));
    runs.truncate(n as usize);
    Ok(runs.into_iter().map(|(failed, _, secs)| (failed, secs)).collect())
}
