//! Schema migrations, applied in order at open. SQLite's `user_version`
//! records the last one applied; on PostgreSQL the schema's
//! `schema_version` table does. An agent refuses a schema newer than it knows.

use rusqlite::Connection;

mod clustered;
mod compact;
pub(super) use compact::{reason_code, state_code};
mod statements;
use statements::*;

const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    r#"
CREATE TABLE task_defs (
    hash        TEXT PRIMARY KEY,
    task        TEXT NOT NULL,
    file        TEXT NOT NULL,
    source      TEXT NOT NULL,
    created_at  TEXT NOT NULL
);
CREATE TABLE task_instances (
    id               TEXT PRIMARY KEY,
    task             TEXT NOT NULL,
    def_hash         TEXT NOT NULL REFERENCES task_defs(hash),
    queue            TEXT NOT NULL,
    priority         INTEGER NOT NULL,
    max_active       INTEGER,
    state            TEXT NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 1,
    params           TEXT NOT NULL,
    context          TEXT NOT NULL,
    trace_id         TEXT NOT NULL,
    trigger          TEXT NOT NULL,
    dedup_key        TEXT UNIQUE,
    expected_secs    REAL NOT NULL,
    created_at       TEXT NOT NULL,
    started_at       TEXT,
    finished_at      TEXT,
    updated_at       TEXT NOT NULL,
    next_run_at      TEXT,
    lease_owner      TEXT,
    lease_expires_at TEXT,
    error            TEXT,
    rollback_pending INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX task_instances_runnable ON task_instances(priority DESC, id)
    WHERE state IN ('PENDING', 'RETRYING');
CREATE INDEX task_instances_state ON task_instances(state, id);
CREATE INDEX task_instances_task ON task_instances(task, id);
CREATE TABLE step_runs (
    instance_id    TEXT NOT NULL REFERENCES task_instances(id),
    seq            INTEGER NOT NULL,
    name           TEXT NOT NULL,
    plugin         TEXT NOT NULL,
    plugin_version TEXT,
    state          TEXT NOT NULL,
    attempts       INTEGER NOT NULL DEFAULT 0,
    failures       INTEGER NOT NULL DEFAULT 0,
    params         TEXT,
    output         TEXT,
    error          TEXT,
    started_at     TEXT,
    finished_at    TEXT,
    PRIMARY KEY (instance_id, seq)
) WITHOUT ROWID;
CREATE TABLE transitions (
    id          INTEGER PRIMARY KEY,
    instance_id TEXT NOT NULL,
    step_seq    INTEGER,
    from_state  TEXT,
    to_state    TEXT NOT NULL,
    reason      TEXT NOT NULL,
    actor       TEXT NOT NULL,
    at          TEXT NOT NULL
);
CREATE INDEX transitions_instance ON transitions(instance_id, id);
CREATE TRIGGER transitions_append_only_update BEFORE UPDATE ON transitions
    BEGIN SELECT RAISE(ABORT, 'transitions are append-only'); END;
CREATE TRIGGER transitions_append_only_delete BEFORE DELETE ON transitions
    WHEN NOT EXISTS (SELECT 1 FROM archive WHERE id = OLD.instance_id)
    BEGIN SELECT RAISE(ABORT, 'transitions are append-only'); END;
CREATE TABLE alerts (
    id          INTEGER PRIMARY KEY,
    at          TEXT NOT NULL,
    kind        TEXT NOT NULL,
    message     TEXT NOT NULL,
    instance_id TEXT
);
CREATE TABLE events (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    data        TEXT,
    dedup_key   TEXT UNIQUE,
    received_at TEXT NOT NULL,
    instances   TEXT NOT NULL
);
CREATE TABLE archive (
    id          TEXT PRIMARY KEY,
    task        TEXT NOT NULL,
    state       TEXT NOT NULL,
    finished_at TEXT,
    archived_at TEXT NOT NULL,
    doc         TEXT NOT NULL
);
"#,
    // 2: the last fire of each schedule.
    r#"
CREATE TABLE cron_state (
    task      TEXT PRIMARY KEY,
    last_fire TEXT NOT NULL
);
"#,
    // 3: claims read each task's runnable head; instances being rolled back
    // are found without walking every FAILED instance ever kept.
    r#"
CREATE INDEX task_instances_runnable_task ON task_instances(task, priority DESC, id)
    WHERE state IN ('PENDING', 'RETRYING');
CREATE INDEX task_instances_rolling_back ON task_instances(queue, task)
    WHERE state = 'FAILED' AND rollback_pending = 1;
"#,
    // 4: instances per state, kept by triggers, so `agent.status` costs the
    // same with a million finished instances as with none.
    r#"
CREATE TABLE state_counts (state TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO state_counts (state, n)
    SELECT s.state, (SELECT COUNT(*) FROM task_instances t WHERE t.state = s.state)
    FROM (SELECT 'PENDING' AS state UNION ALL SELECT 'RUNNING' UNION ALL SELECT 'SUCCESS'
          UNION ALL SELECT 'FAILED' UNION ALL SELECT 'RETRYING' UNION ALL SELECT 'ROLLED_BACK') s;
CREATE TRIGGER state_counts_insert AFTER INSERT ON task_instances
    BEGIN UPDATE state_counts SET n = n + 1 WHERE state = NEW.state; END;
CREATE TRIGGER state_counts_update AFTER UPDATE OF state ON task_instances WHEN OLD.state <> NEW.state
    BEGIN
        UPDATE state_counts SET n = n - 1 WHERE state = OLD.state;
        UPDATE state_counts SET n = n + 1 WHERE state = NEW.state;
    END;
CREATE TRIGGER state_counts_delete AFTER DELETE ON task_instances
    BEGIN UPDATE state_counts SET n = n - 1 WHERE state = OLD.state; END;
"#,
    // 5: the archive keeps dedup keys (a duplicate is refused after its
    // instance is archived) and the queue, for listing with filters.
    r#"
ALTER TABLE archive ADD COLUMN dedup_key TEXT;
ALTER TABLE archive ADD COLUMN queue TEXT;
UPDATE archive SET dedup_key = json_extract(doc, '$.dedup_key'), queue = json_extract(doc, '$.queue');
CREATE UNIQUE INDEX archive_dedup ON archive(dedup_key) WHERE dedup_key IS NOT NULL;
CREATE INDEX archive_task ON archive(task, id);
CREATE INDEX task_instances_finished ON task_instances(finished_at) WHERE finished_at IS NOT NULL;
"#,
    // 6: the rows operators caused (the audit), found without walking the
    // whole history.
    r#"
CREATE INDEX transitions_operator ON transitions(id)
    WHERE substr(actor, 1, 6) <> 'agent:' AND actor <> 'scheduler';
"#,
    // 7: each plugin's latest runs, for its statistics.
    r#"
CREATE INDEX step_runs_plugin ON step_runs(plugin, finished_at) WHERE finished_at IS NOT NULL;
"#,
    // 8: the agents that use the store, with their heartbeats.
    AGENTS,
    // 9: earlier attempts of steps, to compare two attempts.
    STEP_ATTEMPTS,
    // 10: whether an earlier attempt failed or was interrupted.
    ATTEMPT_OUTCOME,
    // 11: the timeout a `timeout: auto` attempt ran under.
    LEARNED_TIMEOUT,
    // 12: what each agent can run; why a runnable instance waits.
    CAPABILITIES,
    // 13: steps failed and let through (`on_failure: continue`).
    LET_THROUGH,
    // 14: plugin version rollouts; each instance's arms.
    ROLLOUTS,
    // 15: operators' pauses.
    PAUSES,
    // 16: the locks each instance takes with its claim.
    LOCKS,
    // 17: approval steps' requests and decisions.
    APPROVALS,
    // 18: an operator's rollback of a SUCCESS instance.
    ROLLBACK_OF_SUCCESS,
    // 19: every listing filter has its index.
    LISTING_INDEXES,
    // 20: fan-out steps' items.
    FANOUT,
    // 21: the archive's deletion past its retention.
    ARCHIVE_ENDS,
    // 22: an instance's alerts, for its timeline.
    ALERTS_BY_INSTANCE,
];

/// SQLite's migrations after [`MIGRATIONS`], each a function that commits
/// as it goes (so an interrupted one resumes where it stood) and sets its
/// version with its last commit.
const CODE_MIGRATIONS: &[fn(&mut Connection, usize) -> anyhow::Result<()>] = &[
    // 23: history rows kept by instance, their times as microseconds.
    clustered::history_by_instance,
    // 24: items claimed one by one, by any agent.
    item_claims,
    // 25: the index no read used.
    no_runnable_index,
    // 26: history rows in fewer bytes.
    compact::history_in_fewer_bytes,
    // 27: counts kept by triggers for the ended states only.
    ended_counts,
    // 28: the operators' index without a function in its condition.
    operators_without_function,
];

/// The newest SQLite schema this build knows.
pub const VERSION: usize = MIGRATIONS.len() + CODE_MIGRATIONS.len();

fn newer(found: usize, known: usize) -> anyhow::Error {
    anyhow::anyhow!(
        "the store's schema is version {found}, newer than this agent knows (version {known}); \
         run the newer apollo-agent that wrote it"
    )
}

pub fn migrate_sqlite(conn: &mut Connection) -> anyhow::Result<()> {
    let current: usize = conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))? as usize;
    if current > VERSION {
        return Err(newer(current, VERSION));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    for (i, migrate) in CODE_MIGRATIONS.iter().enumerate() {
        let version = MIGRATIONS.len() + i + 1;
        if current < version {
            migrate(conn, version)?;
        }
    }
    Ok(())
}

