//! The PostgreSQL backend: several agents share one database, each with
//! its own writer connection (group commit, as on SQLite) and a few reader
//! connections, all in one schema (`database.schema`, default `apollo`).
//!
//! The store's SQL runs here with its placeholders renumbered (see
//! [`super::db`]); each statement is prepared once per connection. Claims
//! and takeovers take turns through a transaction-scoped advisory lock, and
//! every state move locks its row first, so two agents never both act on
//! what each one read.

mod driver;
mod moves;

pub use driver::DRIVER;

use super::db::{Conn, Db, Driver};
use super::value::{to_postgres, Row, V};
use super::{Result, StoreError};
use bytes::BytesMut;
use postgres::types::{FromSql, IsNull, ToSql, Type};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::error::Error;

type BoxError = Box<dyn Error + Sync + Send>;

impl ToSql for V {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> std::result::Result<IsNull, BoxError> {
        match (self, ty) {
            (V::Null, _) => Ok(IsNull::Yes),
            (V::Int(i), &Type::INT2) => i16::try_from(*i)?.to_sql(ty, out),
            (V::Int(i), &Type::INT4) => i32::try_from(*i)?.to_sql(ty, out),
            (V::Int(i), &Type::INT8) => i.to_sql(ty, out),
            (V::Int(i), &Type::FLOAT8) => (*i as f64).to_sql(ty, out),
            (V::Int(i), &Type::BOOL) => (*i != 0).to_sql(ty, out),
            (V::Int(i), _) => i.to_string().to_sql(ty, out),
            (V::Real(f), &Type::FLOAT4) => (*f as f32).to_sql(ty, out),
            (V::Real(f), &Type::FLOAT8) => f.to_sql(ty, out),
            (V::Real(f), _) => f.to_string().to_sql(ty, out),
            (V::Text(s), _) => s.as_str().to_sql(ty, out),
            (V::Blob(b), _) => b.as_slice().to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

impl<'a> FromSql<'a> for V {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> std::result::Result<V, BoxError> {
        Ok(match *ty {
            Type::INT2 => V::Int(i16::from_sql(ty, raw)? as i64),
            Type::INT4 => V::Int(i32::from_sql(ty, raw)? as i64),
            Type::INT8 => V::Int(i64::from_sql(ty, raw)?),
            Type::FLOAT4 => V::Real(f32::from_sql(ty, raw)? as f64),
            Type::FLOAT8 => V::Real(f64::from_sql(ty, raw)?),
            Type::BOOL => V::Int(bool::from_sql(ty, raw)? as i64),
            Type::BYTEA => V::Blob(raw.to_vec()),
            _ => V::Text(String::from_utf8_lossy(raw).into_owned()),
        })
    }

    fn from_sql_null(_: &Type) -> std::result::Result<V, BoxError> {
        Ok(V::Null)
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// Where the database is: the parsed URL (with its password) and the schema.
#[derive(Clone)]
pub struct Target {
    pub config: postgres::Config,
    /// The same, for the asynchronous connection that listens.
    pub async_config: tokio_postgres::Config,
    pub schema: String,
    /// The URL without its password, for messages.
    pub shown: String,
    /// TLS (rustls), when the URL asks for it with `sslmode=require`; the
    /// server's certificate is checked against the web's roots and
    /// `database.ca_file`'s.
    pub(super) tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
}

/// A TLS connector trusting the web's roots and those in `ca_file`.
fn tls(ca_file: Option<&std::path::Path>) -> anyhow::Result<tokio_postgres_rustls::MakeRustlsConnect> {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        let certs = rustls_pki_types::CertificateDer::pem_file_iter(path)
            .map_err(|e| anyhow::anyhow!("database.ca_file: {}: {e}", path.display()))?;
        for cert in certs {
            let cert = cert.map_err(|e| anyhow::anyhow!("database.ca_file: {}: {e}", path.display()))?;
            roots.add(cert).map_err(|e| anyhow::anyhow!("database.ca_file: {}: {e}", path.display()))?;
        }
    }
    let config =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

impl Target {
    /// Parses `url`; the password comes from `password` (the variable named
    /// by `database.password_env`, or `PGPASSWORD`), never from the file.
    pub fn new(url: &str, schema: &str, password: Option<String>) -> anyhow::Result<Target> {
        Target::with_ca(url, schema, password, None)
    }

    /// As [`Target::new`], trusting the certificates in `ca_file` too.
    pub fn with_ca(
        url: &str,
        schema: &str,
        password: Option<String>,
        ca_file: Option<&std::path::Path>,
    ) -> anyhow::Result<Target> {
        let mut config: postgres::Config =
            url.parse().map_err(|e| anyhow::anyhow!("database.url: {url:?} is not a PostgreSQL URL: {e}"))?;
        let mut async_config: tokio_postgres::Config =
            url.parse().map_err(|e| anyhow::anyhow!("database.url: {url:?} is not a PostgreSQL URL: {e}"))?;
        if let Some(p) = password {
            config.password(p.clone());
            async_config.password(p);
        }
        async_config.application_name("apollo-agent");
        async_config.connect_timeout(std::time::Duration::from_secs(5));
        config.application_name("apollo-agent");
        config.connect_timeout(std::time::Duration::from_secs(5));
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .map(|h| match h {
                postgres::config::Host::Tcp(h) => h.clone(),
                postgres::config::Host::Unix(p) => p.display().to_string(),
            })
            .collect();
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let shown = format!(
            "postgres://{}@{}:{port}/{} (schema {schema})",
            config.get_user().unwrap_or(""),
            hosts.join(","),
            config.get_dbname().unwrap_or("")
        );
        let tls = match config.get_ssl_mode() {
            postgres::config::SslMode::Require => Some(tls(ca_file)?),
            _ => None,
        };
        Ok(Target { config, async_config, schema: schema.to_string(), shown, tls })
    }

    /// A new connection with the schema on its search path. It is driven
    /// by a runtime of its own on the thread that uses it, as the blocking
    /// client is; unlike it, a statement and the simple SQL deferred before
    /// it (BEGIN, a savepoint) go out together, in one round trip.
    pub fn connect(&self) -> Result<PgConn> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Unwritable(format!("cannot start a PostgreSQL connection: {e}")))?;
        let client = rt.block_on(async {
            let client = match &self.tls {
                Some(tls) => {
                    let (client, connection) = self.async_config.connect(tls.clone()).await?;
                    tokio::spawn(connection);
                    client
                }
                None => {
                    let (client, connection) = self.async_config.connect(tokio_postgres::NoTls).await?;
                    tokio::spawn(connection);
                    client
                }
            };
            client.batch_execute(&format!("SET search_path TO {}", quote_ident(&self.schema))).await?;
            Ok::<_, tokio_postgres::Error>(client)
        })?;
        Ok(PgConn {
            rt,
            client,
            stmts: RefCell::new(HashMap::new()),
            changed: Cell::new(0),
            deferred: RefCell::new(String::new()),
            target: self.clone(),
        })
    }
}

/// `name` as a quoted SQL identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// One connection, with the statements it has prepared.
pub struct PgConn {
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
    stmts: RefCell<HashMap<String, tokio_postgres::Statement>>,
    /// Rows changed by statements on this connection (as SQLite's
    /// `total_changes`, to tell a commit that changed something).
    changed: Cell<u64>,
    /// Simple SQL (BEGIN, a savepoint) sent with the next statement: one
    /// round trip, not two.
    deferred: RefCell<String>,
    target: Target,
}

impl PgConn {
    fn statement(&self, sql: &str) -> Result<tokio_postgres::Statement> {
        if let Some(s) = self.stmts.borrow().get(sql) {
            return Ok(s.clone());
        }
        self.flush()?;
        let prepared = self.rt.block_on(self.client.prepare(&to_postgres(sql))).map_err(|e| with_sql(e, sql))?;
        self.stmts.borrow_mut().insert(sql.to_string(), prepared.clone());
        Ok(prepared)
    }

    /// Sends what was deferred, alone.
    fn flush(&self) -> Result<()> {
        let deferred = std::mem::take(&mut *self.deferred.borrow_mut());
        if !deferred.is_empty() {
            self.rt.block_on(self.client.batch_execute(&deferred))?;
        }
        Ok(())
    }

    /// Runs `st` with the deferred SQL sent just before it, in the same
    /// round trip (the client pipelines requests made together).
    fn run<T>(
        &self,
        sql: &str,
        params: &[V],
        call: impl for<'a> FnOnce(
            &'a tokio_postgres::Client,
            &'a tokio_postgres::Statement,
            &'a [&'a (dyn ToSql + Sync)],
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>> + 'a>,
        >,
    ) -> Result<T> {
        let st = self.statement(sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
        let deferred = std::mem::take(&mut *self.deferred.borrow_mut());
        let client = &self.client;
        self.rt.block_on(async {
            if deferred.is_empty() {
                return call(client, &st, &refs).await.map_err(|e| with_sql(e, sql));
            }
            let (before, result) = tokio::join!(client.batch_execute(&deferred), call(client, &st, &refs));
            before?;
            result.map_err(|e| with_sql(e, sql))
        })
    }
}

/// A result row as the store reads it.
fn to_row(r: &tokio_postgres::Row) -> Result<Row> {
    (0..r.len()).map(|i| r.try_get::<_, V>(i).map_err(StoreError::Postgres)).collect::<Result<_>>().map(Row)
}

/// A database error with the statement that caused it, for the log.
fn with_sql(e: tokio_postgres::Error, sql: &str) -> StoreError {
    if e.as_db_error().is_some() {
        tracing::debug!(error = %e, sql, "statement refused");
    }
    StoreError::Postgres(e)
}

impl Db for PgConn {
    fn execute(&self, sql: &str, params: &[V]) -> Result<u64> {
        let n = self.run(sql, params, |c, st, refs| Box::pin(c.execute(st, refs)))?;
        self.changed.set(self.changed.get() + n);
        Ok(n)
    }

    fn query(&self, sql: &str, params: &[V]) -> Result<Vec<Row>> {
        let rows = self.run(sql, params, |c, st, refs| Box::pin(c.query(st, refs)))?;
        rows.iter().map(to_row).collect()
    }

    fn query_batch(&self, statements: &[(&str, Vec<V>)]) -> Result<Vec<Vec<Row>>> {
        if statements.len() < 2 {
            return statements.iter().map(|(sql, p)| self.query(sql, p)).collect();
        }
        let prepared: Vec<tokio_postgres::Statement> =
            statements.iter().map(|(sql, _)| self.statement(sql)).collect::<Result<_>>()?;
        let refs: Vec<Vec<&(dyn ToSql + Sync)>> =
            statements.iter().map(|(_, p)| p.iter().map(|v| v as &(dyn ToSql + Sync)).collect()).collect();
        let deferred = std::mem::take(&mut *self.deferred.borrow_mut());
        let client = &self.client;
        // Futures polled together are pipelined by the client.
        let results = self.rt.block_on(async {
            let all = futures::future::join_all(prepared.iter().zip(&refs).map(|(st, r)| client.query(st, r)));
            if deferred.is_empty() {
                return Ok(all.await);
            }
            let (before, all) = tokio::join!(client.batch_execute(&deferred), all);
            before.map(|()| all)
        })?;
        results
            .into_iter()
            .zip(statements)
            .map(|(rows, (sql, _))| rows.map_err(|e| with_sql(e, sql))?.iter().map(to_row).collect())
            .collect()
    }

    fn driver(&self) -> &'static dyn Driver {
        &DRIVER
    }

    fn execute_later(&self, sql: &str) -> Result<()> {
        let mut deferred = self.deferred.borrow_mut();
        if !deferred.is_empty() {
            deferred.push_str("; ");
        }
        deferred.push_str(sql);
        Ok(())
    }

    fn alive(&self) -> bool {
        !self.client.is_closed()
            && self
                .rt
                .block_on(async {
                    tokio::time::timeout(std::time::Duration::from_secs(2), self.client.simple_query("")).await
                })
                .is_ok_and(|r| r.is_ok())
    }
}

impl Conn for PgConn {
    fn db(&self) -> &dyn Db {
        self
    }

