//! Promotion: `apollo-agent migrate --to postgres://…` copies a stopped
//! SQLite installation into an empty PostgreSQL schema in one transaction —
//! definitions, instances, steps, history, events, alerts, the archive and
//! the schedules' last fires — then reads every table back inside that
//! transaction and compares its row count and a checksum of its rows with
//! the source before committing. Agents started on PostgreSQL afterwards
//! continue every unfinished instance (an instance the stopped agent held
//! is taken up as its lease has run out).

use super::db::Db;
use super::postgres::{PgConn, Target};
use super::value::V;
use super::Conn;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::path::Path;

/// The tables copied, parents first, with their columns and the key they
/// are read in order of. (`agents` is not copied: it describes live agents;
/// `state_counts` is rebuilt by the target's triggers.)
const TABLES: &[(&str, &str, &str)] = &[
    ("task_defs", "hash, task, file, source, created_at", "hash"),
    (
        "task_instances",
        "id, task, def_hash, queue, priority, max_active, state, attempt, params, context, trace_id, trigger, \
         dedup_key, expected_secs, created_at, started_at, finished_at, updated_at, next_run_at, lease_owner, \
         lease_expires_at, error, rollback_pending, waiting, failed_steps, pins, locks",
        "id",
    ),
    (
        "step_runs",
        "instance_id, seq, name, plugin, plugin_version, state, attempts, failures, params, output, error, \
         started_at, finished_at, timeout_secs, timeout_basis, passed",
        "instance_id, seq",
    ),
    (
        "step_attempts",
        "instance_id, seq, attempt, plugin_version, params, error, started_at, finished_at, outcome, timeout_secs, \
         timeout_basis",
        "instance_id, seq, attempt",
    ),
    ("transitions", "id, instance_id, step_seq, from_state, to_state, reason, actor, at", "id"),
    ("alerts", "id, at, kind, message, instance_id", "id"),
    ("events", "id, name, data, dedup_key, received_at, instances", "id"),
    ("archive", "id, task, state, finished_at, archived_at, doc, dedup_key, queue", "id"),
    ("cron_state", "task, last_fire", "task"),
    (
        "rollouts",
        "id, plugin, version, base, share_pct, agents, state, started_at, started_by, reason, ended_at, ended_by, \
         end_reason, abort_margin_pct, min_runs",
        "id",
    ),
];

/// One table's figures, as the report shows them.
pub struct Copied {
    pub table: &'static str,
    pub rows: usize,
    pub checksum: String,
}

/// A table's rows (parents before children), and their checksum: SHA-256 over each value
/// in a canonical form (so both databases' reads compare).
fn read_table(db: &dyn Db, table: &str, cols: &str, key: &str) -> super::Result<(Vec<Vec<V>>, String)> {
    let mut rows = db.query(&format!("SELECT {cols} FROM {table} ORDER BY {key}"), &[])?;
    // SQLite keeps archived documents compressed, PostgreSQL as JSON text.
    if table == "archive" {
        let doc = cols.split(',').position(|c| c.trim() == "doc").expect("doc");
        for r in &mut rows {
            if let Some(d) = r.0.get(doc).and_then(super::docs::read) {
                r.0[doc] = V::Text(serde_json::to_string(&d).unwrap_or_default());
            }
        }
    }
    // SQLite keeps a history row's time as microseconds, PostgreSQL as text.
    if table == "transitions" {
        let at = cols.split(',').position(|c| c.trim() == "at").expect("at");
        for r in &mut rows {
            if let Some(V::Int(us)) = r.0.get(at) {
                r.0[at] =
                    V::Text(chrono::DateTime::from_timestamp_micros(*us).map(super::rows::ts).unwrap_or_default());
            }
        }
    }
    // The rows' canonical texts, sorted: the two databases may order text
    // keys differently (collations), never the set of rows.
    let mut texts: Vec<String> = rows
        .iter()
        .map(|r| {
            let mut text = String::new();
            for v in &r.0 {
                match v {
                    V::Null => text.push_str("n|"),
                    V::Int(i) => write!(text, "i{i}|").unwrap_or(()),
                    V::Real(f) => write!(text, "r{f:?}|").unwrap_or(()),
                    V::Text(s) => write!(text, "t{}:{s}|", s.len()).unwrap_or(()),
                    V::Blob(b) => write!(text, "b{}|", hex::encode(b)).unwrap_or(()),
                }
            }
            text
        })
        .collect();
    texts.sort_unstable();
    let mut hash = Sha256::new();
    for t in &texts {
        hash.update(t.as_bytes());
        hash.update(b"\n");
    }
    Ok((rows.into_iter().map(|r| r.0).collect(), hex::encode(hash.finalize())))
}

