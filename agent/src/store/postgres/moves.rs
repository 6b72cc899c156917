//! The hot path's moves on PostgreSQL, one statement each: the row locked,
//! the transition table checked, the row changed and its history row
//! written in one round trip (data-modifying `WITH`), where the portable
//! code in `store::write` needs four or five. The moves of several
//! instances (a claim's, its first steps' starts, a batch's SUCCESS writes)
//! are one statement for all, their rows passed as a JSON array.
//!
//! Each returns `None` when its statement changed nothing — the instance is
//! not held, the step or instance is missing, or the table refuses the move —
//! and the caller then runs the portable code, which changes nothing either
//! and says exactly why. The table itself lives in `apollo_shared::state`;
//! the states a move may start from are read from it, never written here.

use crate::store::db::Db;
use crate::store::model::{Also, ClaimMove, ClaimsMade, NewInstance, StepStart, Success, TaskMove};
use crate::store::value::{Row, V};
use crate::store::{rows, Result, StoreError};
use apollo_shared::state::{check_step, check_task, StepState, TaskState};
use std::sync::LazyLock;

/// `'A', 'B'`: the states a move may start from, as SQL literals.
fn sources<'a>(allowed: impl Iterator<Item = &'a str>) -> String {
    let from: Vec<String> = allowed.map(|s| format!("'{s}'")).collect();
    if from.is_empty() {
        "NULL".into()
    } else {
        from.join(", ")
    }
}

/// The source list of each task state, read from the table once.
fn task_sources(to: TaskState) -> &'static str {
    static LISTS: LazyLock<Vec<(TaskState, String)>> = LazyLock::new(|| {
        let allowed = |to| TaskState::ALL.iter().filter(move |f| check_task(**f, to).is_ok()).map(|f| f.as_str());
        TaskState::ALL.iter().map(|to| (*to, sources(allowed(*to)))).collect()
    });
    LISTS.iter().find(|(t, _)| *t == to).map(|(_, l)| l.as_str()).unwrap_or("NULL")
}

/// The source list of each step state, read from the table once.
fn step_sources(to: StepState) -> &'static str {
    static LISTS: LazyLock<Vec<(StepState, String)>> = LazyLock::new(|| {
        let allowed = |to| StepState::ALL.iter().filter(move |f| check_step(**f, to).is_ok()).map(|f| f.as_str());
        StepState::ALL.iter().map(|to| (*to, sources(allowed(*to)))).collect()
    });
    LISTS.iter().find(|(t, _)| *t == to).map(|(_, l)| l.as_str()).unwrap_or("NULL")
}

const HISTORY: &str = "INSERT INTO transitions (instance_id, step_seq, from_state, to_state, reason, actor, at)";

/// An instance's move to `to` with `also`'s changes and its history row.
/// `also`'s placeholders follow the move's three (id, state, time); the
/// reason and the actor come after them.
pub(super) fn task(c: &dyn Db, m: &TaskMove) -> Result<Option<TaskState>> {
    let TaskMove { id, to, reason, actor, ref also } = *m;
    let Some(row) = c.query_opt(&task_sql(to, also, ""), &task_params(id, to, reason, actor, also))? else {
        return Ok(None);
    };
    let from: String = row.get(0)?;
    Ok(Some(from.parse().map_err(StoreError::Invalid)?))
}

/// The statement of an instance's move: it returns the state the move
/// left and then `cols` of the row as moved (`, a, b`; empty for none).
fn task_sql(to: TaskState, also: &Also, cols: &str) -> String {
    let n = 3 + also.1.len();
    let set = if also.0.is_empty() { String::new() } else { format!(", {}", also.0) };
    format!(
        "WITH t AS (SELECT state AS from_state FROM task_instances WHERE id = ?1 FOR UPDATE), \
         u AS (UPDATE task_instances SET state = ?2, updated_at = ?3{set} FROM t \
               WHERE id = ?1 AND t.from_state IN ({from}) RETURNING t.from_state{cols}), \
         h AS ({HISTORY} SELECT ?1, CAST(NULL AS INTEGER), from_state, ?2, ?{r}, ?{a}, ?3 FROM u) \
         SELECT from_state{cols} FROM u",
        from = task_sources(to),
        r = n + 1,
        a = n + 2
    )
}

