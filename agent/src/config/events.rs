//! The `events` section (where events come from besides the socket) and the
//! `storage` section (object stores the downloader reads).

use super::duration::{duration, secs};
use serde::Deserialize;
use std::time::Duration;

/// Event sources besides `apollo emit`: message-queue consumers and an HTTP
/// listener for webhooks.
#[derive(Debug, Clone, Deserialize, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EventsConf {
    #[serde(default)]
    pub sources: Vec<SourceConf>,
    #[serde(default)]
    pub http: Option<HttpEventsConf>,
}

/// One message-queue consumer. `kind: nats` is the one kind so far: a
/// durable pull consumer on a JetStream stream.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SourceConf {
    pub kind: String,
    /// How alerts and logs name it (default: `<kind> <stream>`).
    #[serde(default)]
    pub name: Option<String>,
    /// `nats://host:port` (several, comma-separated, for a cluster).
    pub url: String,
    pub stream: String,
    /// Only messages on these subjects (a filter such as `ops.>`); default:
    /// all of the stream's.
    #[serde(default)]
    pub subject: Option<String>,
    /// The durable consumer's name: its position survives restarts, and
    /// several agents with the same name share the messages.
    #[serde(default = "default_durable")]
    pub durable: String,
    /// A payload field (dotted path) holding the event name; default: the
    /// message's subject.
    #[serde(default)]
    pub name_field: Option<String>,
    /// Environment variables holding the credentials: a token, or a user
    /// and password. Never the values themselves.
    #[serde(default)]
    pub token_env: Option<String>,
    #[serde(default)]
    pub user_env: Option<String>,
    #[serde(default)]
    pub password_env: Option<String>,
    /// How long the server waits for an ack before redelivering.
    #[serde(default = "secs::<30>", deserialize_with = "duration")]
    pub ack_wait: Duration,
}

fn default_durable() -> String {
    "apollo".into()
}

impl SourceConf {
    pub fn label(&self) -> String {
        self.name.clone().unwrap_or_else(|| format!("{} {}", self.kind, self.stream))
    }
}

/// The webhook listener: JSON events and Alertmanager notifications.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HttpEventsConf {
    /// `host:port`.
    pub listen: std::net::SocketAddr,
    /// The environment variable holding the bearer token requests must
    /// carry. Required unless `listen` is a loopback address.
    #[serde(default)]
    pub token_env: Option<String>,
    /// The largest request body accepted, in bytes.
    #[serde(default = "default_max_body")]
    pub max_body: usize,
}

fn default_max_body() -> usize {
    1024 * 1024
}

/// Object stores the `file_downloader` reads from.
#[derive(Debug, Clone, Deserialize, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StorageConf {
    #[serde(default)]
    pub s3: S3Conf,
}

/// `s3://bucket/key` sources. Credentials come only from the environment
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`) or
/// the instance's role (web identity, container or instance metadata).
#[derive(Debug, Clone, Deserialize, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct S3Conf {
    /// An S3-compatible server (`http://minio:9000`); default: AWS, or
    /// `AWS_ENDPOINT_URL`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Default: `AWS_REGION`, else `us-east-1`.
    #[serde(default)]
    pub region: Option<String>,
    /// `bucket` in the path (`endpoint/bucket/key`) rather than the host
    /// name, as most S3-compatible servers want. Default: path-style for an
    /// endpoint that is an IP address or `localhost` (which have no bucket
    /// subdomains), virtual-hosted otherwise.
    #[serde(default)]
    pub path_style: Option<bool>,
}

impl S3Conf {
    /// Whether requests to `endpoint` put the bucket in the path.
    pub fn path_style_for(&self, endpoint: &str) -> bool {
        self.path_style.unwrap_or_else(|| has_no_subdomains(endpoint))
    }
}

/// An endpoint whose host is an IP address or `localhost`: a bucket cannot
/// be a subdomain of it.
pub fn has_no_subdomains(endpoint: &str) -> bool {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => return v6.split(']').next().is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok()),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok()
}

impl StorageConf {
    pub fn problems(&self, file: &str) -> Vec<String> {
        let mut problems = Vec::new();
        let s3 = &self.s3;
        if let Some(e) = &s3.endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                problems.push(format!("{file}: storage.s3.endpoint: {e:?} is not an http:// or https:// URL (for example http://minio.internal:9000)"));
            }
            if s3.path_style == Some(false) && has_no_subdomains(e) {
                problems.push(format!(
                    "{file}: storage.s3.path_style: false cannot reach a bucket at {e} (an IP address or localhost \
                     has no bucket subdomains); set storage.s3.path_style: true"
                ));
            }
        }
        problems
    }
}

