//! Schema migrations, applied in order at open; `user_version` records the
//! last one applied.

use rusqlite::Connection;

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
];

/// The newest schema this build knows.
pub const VERSION: usize = MIGRATIONS.len();

pub fn migrate(conn: &mut Connection) -> anyhow::Result<()> {
    let current: usize = conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))? as usize;
    if current > VERSION {
        return Err(anyhow::anyhow!(
            "the store's schema is version {current}, newer than this agent knows (version {VERSION}); \
             run the newer apollo-agent that wrote it"
        ));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}