/// Copies the SQLite store at `sqlite` into `target`'s schema, which must be
/// empty (or not exist). Nothing is committed unless every table's count
/// and checksum match.
pub fn to_postgres(sqlite: &Path, target: &Target) -> anyhow::Result<Vec<Copied>> {
    use anyhow::Context as _;
    if !sqlite.exists() {
        anyhow::bail!("{}: no store here (is --data-dir or the config right?)", sqlite.display());
    }
    // Brought to this build's schema first, so the columns are the ones above.
    let source = super::sqlite::open_writer(sqlite, true, false)
        .with_context(|| format!("{}: cannot open the store", sqlite.display()))?;
    let mut pg = target.connect().map_err(|e| anyhow::anyhow!("{}: cannot connect: {e}", target.shown))?;
    super::schema::migrate_postgres(&mut pg, &target.schema)?;
    refuse_non_empty(&pg, target)?;
    pg.begin()?;
    let result = copy_all(&source, &pg);
    match result {
        Ok(report) => {
            pg.batch("COMMIT")?;
            Ok(report)
        }
        Err(e) => {
            let _ = pg.batch("ROLLBACK");
            Err(e)
        }
    }
}

fn refuse_non_empty(pg: &PgConn, target: &Target) -> anyhow::Result<()> {
    for (table, _, _) in TABLES.iter().chain([&("agents", "", "")]) {
        let n: Option<i64> = (pg as &dyn Db).value(&format!("SELECT COUNT(*) FROM {table}"), &[])?;
        if n.unwrap_or(0) > 0 {
            anyhow::bail!(
                "{}: the target is not empty ({table} has {} rows); migrate into a new schema (database.schema) \
                 or drop this one first",
                target.shown,
                n.unwrap_or(0)
            );
        }
    }
    Ok(())
}

fn copy_all(source: &rusqlite::Connection, pg: &PgConn) -> anyhow::Result<Vec<Copied>> {
    let mut report = Vec::new();
    for &(table, cols, key) in TABLES {
        let (rows, checksum) = read_table(source, table, cols, key)?;
        let width = cols.split(',').count();
        let marks: Vec<String> = (1..=width).map(|i| format!("?{i}")).collect();
        // Ids are kept as they were (the history's order is its ids').
        let overriding = if ["transitions", "alerts"].contains(&table) { " OVERRIDING SYSTEM VALUE" } else { "" };
        let insert = format!("INSERT INTO {table} ({cols}){overriding} VALUES ({})", marks.join(", "));
        for r in &rows {
            (pg as &dyn Db).execute(&insert, r).with_context(|| format!("copying {table}"))?;
        }
        if !overriding.is_empty() {
            (pg as &dyn Db).query(
                &format!("SELECT setval(pg_get_serial_sequence('{table}', 'id'), COALESCE(MAX(id), 0) + 1, false) FROM {table}"),
                &[],
            )?;
        }
        let (back, copied) = read_table(pg, table, cols, key)?;
        if back.len() != rows.len() || copied != checksum {
            anyhow::bail!(
                "{table}: the copy does not match the source ({} rows, checksum {copied}; the source has {} rows, \
                 checksum {checksum}); nothing was committed",
                back.len(),
                rows.len()
            );
        }
        report.push(Copied { table, rows: rows.len(), checksum });
    }
    Ok(report)
}

use anyhow::Context as _;
