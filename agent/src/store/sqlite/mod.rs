//! The SQLite backend: one file, one writer connection owned by the writer
//! thread, read-only connections for queries. The embedded default.

mod driver;

pub use driver::DRIVER;

use super::db::{Conn, Db, Driver};
use super::rows::ts;
use super::value::{Row, V};
use super::{Result, StoreError};
use chrono::Utc;
use rusqlite::functions::FunctionFlags;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OpenFlags};
use std::path::Path;

/// SQLite's page cache of the writer, in KiB (negative: a size, not pages):
/// 8 MiB keeps claim and step costs flat with 200,000 instances in the
/// store (history_bench) and the agent under 40 MB with 10,000 queued.
const CACHE_KIB: i64 = -8 * 1024;
/// Prepared statements kept per connection: more than the store has.
const STATEMENTS: usize = 128;

impl rusqlite::ToSql for V {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            V::Null => ToSqlOutput::Borrowed(ValueRef::Null),
            V::Int(i) => ToSqlOutput::Borrowed(ValueRef::Integer(*i)),
            V::Real(f) => ToSqlOutput::Borrowed(ValueRef::Real(*f)),
            V::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
            V::Blob(b) => ToSqlOutput::Borrowed(ValueRef::Blob(b)),
        })
    }
}

impl Db for Connection {
    fn execute(&self, sql: &str, params: &[V]) -> Result<u64> {
        Ok(self.prepare_cached(sql)?.execute(rusqlite::params_from_iter(params))? as u64)
    }

    fn query(&self, sql: &str, params: &[V]) -> Result<Vec<Row>> {
        let mut st = self.prepare_cached(sql)?;
        let n = st.column_count();
        let mut rows = st.query(rusqlite::params_from_iter(params))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let mut row = Vec::with_capacity(n);
            for i in 0..n {
                row.push(match r.get_ref(i)? {
                    ValueRef::Null => V::Null,
                    ValueRef::Integer(i) => V::Int(i),
                    ValueRef::Real(f) => V::Real(f),
                    ValueRef::Text(t) => V::Text(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Blob(b) => V::Blob(b.to_vec()),
                });
            }
            out.push(Row(row));
        }
        Ok(out)
    }

    fn driver(&self) -> &'static dyn Driver {
        &DRIVER
    }
}

impl Conn for Connection {
    fn db(&self) -> &dyn Db {
        self
    }

    fn begin(&mut self) -> Result<()> {
        self.batch("BEGIN IMMEDIATE")
    }

    /// The writer's transaction statements (BEGIN, SAVEPOINT, RELEASE,
    /// COMMIT), each prepared once and kept: parsing them anew on every
    /// write cost more than some of the writes.
    fn batch(&mut self, sql: &str) -> Result<()> {
        for one in sql.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            self.prepare_cached(one)?.raw_execute()?;
        }
        Ok(())
    }

    fn in_transaction(&self) -> bool {
        !self.is_autocommit()
    }

    fn changes(&self) -> u64 {
        self.total_changes()
    }
}

/// The database's clock, as the store's SQL reads it: `apollo_now()` and
/// `apollo_now_plus(seconds)` in the stored time format.
fn add_clock(c: &Connection) -> rusqlite::Result<()> {
    c.create_scalar_function("apollo_now", 0, FunctionFlags::SQLITE_UTF8, |_| Ok(ts(Utc::now())))?;
    c.create_scalar_function("apollo_now_plus", 1, FunctionFlags::SQLITE_UTF8, |ctx| {
        let secs: f64 = ctx.get(0)?;
        let delta = chrono::Duration::microseconds((secs * 1e6) as i64);
        Ok(ts(Utc::now() + delta))
    })
}

/// Opens the writer connection, creating and migrating the database. With
/// `reclaim` (the archive deletes) the file gives deleted pages back: a new
/// one is made so, an existing one is switched by one VACUUM here. Without
/// it nothing changes (the mode costs each write a page-map update).
pub fn open_writer(path: &Path, synchronous_full: bool, reclaim: bool) -> anyhow::Result<Connection> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut conn = Connection::open(path)?;
    if reclaim {
        let mode: i64 = conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
        if mode != 2 {
            conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
            let tables: i64 = conn.query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))?;
            if tables > 0 {
                tracing::info!(path = %path.display(), "switching the store to incremental vacuum (one VACUUM; a large store takes a while)");
                conn.execute_batch("VACUUM")?;
            }
        }
    }
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", if synchronous_full { "FULL" } else { "NORMAL" })?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // The pages every write touches (the heads of the indexes) stay
    // cached however large the history grows.
    conn.pragma_update(None, "cache_size", CACHE_KIB)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    keep_prepared(&conn)?;
    add_clock(&conn)?;
    super::schema::migrate_sqlite(&mut conn)?;
    driver::raise_history_floor(&conn)?;
    Ok(conn)
}