/// The placeholders of [`task_sql`].
fn task_params(id: &str, to: TaskState, reason: &str, actor: &str, also: &Also) -> Vec<V> {
    let now = rows::ts(chrono::Utc::now());
    let mut params = vec![V::from(id), V::from(to.as_str()), V::from(now)];
    params.extend_from_slice(also.1);
    params.push(V::from(rows::reason(reason)));
    params.push(V::from(actor));
    params
}

/// Claims in two statements sent together (one round trip), whatever their
/// number: every instance's move to RUNNING for `actor` (its `lease_secs`
/// measured by the database's clock), each returning the state it left and
/// the row as moved ([`rows::INSTANCE_COLS`]), and every claimed
/// instance's steps ([`rows::STEP_COLS`], with the instance's id
/// first); with `starts`, a third statement starts those steps
/// ([`step_starts`]). `retry` says whether the move is a retry's (the
/// attempt counts up). Rows are looked up by key through `LATERAL`, in the
/// order of their ids, and each moved where it was locked (by `ctid`; see
/// [`held`]). For each claim, the moved row (`None` for a move not made: see
/// the module) and the instance's steps; and each start made, with its
/// attempt.
#[allow(clippy::type_complexity)]
pub(super) fn claims(
    c: &dyn Db,
    moves: &[ClaimMove],
    actor: &str,
    lease_secs: f64,
    starts: &[StepStart],
) -> Result<ClaimsMade> {
    static MOVES: LazyLock<String> = LazyLock::new(|| {
        let cols = rows::qualified("task_instances", rows::INSTANCE_COLS);
        format!(
            "WITH b AS (SELECT * FROM json_to_recordset(CAST(?1 AS json)) AS b(claim_id text, retry boolean)), \
             t AS (SELECT t.row_ctid, t.claim_id, t.from_state, o.retry \
                   FROM (SELECT claim_id, retry FROM b ORDER BY claim_id) o \
                   CROSS JOIN LATERAL (SELECT ctid AS row_ctid, id AS claim_id, state AS from_state \
                   FROM task_instances WHERE id = o.claim_id FOR UPDATE) t), \
             u AS (UPDATE task_instances SET state = 'RUNNING', updated_at = ?2, \
                   attempt = attempt + CASE WHEN t.retry THEN 1 ELSE 0 END, started_at = COALESCE(started_at, ?2), \
                   next_run_at = NULL, lease_owner = ?3, lease_expires_at = apollo_now_plus(?4), finished_at = NULL, \
                   waiting = NULL, approval = NULL \
                   FROM t WHERE task_instances.ctid = t.row_ctid AND t.from_state IN ({from}) \
                   RETURNING t.from_state, t.retry, {cols}), \
             h AS ({HISTORY} SELECT id, CAST(NULL AS INTEGER), from_state, 'RUNNING', \
                   CASE WHEN retry THEN 'claimed for retry' ELSE 'claimed' END, ?3, ?2 FROM u) \
             SELECT from_state, {plain} FROM u",
            from = task_sources(TaskState::Running),
            plain = rows::INSTANCE_COLS,
        )
    });
    static STEPS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT k.claim_id, s.* FROM json_array_elements_text(CAST(?1 AS json)) AS k(claim_id) \
             CROSS JOIN LATERAL (SELECT {} FROM step_runs WHERE instance_id = k.claim_id ORDER BY seq) s",
            rows::STEP_COLS
        )
    });
    if moves.is_empty() {
        return Ok(ClaimsMade::default());
    }
    let rows: Vec<serde_json::Value> =
        moves.iter().map(|m| serde_json::json!({"claim_id": m.id, "retry": m.retry})).collect();
    let ids: Vec<&str> = moves.iter().map(|m| m.id).collect();
    let now = rows::ts(chrono::Utc::now());
    let mut statements = vec![
        (
            MOVES.as_str(),
            vec![
                V::from(serde_json::Value::Array(rows).to_string()),
                V::from(now.as_str()),
                V::from(actor),
                V::from(lease_secs),
            ],
        ),
        (STEPS.as_str(), vec![V::from(serde_json::json!(ids).to_string())]),
    ];
    if !starts.is_empty() {
        statements.push((START_SQL.as_str(), starts_params(starts, &now, actor)));
    }
    let mut answers = c.query_batch(&statements)?.into_iter();
    let (moved, steps) = (answers.next().unwrap_or_default(), answers.next().unwrap_or_default());
    let started =
        starts_made(&answers.next().unwrap_or_default())?.into_iter().map(|((id, _), attempt)| (id, attempt)).collect();
    // The row as moved is the state it left, then INSTANCE_COLS (id first).
    let mut by_id: std::collections::HashMap<String, (Option<Row>, Vec<Row>)> =
        std::collections::HashMap::with_capacity(moves.len());
    for row in moved {
        let id: String = row.get(1)?;
        by_id.entry(id).or_default().0 = Some(row);
    }
    for row in steps {
        let id: String = row.get(0)?;
        by_id.entry(id).or_default().1.push(Row(row.0[1..].to_vec()));
    }
    Ok(ClaimsMade { moved: ids.iter().map(|id| by_id.remove(*id).unwrap_or_default()).collect(), started })
}

