//! Migration 23 (SQLite): the history rows kept by instance. `transitions`
//! becomes a table clustered on `(instance_id, id)` — an instance's rows
//! side by side, found without the `(instance_id, id)` index the rowid
//! table needed beside it — with its times as microseconds since the epoch
//! (eight bytes, not twenty-seven). The rows are copied in batches, each
//! committed with how far it got, so a migration cut off (a kill, a full
//! disk) resumes at the next start where it stood; the swap is one last
//! transaction with the version.

use rusqlite::{params, Connection};

/// Rows copied per transaction.
const BATCH: i64 = 20_000;

const NEW_TABLE: &str = "CREATE TABLE IF NOT EXISTS transitions_by_instance (
    instance_id TEXT NOT NULL,
    id          INTEGER NOT NULL,
    step_seq    INTEGER,
    from_state  TEXT,
    to_state    TEXT NOT NULL,
    reason      TEXT NOT NULL,
    actor       TEXT NOT NULL,
    at          INTEGER NOT NULL,
    PRIMARY KEY (instance_id, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS migration_cursor (name TEXT PRIMARY KEY, last INTEGER NOT NULL) WITHOUT ROWID;";

/// The swap: the old table and its index go, the new one takes the name,
/// with [`GUARDS`].
const SWAP: &str = "DROP TABLE transitions;
ALTER TABLE transitions_by_instance RENAME TO transitions;
DROP TABLE migration_cursor;";

/// The history's operators' index and append-only guards, made again on
/// each rebuilt table as the old one had them.
pub(super) const GUARDS: &str = "CREATE INDEX transitions_operator ON transitions(id)
    WHERE substr(actor, 1, 6) <> 'agent:' AND actor <> 'scheduler';
CREATE TRIGGER transitions_append_only_update BEFORE UPDATE ON transitions
    BEGIN SELECT RAISE(ABORT, 'transitions are append-only'); END;
CREATE TRIGGER transitions_append_only_delete BEFORE DELETE ON transitions
    WHEN NOT EXISTS (SELECT 1 FROM archive WHERE id = OLD.instance_id)
    BEGIN SELECT RAISE(ABORT, 'transitions are append-only'); END;";

pub(super) fn history_by_instance(conn: &mut Connection, version: usize) -> anyhow::Result<()> {
    conn.execute_batch(NEW_TABLE)?;
    let total: i64 = conn.query_row("SELECT COUNT(*) FROM transitions", [], |r| r.get(0))?;
    let mut copied = 0;
    // The tests copy a few rows a batch (`schema.history_batch=return(5)`).
    let batch = || -> i64 {
        fail::fail_point!("schema.history_batch", |n| n.and_then(|n| n.parse().ok()).unwrap_or(BATCH));
        BATCH
    };
    let batch = batch();
    loop {
        let tx = conn.transaction()?;
        let last: i64 =
            tx.query_row("SELECT last FROM migration_cursor WHERE name = 'transitions'", [], |r| r.get(0)).unwrap_or(0);
        let (n, high) = copy_after(&tx, last, batch)?;
        if n == 0 {
            tx.execute_batch(SWAP)?;
            tx.execute_batch(GUARDS)?;
            tx.pragma_update(None, "user_version", version as i64)?;
            tx.commit()?;
            return Ok(());
        }
        tx.execute(
            "INSERT INTO migration_cursor (name, last) VALUES ('transitions', ?1) \
             ON CONFLICT (name) DO UPDATE SET last = excluded.last",
            params![high],
        )?;
        tx.commit()?;
        crate::crash_point!("schema.after_history_batch");
        copied += n;
        if total > batch {
            tracing::info!("schema {version}: history rows kept by instance: {copied} of about {total} copied");
        }
    }
}

/// Copies up to a batch of rows numbered after `last`: how many, and the
/// highest number copied.
fn copy_after(tx: &rusqlite::Transaction, last: i64, batch: i64) -> anyhow::Result<(i64, i64)> {
    let mut read = tx.prepare(
        "SELECT id, instance_id, step_seq, from_state, to_state, reason, actor, at FROM transitions \
         WHERE id > ?1 ORDER BY id LIMIT ?2",
    )?;
    let mut write = tx.prepare(
        "INSERT OR IGNORE INTO transitions_by_instance \
         (id, instance_id, step_seq, from_state, to_state, reason, actor, at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    let mut rows = read.query(params![last, batch])?;
    let (mut n, mut high) = (0, last);
    while let Some(r) = rows.next()? {
        let id: i64 = r.get(0)?;
        let at: String = r.get(7)?;
        // A time that does not parse is kept as it is (reads take both).
        let at = match chrono::DateTime::parse_from_rfc3339(&at) {
            Ok(t) => rusqlite::types::Value::Integer(t.timestamp_micros()),
            Err(_) => rusqlite::types::Value::Text(at),
        };
        write.execute(params![
            id,
            r.get::<_, String>(1)?,
            r.get::<_, Option<i64>>(2)?,
            r.get::<_, Option<String>>(3)?,
            r.get::<_, String>(4)?,
            r.get::<_, String>(5)?,
            r.get::<_, String>(6)?,
            at
        ])?;
        (n, high) = (n + 1, id);
    }
    Ok((n, high))
}
