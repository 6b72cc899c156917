//! The migrations both backends run, word for word, and SQLite's code
//! migrations that are SQL alone.

use rusqlite::Connection;

/// Canary rollouts of plugin versions (both backends; their starts and ends
/// are audited as history rows whose instance is the rollout's id), and the
/// arms each instance was given when it was created (JSON, see `Pins`).
pub(super) const ROLLOUTS: &str = "CREATE TABLE rollouts (\
        id TEXT PRIMARY KEY, plugin TEXT NOT NULL, version TEXT NOT NULL, base TEXT NOT NULL, \
        share_pct DOUBLE PRECISION NOT NULL, agents TEXT NOT NULL, state TEXT NOT NULL, \
        started_at TEXT NOT NULL, started_by TEXT NOT NULL, reason TEXT NOT NULL, \
        ended_at TEXT, ended_by TEXT, end_reason TEXT, \
        abort_margin_pct DOUBLE PRECISION NOT NULL, min_runs INTEGER NOT NULL); \
    CREATE UNIQUE INDEX rollouts_running ON rollouts(plugin) WHERE state = 'running'; \
    ALTER TABLE task_instances ADD COLUMN pins TEXT;";

/// Approval steps' requests and decisions (both backends; one request per
/// instance, step and attempt), and the request an instance is parked on.
pub(super) const APPROVALS: &str = "CREATE TABLE approvals (\
        id TEXT PRIMARY KEY, instance_id TEXT NOT NULL, task TEXT NOT NULL, step TEXT NOT NULL, \
        seq INTEGER NOT NULL, attempt INTEGER NOT NULL, message TEXT NOT NULL, approvers TEXT NOT NULL, \
        requested_by TEXT NOT NULL, distinct_approver INTEGER NOT NULL, requested_at TEXT NOT NULL, \
        deadline TEXT, on_timeout TEXT NOT NULL, decision TEXT, decided_by TEXT, decided_at TEXT, reason TEXT); \
    CREATE UNIQUE INDEX approvals_once ON approvals(instance_id, seq, attempt); \
    CREATE INDEX approvals_open ON approvals(deadline) WHERE decision IS NULL; \
    ALTER TABLE task_instances ADD COLUMN approval TEXT;";

/// An operator may roll back a SUCCESS instance: an instance whose
/// rollback is under way is FAILED or SUCCESS with `rollback_pending`, and
/// is found by that flag alone (both backends).
pub(super) const ROLLBACK_OF_SUCCESS: &str = "DROP INDEX task_instances_rolling_back; \
    CREATE INDEX task_instances_rolling_back ON task_instances(queue, task) WHERE rollback_pending = 1;";

/// A listing by queue, and the archive's by state or queue, read an index
/// as those by state and task do (both backends).
pub(super) const LISTING_INDEXES: &str = "CREATE INDEX task_instances_queue ON task_instances(queue, id); \
    CREATE INDEX archive_state ON archive(state, id); \
    CREATE INDEX archive_queue ON archive(queue, id);";

/// The locks an instance holds while it is under way (JSON, rendered from
/// its definition's `locks:` when it was created; `NULL`: none), and the
/// index claims read the holders by (both backends).
pub(super) const LOCKS: &str = "ALTER TABLE task_instances ADD COLUMN locks TEXT; \
    CREATE INDEX task_instances_locked ON task_instances(state) WHERE locks IS NOT NULL;";

/// Operators' pauses (both backends; begun and ended as history rows whose
/// instance is the pause's id). Times are the store's clock, as text.
pub(super) const PAUSES: &str = "CREATE TABLE pauses (\
        id TEXT PRIMARY KEY, scope TEXT NOT NULL, target TEXT, reason TEXT NOT NULL, \
        paused_by TEXT NOT NULL, since TEXT NOT NULL, until_at TEXT, \
        ended_at TEXT, ended_by TEXT, end_reason TEXT); \
    CREATE INDEX pauses_in_force ON pauses(ended_at) WHERE ended_at IS NULL;";

/// Steps that failed and were let through: the step's mark (it never runs
/// again) and the instance's count (both backends).
pub(super) const LET_THROUGH: &str = "ALTER TABLE step_runs ADD COLUMN passed INTEGER NOT NULL DEFAULT 0; \
    ALTER TABLE task_instances ADD COLUMN failed_steps INTEGER NOT NULL DEFAULT 0;";

/// Each agent's plugin registrations as its heartbeat publishes them
/// (JSON: name, version, digest), and why a runnable instance waits (no
/// live agent can run it), both backends.
pub(super) const CAPABILITIES: &str = "ALTER TABLE agents ADD COLUMN plugins TEXT; \
    ALTER TABLE task_instances ADD COLUMN waiting TEXT;";

/// The timeout learned for a step's attempt and its basis (both backends;
/// NULL for a fixed timeout, which the definition version says).
pub(super) const LEARNED_TIMEOUT: &str = "ALTER TABLE step_runs ADD COLUMN timeout_secs DOUBLE PRECISION; \
    ALTER TABLE step_runs ADD COLUMN timeout_basis TEXT; \
    ALTER TABLE step_attempts ADD COLUMN timeout_secs DOUBLE PRECISION; \
    ALTER TABLE step_attempts ADD COLUMN timeout_basis TEXT;";