/// Several steps' starts (of instances `actor` holds) in one statement, as
/// [`step_successes`] makes SUCCESS writes: each start's attempt count after
/// it, or `None` for one that was not made (see the module).
pub(super) fn step_starts(c: &dyn Db, starts: &[StepStart], actor: &str) -> Result<Vec<Option<u32>>> {
    let now = rows::ts(chrono::Utc::now());
    let by_step = starts_made(&c.query(&START_SQL, &starts_params(starts, &now, actor))?)?;
    Ok(starts.iter().map(|s| by_step.get(&(s.id.to_string(), s.seq)).copied()).collect())
}

/// The statement of [`step_starts`]: `?1` the starts as a JSON array, `?2`
/// the time.
static START_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH b AS (SELECT * FROM json_to_recordset(CAST(?1 AS json)) \
              AS b(id text, seq integer, version text, params text, actor text)), \
         {held}\
         v AS (UPDATE step_runs SET state = 'RUNNING', attempts = s.attempts + 1, plugin_version = b.version, \
               params = b.params, started_at = ?2, finished_at = NULL, error = NULL FROM b, s \
               WHERE step_runs.ctid = s.row_ctid AND s.instance_id = b.id AND s.seq = b.seq \
                 AND s.from_state IN ({start}) \
               RETURNING b.id, b.seq, s.from_state, step_runs.attempts, b.actor), \
         h AS ({HISTORY} SELECT id, seq, from_state, 'RUNNING', 'attempt ' || attempts, actor, ?2 FROM v) \
         SELECT id, seq, attempts FROM v",
        held = held("= b.seq"),
        start = step_sources(StepState::Running),
    )
});

fn starts_params(starts: &[StepStart], now: &str, actor: &str) -> Vec<V> {
    let rows: Vec<serde_json::Value> = starts
        .iter()
        .map(
            |s| serde_json::json!({"id": s.id, "seq": s.seq, "version": s.version, "params": s.params, "actor": actor}),
        )
        .collect();
    vec![V::from(serde_json::Value::Array(rows).to_string()), V::from(now)]
}

