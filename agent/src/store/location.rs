//! Where a store is, from `database:` in the config: the SQLite file, or
//! the PostgreSQL database (and its replica) with the password.

use super::postgres::Target;
use crate::config::{Config, Synchronous};
use std::path::PathBuf;

/// Where an agent's store is, from `database:` in its config.
pub enum Location {
    Sqlite {
        path: PathBuf,
        synchronous_full: bool,
        /// The archive deletes (`scheduler.archive_retention`): the file
        /// gives deleted pages back (incremental vacuum).
        reclaim: bool,
    },
    /// `pool`: reader connections kept open.
    Postgres { target: Box<Target>, read: Option<Box<Target>>, pool: usize },
}

impl Location {
    /// Where the store is: the SQLite file, or the PostgreSQL database with
    /// its password from `database.password_env` (else `PGPASSWORD`).
    pub fn from_conf(config: &Config) -> anyhow::Result<Location> {
        let db = &config.database;
        if !db.is_postgres() {
            return Ok(Location::Sqlite {
                path: config.db_path(),
                synchronous_full: db.synchronous == Synchronous::Full,
                reclaim: config.scheduler.archive_retention.is_some(),
            });
        }
        let password = match &db.password_env {
            Some(var) => Some(std::env::var(var).map_err(|_| {
                anyhow::anyhow!("database.password_env: the variable {var} is not set (it holds the database password)")
            })?),
            None => std::env::var("PGPASSWORD").ok(),
        };
        let url = db.url.as_deref().unwrap_or_default();
        let ca = db.ca_file.as_deref().map(|p| config.rel(p));
        let target = Box::new(Target::with_ca(url, &db.schema, password.clone(), ca.as_deref())?);
        let read = db
            .read_url
            .as_deref()
            .map(|u| Target::with_ca(u, &db.schema, password, ca.as_deref()).map(Box::new))
            .transpose()?;
        Ok(Location::Postgres { target, read, pool: db.pool_size })
    }
}
