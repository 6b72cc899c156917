//! Reads: on a pooled read-only connection, on a blocking thread (or the caller's), and new reader connections.

use super::*;

impl Store {
    /// Runs a query on a read-only connection on a blocking thread.
    pub async fn read<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: Fn(&dyn Db) -> Result<R> + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.read_blocking(f)).await.map_err(|_| StoreError::Closed)?
    }

    /// A read, on an idle reader or a new connection. A read is side-effect
    /// free: one that failed because its pooled connection was dead (a
    /// killed backend, a restarted server) is made once more on a new one,
    /// so the first read after a cut does not fail for an old connection.
    pub fn read_blocking<R, F>(&self, f: F) -> Result<R>
    where
        F: Fn(&dyn Db) -> Result<R>,
    {
        let replica = match &self.inner.backend {
            Backend::Postgres { read: Some(r), .. } if self.replica => Some(r),
            _ => None,
        };
        let pool_of = || if replica.is_some() { &self.inner.replica_readers } else { &self.inner.readers };
        let failures = || self.inner.failures.load(std::sync::atomic::Ordering::SeqCst);
        let pooled = pool_of().lock().expect("reader pool").pop();
        // After a connection failure, an idle reader from before it is
        // checked first (a cut one is replaced rather than failing the read);
        // otherwise it is used as it is, without a round trip.
        let pooled = pooled.filter(|(c, seen)| *seen == failures() || c.alive());
        let (conn, old) = match pooled {
            Some((c, _)) => (c, true),
            None => (self.new_reader(replica.map(|r| &**r))?, false),
        };
        let mut result = f(conn.as_ref());
        let dead =
            |r: &Result<R>| matches!(r, Err(StoreError::Postgres(e)) if e.is_closed() || e.as_db_error().is_none());
        let mut conn = conn;
        if old && dead(&result) {
            self.inner.failures.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            conn = self.new_reader(replica.map(|r| &**r))?;
            result = f(conn.as_ref());
        }
        // A reader whose connection failed is not kept.
        let broken = dead(&result);
        if broken {
            self.inner.failures.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        let mut pool = pool_of().lock().expect("reader pool");
        if pool.len() < self.inner.pool && !broken {
            pool.push((conn, failures()));
        }
        result
    }

    /// A new reader connection. (The loops that read while the store is
    /// out of reach pause between reads themselves: see `repeats` and the
    /// schedule runner; a client's read tries now.)
    pub(super) fn new_reader(&self, replica: Option<&postgres::Target>) -> Result<Reader> {
        Ok(match &self.inner.backend {
            Backend::Sqlite { path } => Box::new(sqlite::open_reader(path)?),
            Backend::Postgres { target, .. } => Box::new(replica.unwrap_or(target).connect()?),
        })
    }
}