/// The `WITH` items of a move of steps of held instances, one row of `b`
/// (`id`, `seq`, `actor`, …) each: `i` locks each instance RUNNING and held
/// by its actor, `s` the steps whose seq is `steps` (`= b.seq`), with the
/// state each leaves. Every row is a key lookup through `LATERAL`, in the
/// order of the ids, and the moves that follow change a row by the `ctid`
/// it was locked at: the plan stays so whatever the tables' statistics (a
/// generic plan made while the tables were small would otherwise scan them).
fn held(steps: &str) -> String {
    format!(
        "i AS (SELECT t.row_ctid, t.id FROM (SELECT id, actor FROM b ORDER BY id) o CROSS JOIN LATERAL \
               (SELECT ctid AS row_ctid, id FROM task_instances \
                WHERE id = o.id AND state = 'RUNNING' AND lease_owner = o.actor FOR UPDATE) t), \
         s AS (SELECT st.row_ctid, st.instance_id, st.seq, st.state AS from_state, st.attempts \
               FROM i JOIN b ON b.id = i.id \
               CROSS JOIN LATERAL (SELECT ctid AS row_ctid, instance_id, seq, state, attempts FROM step_runs \
               WHERE instance_id = i.id AND seq {steps} FOR UPDATE) st), "
    )
}

/// The attempt of each start [`START_SQL`] made, by instance and step.
fn starts_made(rows: &[Row]) -> Result<std::collections::HashMap<(String, u32), u32>> {
    rows.iter().map(|row| Ok(((row.get::<String>(0)?, row.get::<u32>(1)?), row.get::<u32>(2)?))).collect()
}

/// A new PENDING instance with its PENDING steps and its first history row;
/// `false` when the id or the dedup key exists already.
pub(super) fn create(c: &dyn Db, n: &NewInstance, actor: &str) -> Result<bool> {
    let mut params = vec![
        V::from(n.id.as_str()),
        V::from(n.task.as_str()),
        V::from(n.def_hash.as_str()),
        V::from(n.queue.as_str()),
        V::from(n.priority),
        V::from(n.max_active),
        V::from(serde_json::Value::Object(n.params.clone()).to_string()),
        V::from(n.context.to_string()),
        V::from(n.trace_id.as_str()),
        V::from(n.trigger.as_str()),
        V::from(n.dedup_key.as_deref()),
        V::from(n.expected_secs),
        V::from(rows::ts(chrono::Utc::now())),
        V::from(format!("created by {}", n.trigger)),
        V::from(actor),
        V::from(n.pins_json().as_deref()),
        V::from(n.locks_json().as_deref()),
    ];
    let mut rows = Vec::new();
    for (seq, (name, plugin)) in n.steps.iter().enumerate() {
        rows.push(format!("({seq}, ?{}, ?{})", params.len() + 1, params.len() + 2));
        params.push(V::from(name.as_str()));
        params.push(V::from(plugin.as_str()));
    }
    let steps = if rows.is_empty() {
        String::new()
    } else {
        format!(
            "st AS (INSERT INTO step_runs (instance_id, seq, name, plugin, state) \
             SELECT ins.id, v.seq, v.name, v.plugin, 'PENDING' FROM ins, (VALUES {}) AS v(seq, name, plugin)), ",
            rows.join(", ")
        )
    };
    let sql = format!(
        "WITH ins AS (INSERT INTO task_instances (id, task, def_hash, queue, priority, max_active, state, attempt, params, \
         context, trace_id, trigger, dedup_key, expected_secs, created_at, updated_at, pins, locks) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'PENDING', 1, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?13, ?16, ?17) ON CONFLICT DO NOTHING RETURNING id), \
         {steps}\
         h AS ({HISTORY} SELECT ins.id, CAST(NULL AS INTEGER), CAST(NULL AS TEXT), 'PENDING', ?14, ?15, ?13 FROM ins) \
         SELECT id FROM ins"
    );
    let id: Option<String> = c.value(&sql, &params)?;
    Ok(id.is_some())
}