/// PostgreSQL's migrations. The first is SQLite's first seven in one: the same
/// tables, columns and indexes (times as the same sortable text), with
/// PL/pgSQL triggers and the database's clock as `apollo_now()`.
const PG_MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE task_defs (
    hash        TEXT PRIMARY KEY,
    task        TEXT NOT NULL,
    file        TEXT NOT NULL,
    source      TEXT NOT NULL,
    created_at  TEXT NOT NULL
);
CREATE TABLE task_instances (
    id               TEXT PRIMARY KEY,
    task             TEXT NOT NULL,
    def_hash         TEXT NOT NULL REFERENCES task_defs(hash),
    queue            TEXT NOT NULL,
    priority         INTEGER NOT NULL,
    max_active       INTEGER,
    state            TEXT NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 1,
    params           TEXT NOT NULL,
    context          TEXT NOT NULL,
    trace_id         TEXT NOT NULL,
    trigger          TEXT NOT NULL,
    dedup_key        TEXT UNIQUE,
    expected_secs    DOUBLE PRECISION NOT NULL,
    created_at       TEXT NOT NULL,
    started_at       TEXT,
    finished_at      TEXT,
    updated_at       TEXT NOT NULL,
    next_run_at      TEXT,
    lease_owner      TEXT,
    lease_expires_at TEXT,
    error            TEXT,
    rollback_pending INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX task_instances_runnable ON task_instances(priority DESC, id) WHERE state IN ('PENDING', 'RETRYING');
CREATE INDEX task_instances_state ON task_instances(state, id);
CREATE INDEX task_instances_task ON task_instances(task, id);
CREATE INDEX task_instances_runnable_task ON task_instances(task, priority DESC, id)
    WHERE state IN ('PENDING', 'RETRYING');
CREATE INDEX task_instances_rolling_back ON task_instances(queue, task)
    WHERE state = 'FAILED' AND rollback_pending = 1;
CREATE INDEX task_instances_finished ON task_instances(finished_at) WHERE finished_at IS NOT NULL;
CREATE TABLE step_runs (
    instance_id    TEXT NOT NULL REFERENCES task_instances(id),
    seq            INTEGER NOT NULL,
    name           TEXT NOT NULL,
    plugin         TEXT NOT NULL,
    plugin_version TEXT,
    state          TEXT NOT NULL,
    attempts       INTEGER NOT NULL DEFAULT 0,
    failures       INTEGER NOT NULL DEFAULT 0,
    params         TEXT,
    output         TEXT,
    error          TEXT,
    started_at     TEXT,
    finished_at    TEXT,
    PRIMARY KEY (instance_id, seq)
);
CREATE INDEX step_runs_plugin ON step_runs(plugin, finished_at) WHERE finished_at IS NOT NULL;
CREATE TABLE archive (
    id          TEXT PRIMARY KEY,
    task        TEXT NOT NULL,
    state       TEXT NOT NULL,
    finished_at TEXT,
    archived_at TEXT NOT NULL,
    doc         TEXT NOT NULL,
    dedup_key   TEXT,
    queue       TEXT
);
CREATE UNIQUE INDEX archive_dedup ON archive(dedup_key) WHERE dedup_key IS NOT NULL;
CREATE INDEX archive_task ON archive(task, id);
CREATE TABLE transitions (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    instance_id TEXT NOT NULL,
    step_seq    INTEGER,
    from_state  TEXT,
    to_state    TEXT NOT NULL,
    reason      TEXT NOT NULL,
    actor       TEXT NOT NULL,
    at          TEXT NOT NULL
);
CREATE INDEX transitions_instance ON transitions(instance_id, id);
CREATE INDEX transitions_operator ON transitions(id) WHERE substr(actor, 1, 6) <> 'agent:' AND actor <> 'scheduler';
CREATE FUNCTION transitions_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND EXISTS (SELECT 1 FROM archive WHERE id = OLD.instance_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'transitions are append-only';
END $$;
CREATE TRIGGER transitions_append_only BEFORE UPDATE OR DELETE ON transitions
    FOR EACH ROW EXECUTE FUNCTION transitions_append_only();
CREATE TABLE alerts (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          TEXT NOT NULL,
    kind        TEXT NOT NULL,
    message     TEXT NOT NULL,
    instance_id TEXT
);
CREATE TABLE events (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    data        TEXT,
    dedup_key   TEXT UNIQUE,
    received_at TEXT NOT NULL,
    instances   TEXT NOT NULL
);
CREATE TABLE cron_state (
    task      TEXT PRIMARY KEY,
    last_fire TEXT NOT NULL
);
-- Counts per state: every change appends a delta (agents never wait on
-- one another for a counter row); `counts` adds them to the base, and the
-- maintenance folds them in.
CREATE TABLE state_counts (state TEXT PRIMARY KEY, n BIGINT NOT NULL);
INSERT INTO state_counts (state, n)
    VALUES ('PENDING', 0), ('RUNNING', 0), ('SUCCESS', 0), ('FAILED', 0), ('RETRYING', 0), ('ROLLED_BACK', 0);
CREATE TABLE state_deltas (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, state TEXT NOT NULL, d INTEGER NOT NULL);
CREATE FUNCTION state_counts_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO state_deltas (state, d) VALUES (OLD.state, -1);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO state_deltas (state, d) VALUES (NEW.state, 1);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER state_counts_insert AFTER INSERT OR DELETE ON task_instances
    FOR EACH ROW EXECUTE FUNCTION state_counts_keep();
CREATE TRIGGER state_counts_update AFTER UPDATE OF state ON task_instances
    FOR EACH ROW WHEN (OLD.state <> NEW.state) EXECUTE FUNCTION state_counts_keep();
CREATE FUNCTION apollo_now() RETURNS TEXT LANGUAGE sql VOLATILE AS $$
    SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;
CREATE FUNCTION apollo_now_plus(secs DOUBLE PRECISION) RETURNS TEXT LANGUAGE sql VOLATILE AS $$
    SELECT to_char((clock_timestamp() + secs * interval '1 second') AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;
"#,
    AGENTS,
    STEP_ATTEMPTS,
    ATTEMPT_OUTCOME,
    LEARNED_TIMEOUT,
    CAPABILITIES,
    LET_THROUGH,
    ROLLOUTS,
    PAUSES,
    LOCKS,
    APPROVALS,
    ROLLBACK_OF_SUCCESS,
    LISTING_INDEXES,
    FANOUT,
    ARCHIVE_ENDS,
    ALERTS_BY_INSTANCE,
    ITEM_CLAIMS,
    NO_RUNNABLE_INDEX,
];

/// The newest PostgreSQL schema this build knows.
pub const PG_VERSION: usize = PG_MIGRATIONS.len();

/// Creates the schema if needed and applies what it lacks, one agent at a
/// time (several may start together).
pub fn migrate_postgres(c: &mut super::postgres::PgConn, schema: &str) -> anyhow::Result<()> {
    use super::db::Conn as _;
    c.batch("BEGIN")?;
    let result = migrate_in(c, schema).and_then(|()| Ok(c.batch("COMMIT")?));
    if result.is_err() {
        let _ = c.batch("ROLLBACK");
    }
    result
}

fn migrate_in(c: &mut super::postgres::PgConn, schema: &str) -> anyhow::Result<()> {
    use super::db::Conn as _;
    use super::db::Db;
    use super::value::p;
    let quoted = super::postgres::quote_ident(schema);
    (&*c as &dyn Db).query("SELECT pg_advisory_xact_lock(hashtext(?1 || '.migrate'))", p![schema])?;
    c.batch(&format!(
        "CREATE SCHEMA IF NOT EXISTS {quoted}; SET LOCAL search_path TO {quoted}; \
         CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"
    ))?;
    let current: Option<i64> = (&*c as &dyn Db).value("SELECT version FROM schema_version", &[])?;
    let current = current.unwrap_or(0) as usize;
    if current > PG_VERSION {
        return Err(newer(current, PG_VERSION));
    }
    for sql in PG_MIGRATIONS.iter().skip(current) {
        c.batch(sql)?;
    }
    if current < PG_VERSION {
        c.batch(&format!("DELETE FROM schema_version; INSERT INTO schema_version (version) VALUES ({PG_VERSION})"))?;
    }
    Ok(())
}