impl EventsConf {
    pub fn problems(&self, file: &str) -> Vec<String> {
        let mut problems = Vec::new();
        let env_name_ok = |v: &Option<String>| v.as_deref().is_none_or(|n| !n.is_empty() && !n.contains('='));
        for (i, s) in self.sources.iter().enumerate() {
            let at = format!("{file}: events.sources[{i}]");
            if s.kind != "nats" {
                problems.push(format!("{at}.kind: {:?} is not a known source kind (expected nats)", s.kind));
            }
            if !s.url.split(',').all(|u| u.trim().starts_with("nats://") || u.trim().starts_with("tls://")) {
                problems.push(format!("{at}.url: {:?} is not a NATS URL (expected nats://host:port)", s.url));
            }
            if s.stream.is_empty() || s.stream.contains(['.', ' ', '*', '>']) {
                problems
                    .push(format!("{at}.stream: {:?} is not a stream name (no dots, spaces or wildcards)", s.stream));
            }
            if s.durable.is_empty() || s.durable.contains(['.', ' ', '*', '>']) {
                problems.push(format!(
                    "{at}.durable: {:?} is not a consumer name (no dots, spaces or wildcards)",
                    s.durable
                ));
            }
            if !env_name_ok(&s.token_env) || !env_name_ok(&s.user_env) || !env_name_ok(&s.password_env) {
                problems.push(format!(
                    "{at}: token_env, user_env and password_env name environment variables (not their values)"
                ));
            }
            if s.user_env.is_some() != s.password_env.is_some() {
                problems.push(format!("{at}: user_env and password_env go together"));
            }
        }
        if let Some(h) = &self.http {
            if !env_name_ok(&h.token_env) {
                problems.push(format!("{file}: events.http.token_env names an environment variable (not its value)"));
            }
            if h.token_env.is_none() && !h.listen.ip().is_loopback() {
                problems.push(format!(
                    "{file}: events.http: listening on {} needs a bearer token (set token_env to the variable holding it), \
                     or listen on 127.0.0.1",
                    h.listen
                ));
            }
            if h.max_body == 0 {
                problems.push(format!("{file}: events.http.max_body: expected a size in bytes above 0"));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn err(src: &str) -> String {
        format!("{:#}", Config::parse(src, "apollo.yaml").unwrap_err())
    }

    #[test]
    fn sources_and_listeners_are_checked_with_what_would_be_valid() {
        let nats = "events:\n  sources:\n    - kind: nats\n      url: nats://127.0.0.1:4222\n      stream: OPS\n";
        let c = Config::parse(nats, "apollo.yaml").unwrap();
        assert_eq!((c.events.sources[0].durable.as_str(), c.events.sources[0].label()), ("apollo", "nats OPS".into()));
        assert!(err(&nats.replace("kind: nats", "kind: kafka")).contains("\"kafka\" is not a known source kind"));
        assert!(err(&nats.replace("nats://", "http://")).contains("expected nats://host:port"));
        assert!(err(&format!("{nats}      user_env: U\n")).contains("user_env and password_env go together"));
        let open = "events:\n  http:\n    listen: 0.0.0.0:9465\n";
        assert!(err(open).contains("needs a bearer token"));
        assert!(Config::parse(&open.replace("0.0.0.0", "127.0.0.1"), "apollo.yaml").is_ok());
        assert!(err("storage:\n  s3:\n    bucket: x\n").contains("unknown field `bucket`"));
        let s3 = "storage:\n  s3:\n    endpoint: http://127.0.0.1:9000\n";
        assert!(err(&format!("{s3}    path_style: false\n")).contains("set storage.s3.path_style: true"));
        assert!(Config::parse(s3, "apollo.yaml").unwrap().storage.s3.path_style_for("http://127.0.0.1:9000"));
        assert!(err("storage:\n  s3:\n    endpoint: minio:9000\n").contains("is not an http:// or https:// URL"));
    }

    #[test]
    fn ip_addresses_and_localhost_have_no_bucket_subdomains() {
        use super::has_no_subdomains as no;
        assert!(no("http://127.0.0.1:9000") && no("http://localhost:9000/") && no("https://[::1]:9000"));
        assert!(no("http://10.0.0.7") && no("http://LOCALHOST"));
        assert!(!no("http://minio.internal:9000") && !no("https://s3.eu-west-1.amazonaws.com"));
    }
}