    fn begin(&mut self) -> Result<()> {
        self.defer("BEGIN")
    }

    fn defer(&mut self, sql: &str) -> Result<()> {
        self.execute_later(sql)
    }

    fn batch(&mut self, sql: &str) -> Result<()> {
        self.defer(sql)?;
        self.flush()
    }

    fn in_transaction(&self) -> bool {
        !self.client.is_closed()
    }

    fn changes(&self) -> u64 {
        self.changed.get()
    }

    fn reopen(&mut self) -> Result<()> {
        if self.client.is_closed() {
            let fresh = self.target.connect()?;
            *self = fresh;
            tracing::info!(store = %self.target.shown, "reconnected to PostgreSQL");
        }
        Ok(())
    }
}

/// Whether an error means PostgreSQL cannot be reached (as opposed to a
/// refused or malformed statement), and why.
pub fn storage_failure(e: &StoreError) -> Option<String> {
    match e {
        StoreError::Postgres(e) if e.as_db_error().is_none() || e.is_closed() => Some(e.to_string()),
        StoreError::Postgres(e) => {
            let code = e.code().map(|c| c.code()).unwrap_or_default();
            // Class 08: connection exceptions; 53: insufficient resources;
            // 57P: the server is shutting down or restarting.
            (code.starts_with("08") || code.starts_with("53") || code.starts_with("57P")).then(|| e.to_string())
        }
        StoreError::Commit(m) => Some(m.clone()),
        _ => None,
    }
}