/// Steps' SUCCESS writes with their follow-ups (the next step's start, or
/// the instance's SUCCESS) in one statement, one write or a batch's: their
/// rows go as one JSON array; each instance's row and both steps' rows are
/// locked, both moves checked against the table, the history rows written.
/// For each write, `None` when its SUCCESS was not made (see the module; the
/// caller then runs that write on its own), otherwise whether the follow-up
/// was made (one the table refuses is left out, the SUCCESS stands) and the
/// started step's attempt (0 when none started). Each write's instance must
/// be a different one. Rows are locked and moved as [`held`] says.
pub(super) fn step_successes(c: &dyn Db, writes: &[&Success]) -> Result<Vec<Option<(bool, u32)>>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "WITH b AS (SELECT * FROM json_to_recordset(CAST(?1 AS json)) \
                  AS b(id text, seq integer, output text, next integer, finish boolean, \
                       version text, params text, actor text)), \
             {held}\
             u AS (UPDATE step_runs SET state = 'SUCCESS', output = b.output, finished_at = ?2 FROM b, s \
                   WHERE step_runs.ctid = s.row_ctid AND s.instance_id = b.id AND s.seq = b.seq \
                     AND s.from_state IN ({success}) \
                   RETURNING b.id, b.seq, s.from_state, b.actor), \
             v AS (UPDATE step_runs SET state = 'RUNNING', attempts = s.attempts + 1, plugin_version = b.version, \
                   params = b.params, started_at = ?2, finished_at = NULL, error = NULL FROM b, s, u \
                   WHERE step_runs.ctid = s.row_ctid AND s.instance_id = b.id AND s.seq = b.next AND u.id = b.id \
                     AND s.from_state IN ({start}) \
                   RETURNING b.id, b.next AS seq, s.from_state, step_runs.attempts, b.actor), \
             x AS (UPDATE task_instances SET updated_at = ?2, \
                   state = CASE WHEN b.finish THEN 'SUCCESS' ELSE task_instances.state END, \
                   finished_at = CASE WHEN b.finish THEN ?2 ELSE task_instances.finished_at END, \
                   error = CASE WHEN b.finish THEN NULL ELSE task_instances.error END, \
                   lease_owner = CASE WHEN b.finish THEN NULL ELSE task_instances.lease_owner END, \
                   lease_expires_at = CASE WHEN b.finish THEN NULL ELSE task_instances.lease_expires_at END \
                   FROM b, u, i WHERE task_instances.ctid = i.row_ctid AND i.id = b.id AND u.id = b.id \
                   RETURNING b.id, b.finish, b.actor), \
             h AS ({HISTORY} SELECT id, seq, from_state, 'SUCCESS', 'succeeded', actor, ?2 FROM u \
                   UNION ALL SELECT id, seq, from_state, 'RUNNING', 'attempt ' || attempts, actor, ?2 FROM v \
                   UNION ALL SELECT id, CAST(NULL AS INTEGER), 'RUNNING', 'SUCCESS', 'all steps succeeded', actor, ?2 \
                             FROM x WHERE finish) \
             SELECT u.id, v.attempts, CASE WHEN x.finish THEN 0 END FROM u \
             LEFT JOIN v ON v.id = u.id LEFT JOIN x ON x.id = u.id",
            held = held("IN (b.seq, b.next)"),
            success = step_sources(StepState::Success),
            start = step_sources(StepState::Running),
        )
    });
    let rows: Vec<serde_json::Value> = writes
        .iter()
        .map(|w| {
            let (next, version, params) = match &w.next {
                Some((n, v, p)) => (i64::from(*n), Some(v.as_str()), Some(p.as_str())),
                None => (-1, None, None),
            };
            serde_json::json!({
                "id": w.id, "seq": w.seq, "output": w.output, "next": next,
                "finish": w.next.is_none() && w.finish, "version": version, "params": params, "actor": w.actor,
            })
        })
        .collect();
    let now = rows::ts(chrono::Utc::now());
    let made = c.query(&SQL, &[V::from(serde_json::Value::Array(rows).to_string()), V::from(now)])?;
    let mut by_id = std::collections::HashMap::with_capacity(made.len());
    for row in &made {
        let (id, started, finished): (String, Option<u32>, Option<u32>) = (row.get(0)?, row.get(1)?, row.get(2)?);
        by_id.insert(id, started.or(finished));
    }
    Ok(writes
        .iter()
        .map(|w| by_id.get(&w.id).map(|followed| followed.map_or((false, 0), |attempt| (true, attempt))))
        .collect())
}
