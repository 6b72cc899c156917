//! `database:`: where the store is.

use serde::Deserialize;
use std::path::PathBuf;

/// How SQLite makes a commit durable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    /// An acknowledged write survives power loss.
    #[default]
    Full,
    /// An acknowledged write survives a crash of the agent; the last commits
    /// may be lost on power loss. Faster.
    Normal,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Database {
    /// `sqlite:PATH` or a plain path (default `<data_dir>/apollo.db`), or
    /// `postgres://user@host:port/db` for a database several agents share.
    #[serde(default)]
    pub url: Option<String>,
    /// PostgreSQL: the schema this installation's tables live in, so several
    /// installations (and the tests) can share one server.
    #[serde(default = "default_schema")]
    pub schema: String,
    /// PostgreSQL: an optional replica for the console's and the CLI's reads.
    #[serde(default)]
    pub read_url: Option<String>,
    /// PostgreSQL with `sslmode=require`: a PEM file of certificate
    /// authorities to trust besides the web's (a private CA).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Reader connections kept open (the writer has its own).
    #[serde(default = "default_pool")]
    pub pool_size: usize,
    /// `full` (default: an acknowledged write survives power loss) or `normal`
    /// (survives an agent crash, may lose the last commits on power loss).
    #[serde(default)]
    pub synchronous: Synchronous,
    /// The environment variable that holds the database password, when the
    /// database needs one. The password itself is never read from the file.
    #[serde(default)]
    pub password_env: Option<String>,
}

impl Database {
    /// The URL's problems: a scheme other than sqlite: and postgres://
    /// (a `mysql://x` was taken for a file path), and a password in it (a
    /// password comes only from the environment).
    pub(super) fn problems(&self, file: &str) -> Vec<String> {
        let mut out = Vec::new();
        for (field, url) in [("url", &self.url), ("read_url", &self.read_url)] {
            let Some(url) = url else { continue };
            let scheme = url.split_once(':').map(|(s, _)| s).filter(|s| {
                s.len() > 1 && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            });
            match scheme {
                Some("sqlite") if field == "url" => {}
                Some("postgres" | "postgresql") => {
                    if !url.contains("://") {
                        out.push(format!(
                            "{file}: database.{field}: {url:?} is not valid (expected postgres://user@host:port/db)"
                        ));
                    }
                    let userinfo =
                        url.split_once("://").map(|(_, r)| r.split(['/', '?']).next().unwrap_or("")).unwrap_or("");
                    let in_query =
                        url.split_once('?').is_some_and(|(_, q)| q.split('&').any(|kv| kv.starts_with("password=")));
                    if userinfo.rsplit_once('@').is_some_and(|(u, _)| u.contains(':')) || in_query {
                        out.push(format!(
                            "{file}: database.{field}: the URL holds a password, and passwords are never read from the \
                             config file: remove it from the URL and set database.password_env: APOLLO_DB_PASSWORD \
                             (the environment variable that holds it)"
                        ));
                    }
                }
                Some(other) => out.push(format!(
                    "{file}: database.{field}: {url:?} is not valid: {other}: is not a store this agent knows (expected {})",
                    if field == "url" {
                        "sqlite:PATH for the embedded store, or postgres://user@host:port/db (postgresql:// too)"
                    } else {
                        "postgres://user@host:port/db (postgresql:// too)"
                    }
                )),
                None => {}
            }
        }
        out
    }
}

fn default_schema() -> String {
    "apollo".into()
}
fn default_pool() -> usize {
    4
}

impl Default for Database {
    fn default() -> Self {
        serde_json::from_value(serde_json::json!({})).expect("database defaults")
    }
}

impl Database {
    pub fn is_postgres(&self) -> bool {
        self.url.as_deref().is_some_and(|u| u.starts_with("postgres://") || u.starts_with("postgresql://"))
    }
}