/// How each attempt in `step_attempts` ended: `failed` (it counts against
/// its plugin, in `apollo plugins`) or `interrupted` (a restart, a cancel:
/// not the plugin's doing). Rows from before this column are read by their
/// error's first word.
pub(super) const ATTEMPT_OUTCOME: &str = "ALTER TABLE step_attempts ADD COLUMN outcome TEXT;";

/// Each failed or interrupted attempt of a step as it ended (both
/// backends); the last attempt stays in `step_runs`. Written only when an
/// attempt fails, so a step that succeeds at once costs nothing more.
pub(super) const STEP_ATTEMPTS: &str = r#"
CREATE TABLE step_attempts (
    instance_id    TEXT NOT NULL,
    seq            INTEGER NOT NULL,
    attempt        INTEGER NOT NULL,
    plugin_version TEXT,
    params         TEXT,
    error          TEXT,
    started_at     TEXT,
    finished_at    TEXT NOT NULL,
    PRIMARY KEY (instance_id, seq, attempt)
);
"#;

/// The agents table (both backends).
pub(super) const AGENTS: &str = r#"
CREATE TABLE agents (
    name         TEXT PRIMARY KEY,
    id           TEXT NOT NULL,
    host         TEXT NOT NULL,
    version      TEXT NOT NULL,
    queues       TEXT NOT NULL,
    running      INTEGER NOT NULL,
    lease_secs   DOUBLE PRECISION NOT NULL,
    started_at   TEXT NOT NULL,
    heartbeat_at TEXT NOT NULL,
    stopped_at   TEXT
);
"#;

/// Fan-out steps' items, one row each (both backends), and each fan-out
/// step's plan (JSON: items, batches, budget, the batch under way).
pub(super) const FANOUT: &str = "CREATE TABLE step_items (\
        instance_id TEXT NOT NULL, seq INTEGER NOT NULL, idx INTEGER NOT NULL, \
        label TEXT NOT NULL, value TEXT NOT NULL, batch INTEGER NOT NULL, state TEXT NOT NULL, \
        attempts INTEGER NOT NULL DEFAULT 0, params TEXT, output TEXT, error TEXT, \
        started_at TEXT, finished_at TEXT, done INTEGER, history TEXT NOT NULL DEFAULT '', \
        PRIMARY KEY (instance_id, seq, idx)); \
    ALTER TABLE step_runs ADD COLUMN fanout TEXT;";

/// The archive's oldest ends first, for `scheduler.archive_retention`
/// (both backends).
pub(super) const ARCHIVE_ENDS: &str = "CREATE INDEX archive_finished ON archive(finished_at);";

/// An instance's alerts, for its timeline (both backends).
pub(super) const ALERTS_BY_INSTANCE: &str =
    "CREATE INDEX alerts_instance ON alerts(instance_id, id) WHERE instance_id IS NOT NULL;";

/// Items claimed one by one, by any agent that can run them: who ran an
/// item's last attempt (`holder`, an agent id) and in which life of its
/// step (`round`); and, while a fan-out step runs a batch, its offer — the
/// batch's range, the step's limits and what runs and failed in this life
/// — which every claim of an item reads and moves (both backends).
pub(super) const ITEM_CLAIMS: &str = "ALTER TABLE step_items ADD COLUMN holder TEXT; \
    ALTER TABLE step_items ADD COLUMN round INTEGER NOT NULL DEFAULT 0; \
    CREATE TABLE item_offers (\
        instance_id TEXT NOT NULL, seq INTEGER NOT NULL, batch INTEGER NOT NULL, round INTEGER NOT NULL, \
        first INTEGER NOT NULL, last INTEGER NOT NULL, next INTEGER NOT NULL, \
        parallel INTEGER NOT NULL, budget INTEGER NOT NULL, \
        running INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0, done INTEGER NOT NULL DEFAULT 0, \
        PRIMARY KEY (instance_id, seq));";

/// 25: the runnable rows by priority alone: claims read them by task.
pub(super) const NO_RUNNABLE_INDEX: &str = "DROP INDEX IF EXISTS task_instances_runnable;";

/// Claims read runnable rows by task: the index by priority alone only cost writes.
pub(super) fn no_runnable_index(conn: &mut Connection, version: usize) -> anyhow::Result<()> {
    in_one_transaction(conn, version, NO_RUNNABLE_INDEX)
}

pub(super) fn item_claims(conn: &mut Connection, version: usize) -> anyhow::Result<()> {
    // The offers are read and moved by key only: kept by it.
    let sql = ITEM_CLAIMS.replace("PRIMARY KEY (instance_id, seq));", "PRIMARY KEY (instance_id, seq)) WITHOUT ROWID;");
    in_one_transaction(conn, version, &sql)
}

