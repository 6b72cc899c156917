//! What a store call can fail with.

use apollo_shared::state::IllegalTransition;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("database error: {}", describe(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("{0}")]
    Illegal(#[from] IllegalTransition),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("commit failed: {0}")]
    Commit(String),
    /// The database cannot be written (disk full, read-only, I/O error, or
    /// PostgreSQL out of reach).
    #[error("{0}")]
    Unwritable(String),
    #[error("the store is closed")]
    Closed,
}

pub type Result<T> = std::result::Result<T, StoreError>;

impl StoreError {
    /// As a protocol error a client can act on.
    pub fn into_rpc(self) -> apollo_shared::protocol::RpcError {
        use apollo_shared::protocol::{code, RpcError};
        match self {
            StoreError::NotFound(m) => RpcError::new(code::NOT_FOUND, m).with_hint("list instances with `apollo ls`"),
            StoreError::Illegal(t) => RpcError::new(code::ILLEGAL_TRANSITION, t.to_string()),
            StoreError::Invalid(m) => RpcError::new(code::ILLEGAL_TRANSITION, m),
            StoreError::Unwritable(m) => RpcError::new(code::BUSY, m),
            other => RpcError::new(code::INTERNAL, other.to_string()),
        }
    }
}

/// An error as PostgreSQL worded it (`db error` alone says nothing).
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => {
            let detail = d.detail().map(|x| format!(" ({x})")).unwrap_or_default();
            format!("{}{detail} [{}]", d.message(), d.code().code())
        }
        None => {
            // The cause (a TLS or socket error) is in the chain.
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                text.push_str(&format!(": {c}"));
                cause = c.source();
            }
            text
        }
    }
}