/// A read-only connection for queries.
pub fn open_reader(path: &Path) -> Result<Connection> {
    let c = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI,
    )?;
    c.busy_timeout(std::time::Duration::from_secs(5))?;
    c.pragma_update(None, "cache_size", CACHE_KIB / 16)?;
    keep_prepared(&c)?;
    add_clock(&c)?;
    Ok(c)
}

/// Every statement the store runs stays prepared (rusqlite keeps 16), and
/// runs as prepared whatever is bound to it. Without the query planner's
/// stability guarantee, SQLite 3.54 (3.46 did not) plans a `LIMIT ?` or an
/// `x = ?` with the value bound at the time, and prepares the statement
/// again, the whole schema parsed with it, each time another value is
/// bound: 240 re-preparations and 27 M instructions for 30 instances, 75 %
/// more per instance. The plans the store needs come from its indexes,
/// not from values (the query-plan test holds every listing to them).
fn keep_prepared(c: &Connection) -> rusqlite::Result<()> {
    c.set_prepared_statement_cache_capacity(STATEMENTS);
    c.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

/// Whether an error means the database file cannot be written at all (as
/// opposed to a refused or malformed write), and why.
pub fn storage_failure(e: &StoreError) -> Option<String> {
    use rusqlite::ErrorCode::*;
    let text = match e {
        StoreError::Sql(rusqlite::Error::SqliteFailure(f, m)) => match f.code {
            DiskFull | ReadOnly | SystemIoFailure | CannotOpen => m.clone().unwrap_or_else(|| f.to_string()),
            _ => return None,
        },
        StoreError::Commit(m) => m.clone(),
        _ => return None,
    };
    let lower = text.to_ascii_lowercase();
    ["full", "readonly", "read-only", "i/o", "unable to open", "rolled the transaction back"]
        .iter()
        .any(|w| lower.contains(w))
        .then_some(text)
}

/// Copies the database at `db` to `to` with SQLite's online backup API: a
/// consistent snapshot even while an agent writes (the copy is taken in one
/// read transaction), checked with `PRAGMA quick_check`, written to a
/// `.partial` file and renamed, so `to` is whole or absent.
pub fn backup(db: &Path, to: &Path) -> anyhow::Result<String> {
    use anyhow::Context as _;
    if !db.exists() {
        anyhow::bail!("{}: no store here (is --data-dir or the config right?)", db.display());
    }
    let src = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .with_context(|| format!("{}: cannot open the store", db.display()))?;
    src.busy_timeout(std::time::Duration::from_secs(30))?;
    let partial = to.with_extension("partial");
    let _ = std::fs::remove_file(&partial);
    {
        let mut dst = Connection::open(&partial).with_context(|| format!("{}: cannot create", partial.display()))?;
        let b = rusqlite::backup::Backup::new(&src, &mut dst)?;
        // Every page in one step: one read transaction, one snapshot.
        loop {
            use rusqlite::backup::StepResult;
            match b.step(-1).with_context(|| format!("copying {} to {}", db.display(), partial.display()))? {
                StepResult::Done => break,
                _ => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
    }
    let dst = Connection::open(&partial)?;
    let check: String = dst.query_row("PRAGMA quick_check", [], |r| r.get(0))?;
    if check != "ok" {
        anyhow::bail!("{}: the copy does not check out: {check}", partial.display());
    }
    let instances: i64 = dst.query_row("SELECT COUNT(*) FROM task_instances", [], |r| r.get(0))?;
    let version: i64 = dst.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    drop(dst);
    std::fs::rename(&partial, to).with_context(|| format!("{}: cannot rename into place", to.display()))?;
    Ok(format!("{}: backup of {} ({instances} instances, schema {version})", to.display(), db.display()))
}