/// A code migration that is SQL alone: run and recorded in one commit.
fn in_one_transaction(conn: &mut Connection, version: usize, sql: &str) -> anyhow::Result<()> {
    let tx = conn.transaction()?;
    tx.execute_batch(sql)?;
    tx.pragma_update(None, "user_version", version as i64)?;
    Ok(tx.commit()?)
}

/// 27: the counts the triggers keep are of the ended states only (SUCCESS,
/// ROLLED_BACK: those that grow with the store's age); the live ones
/// (PENDING, RUNNING, FAILED, RETRYING) are counted on the state index when
/// read (`Driver::state_counts`), so a claim or a retry's move writes no
/// count. A SQLite store's instances are created PENDING, always
/// (`write::create`; promotion copies into PostgreSQL, never into SQLite):
/// no trigger on insert, so a create's statement needs no statement
/// journal. The update's trigger fires only when an ended state is on
/// either side of the change, the delete's when an ended row goes.
pub(super) const ENDED_COUNTS: &str = "DROP TRIGGER state_counts_insert; \
    DROP TRIGGER state_counts_update; \
    DROP TRIGGER state_counts_delete; \
    DELETE FROM state_counts WHERE state NOT IN ('SUCCESS', 'ROLLED_BACK'); \
    CREATE TRIGGER state_counts_update AFTER UPDATE OF state ON task_instances \
        WHEN OLD.state <> NEW.state \
            AND (OLD.state IN ('SUCCESS', 'ROLLED_BACK') OR NEW.state IN ('SUCCESS', 'ROLLED_BACK')) \
        BEGIN \
            UPDATE state_counts SET n = n - 1 WHERE state = OLD.state; \
            UPDATE state_counts SET n = n + 1 WHERE state = NEW.state; \
        END; \
    CREATE TRIGGER state_counts_delete AFTER DELETE ON task_instances \
        WHEN OLD.state IN ('SUCCESS', 'ROLLED_BACK') \
        BEGIN UPDATE state_counts SET n = n - 1 WHERE state = OLD.state; END;";

/// A move of a live instance writes no count: see [`ENDED_COUNTS`].
pub(super) fn ended_counts(conn: &mut Connection, version: usize) -> anyhow::Result<()> {
    in_one_transaction(conn, version, ENDED_COUNTS)
}

/// 28: the operators' index of the history without a function in its
/// condition, which is evaluated for every history row written (five an
/// instance: `substr` cost 4,000 instructions an instance). The rows are
/// the same: text that starts with `agent:` is exactly the text from
/// `agent:` up to `agent;` (`;` follows `:`), in SQLite's binary order. The
/// audit reads with the same condition (`Driver::operator_rows`).
pub(super) const OPERATORS_WITHOUT_FUNCTION: &str = "DROP INDEX transitions_operator; \
    CREATE INDEX transitions_operator ON transitions(id) \
        WHERE (actor < 'agent:' OR actor >= 'agent;') AND actor <> 'scheduler';";

/// See [`OPERATORS_WITHOUT_FUNCTION`].
pub(super) fn operators_without_function(conn: &mut Connection, version: usize) -> anyhow::Result<()> {
    in_one_transaction(conn, version, OPERATORS_WITHOUT_FUNCTION)
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    /// Schema 28's condition picks the rows `substr` picked, and SQLite
    /// serves the audit's condition from the index made with it.
    #[test]
    fn the_operators_index_picks_the_rows_substr_picked() {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch("CREATE TABLE transitions (id INTEGER PRIMARY KEY, actor TEXT NOT NULL)").unwrap();
        let actors = [
            "agent:a:1",
            "agent:",
            "agent::x",
            "agent",
            "agent;x",
            "agent9",
            "agentx:1",
            "agent-smith (uid 1000)",
            "Agent:x",
            "agen",
            "",
            "root (uid 0)",
            "scheduler",
            "scheduler2",
            "automatic abort (agent a)",
            "zz",
        ];
        for a in actors {
            c.execute("INSERT INTO transitions (actor) VALUES (?1)", [a]).unwrap();
        }
        let rows = |cond: &str| -> Vec<String> {
            let sql = format!("SELECT actor FROM transitions WHERE {cond} ORDER BY id");
            let mut st = c.prepare(&sql).unwrap();
            st.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
        };
        let by_substr = rows("substr(actor, 1, 6) <> 'agent:' AND actor <> 'scheduler'");
        assert_eq!(by_substr.len(), actors.len() - 4, "{by_substr:?}");
        c.execute_batch(
            "CREATE INDEX transitions_operator ON transitions(id) \
             WHERE substr(actor, 1, 6) <> 'agent:' AND actor <> 'scheduler';",
        )
        .unwrap();
        c.execute_batch(super::OPERATORS_WITHOUT_FUNCTION).unwrap();
        let cond = "(actor < 'agent:' OR actor >= 'agent;') AND actor <> 'scheduler'";
        assert_eq!(rows(cond), by_substr);
        let plan = format!("SELECT MAX(id) FROM transitions INDEXED BY transitions_operator WHERE {cond}");
        c.prepare(&plan).expect("the index serves the condition");
    }
}
