//! Migration 26 (SQLite): history rows in fewer bytes. A row's states and
//! its most common reasons are kept as small numbers (one byte, or none for
//! 0 and 1) and its time as how far it lies behind the row's number (0 or 1
//! microseconds almost always: both come from the same clock), read back
//! through generated columns under the old names, so every read of
//! `transitions` reads what it read before. A value with no code (a pause's
//! or a rollout's state, any other reason) is kept as the text itself; the
//! codes' columns have no type, so neither is converted.
//!
//! The rows are copied in key order, a batch a transaction; the copy is its
//! own cursor (it resumes after the highest key it holds), so a migration
//! cut off resumes at the next start where it stood; the swap is one last
//! transaction with the version.

use rusqlite::{params, Connection, OptionalExtension};

/// The states a history row names, by code. The schema decodes them, so
/// the list only grows with a migration that changes the columns.
const STATES: [&str; 7] = ["PENDING", "RUNNING", "SUCCESS", "FAILED", "RETRYING", "ROLLED_BACK", "SKIPPED"];

/// The reasons nearly every instance's rows give, by code (same rule).
const REASONS: [&str; 7] =
    ["succeeded", "attempt 1", "claimed", "all steps succeeded", "created by manual", "attempt 2", "attempt 3"];

/// Rows copied per transaction.
const BATCH: i64 = 20_000;

/// A state as the history keeps it: its code, or the text.
pub fn state_code(state: &str) -> crate::store::value::V {
    coded(&STATES, state)
}

/// A reason as the history keeps it: its code, or the text.
pub fn reason_code(reason: &str) -> crate::store::value::V {
    coded(&REASONS, reason)
}

fn coded(list: &[&str], text: &str) -> crate::store::value::V {
    use crate::store::value::V;
    list.iter().position(|s| *s == text).map_or_else(|| V::from(text), |i| V::Int(i as i64))
}

/// `CASE column WHEN 0 THEN 'A' … ELSE column END`: a code read back.
fn decode(column: &str, list: &[&str]) -> String {
    let arms: String = list.iter().enumerate().map(|(i, s)| format!(" WHEN {i} THEN '{s}'")).collect();
    format!("CASE {column}{arms} ELSE {column} END")
}

/// `CASE expr WHEN 'A' THEN 0 … ELSE expr END`: a text made a code.
fn encode(expr: &str, list: &[&str]) -> String {
    let arms: String = list.iter().enumerate().map(|(i, s)| format!(" WHEN '{s}' THEN {i}")).collect();
    format!("CASE {expr}{arms} ELSE {expr} END")
}

fn new_table() -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS transitions_compact (
    instance_id TEXT NOT NULL,
    id          INTEGER NOT NULL,
    step_seq    INTEGER,
    from_code,
    to_code     NOT NULL,
    reason_code NOT NULL,
    actor       TEXT NOT NULL,
    at_lag      NOT NULL,
    from_state  TEXT GENERATED ALWAYS AS ({from}) VIRTUAL,
    to_state    TEXT GENERATED ALWAYS AS ({to}) VIRTUAL,
    reason      TEXT GENERATED ALWAYS AS ({reason}) VIRTUAL,
    at          INTEGER GENERATED ALWAYS AS (CASE WHEN typeof(at_lag) = 'integer' THEN id - at_lag ELSE at_lag END) VIRTUAL,
    PRIMARY KEY (instance_id, id)
) WITHOUT ROWID;",
        from = decode("from_code", &STATES),
        to = decode("to_code", &STATES),
        reason = decode("reason_code", &REASONS),
    )
}

/// The swap: the old table goes, the new one takes the name, with the
/// history's guards (`clustered::GUARDS`).
const SWAP: &str = "DROP TABLE transitions;
ALTER TABLE transitions_compact RENAME TO transitions;";

pub(super) fn history_in_fewer_bytes(conn: &mut Connection, version: usize) -> anyhow::Result<()> {
    conn.execute_batch(&new_table())?;
    // A time kept as text (one migration 23 could not read) stays text.
    let copy = format!(
        "INSERT INTO transitions_compact \
         (instance_id, id, step_seq, from_code, to_code, reason_code, actor, at_lag) \
         SELECT instance_id, id, step_seq, {from}, {to}, {reason}, actor, \
                CASE WHEN typeof(at) = 'integer' THEN id - at ELSE at END \
         FROM transitions WHERE (instance_id, id) > (?1, ?2) ORDER BY instance_id, id LIMIT ?3",
        from = encode("from_state", &STATES),
        to = encode("to_state", &STATES),
        reason = encode("reason", &REASONS),
    );
    let total: i64 = conn.query_row("SELECT COUNT(*) FROM transitions", [], |r| r.get(0))?;
    // The tests copy a few rows a batch (`schema.compact_batch=return(5)`).
    let batch = || -> i64 {
        fail::fail_point!("schema.compact_batch", |n| n.and_then(|n| n.parse().ok()).unwrap_or(BATCH));
        BATCH
    };
    let batch = batch();
    let mut copied = 0;
    loop {
        let tx = conn.transaction()?;
        let last = "SELECT instance_id, id FROM transitions_compact ORDER BY instance_id DESC, id DESC LIMIT 1";
        let (instance, id): (String, i64) =
            tx.query_row(last, [], |r| Ok((r.get(0)?, r.get(1)?))).optional()?.unwrap_or_default();
        let n = tx.execute(&copy, params![instance, id, batch])?;
        if n == 0 {
            tx.execute_batch(SWAP)?;
            tx.execute_batch(super::clustered::GUARDS)?;
            tx.pragma_update(None, "user_version", version as i64)?;
            tx.commit()?;
            return Ok(());
        }
        tx.commit()?;
        crate::crash_point!("schema.after_compact_batch");
        copied += n;
        if total > batch {
            tracing::info!("schema {version}: history rows in fewer bytes: {copied} of about {total} copied");
        }
    }
}
