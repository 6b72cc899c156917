//! The wire protocol: JSON-RPC 2.0, one JSON object per line, on a Unix
//! stream socket (or an SSH channel bridged by `apollo-agent dial-stdio`).
//!
//! Framing is each side's business: a line may be at most
//! [`MAX_FRAME_BYTES`] long, newline excluded. A longer line is answered with
//! an `invalid request` error and skipped; the connection stays up.
//!
//! The first call is `hello`. After `subscribe` the agent pushes
//! notifications `{"jsonrpc":"2.0","method":"event","params":{"seq":N,"topic":T,"kind":K,"data":{…}}}`;
//! a client that falls behind receives `kind: "resync"` and should re-read
//! the state it shows.
//!
//! Every method is a type ([`methods`]): its name, its params and its
//! result, shared by the agent (which parses a request into one [`Call`])
//! and every client (which sends one with `Client::request`). All times are
//! UTC RFC 3339, all ids strings.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[macro_use]
mod topics;
mod archive;
mod children;
mod events;
mod items;
pub mod methods;
mod rails;
mod rollouts;
mod status;
mod timeline;
mod types;
pub use archive::*;
pub use children::{child_key, parent_of};
pub use events::{AlertKind, Event, EventData, Raised, StepMoved};
pub use items::*;
pub use methods::{is_mutating, Call, Method, METHODS};
pub use rails::*;
pub use rollouts::*;
pub use status::*;
pub use timeline::*;
pub use topics::*;
pub use types::*;

pub const PROTOCOL_VERSION: u32 = 1;
/// The largest frame either side accepts, newline excluded.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;
/// The longest error message an answer carries.
pub const MAX_ERROR_MESSAGE: usize = 1024;
/// The largest number of items one `tasks.list` page may ask for.
pub const MAX_LIST_LIMIT: u32 = 1000;

/// JSON-RPC and application error codes.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    /// The instance, definition, step or plugin named does not exist.
    pub const NOT_FOUND: i64 = -32004;
    /// The state machine refused the change.
    pub const ILLEGAL_TRANSITION: i64 = -32010;
    /// The caller's role may not do this.
    pub const FORBIDDEN: i64 = -32003;
    /// The definition or parameters did not validate.
    pub const VALIDATION_FAILED: i64 = -32020;
    /// The agent is shutting down or overloaded; try again.
    pub const BUSY: i64 = -32030;
    /// The answer would not fit in one frame; ask for less.
    pub const TOO_LARGE: i64 = -32040;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub jsonrpc: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Value>,
    pub method: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

impl Request {
    pub fn new(id: u64, method: &str, params: Value) -> Self {
        Request { jsonrpc: "2.0".into(), id: Some(Value::from(id)), method: method.into(), params: Some(params) }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError { code, message: message.into(), data: None }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.data = Some(serde_json::json!({ "hint": hint.into() }));
        self
    }

    /// The error with its message cut to [`MAX_ERROR_MESSAGE`] characters, so
    /// an answer never echoes an unbounded piece of the request.
    pub fn bounded(mut self) -> Self {
        if self.message.len() > MAX_ERROR_MESSAGE {
            let cut: String = self.message.chars().take(MAX_ERROR_MESSAGE).collect();
            self.message = format!("{cut}… ({} bytes cut)", self.message.len() - cut.len());
        }
        self
    }

    pub fn hint(&self) -> Option<&str> {
        self.data.as_ref()?.get("hint")?.as_str()
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        if let Some(h) = self.hint() {
            write!(f, " (hint: {h})")?;
        }
        Ok(())
    }
}

impl std::error::Error for RpcError {}

/// A response; exactly one of `result` and `error` is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub jsonrpc: String,
    pub id: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RpcError>,
}

impl Response {
    pub fn ok(id: Value, result: Value) -> Self {
        Response { jsonrpc: "2.0".into(), id, result: Some(result), error: None }
    }
    pub fn err(id: Value, error: RpcError) -> Self {
        Response { jsonrpc: "2.0".into(), id, result: None, error: Some(error) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::TaskState;
    use serde_json::json;

    #[test]
    fn request_and_response_round_trip() {
        let r = Request::new(7, "tasks.get", json!({"id": "01J"}));
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, r#"{"jsonrpc":"2.0","id":7,"method":"tasks.get","params":{"id":"01J"}}"#);
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), r);
        let e = Response::err(json!(7), RpcError::new(code::NOT_FOUND, "no instance 01J").with_hint("apollo ls"));
        let text = serde_json::to_string(&e).unwrap();
        let back: Response = serde_json::from_str(&text).unwrap();
        assert_eq!(back.error.unwrap().to_string(), "no instance 01J (hint: apollo ls)");
    }

    #[test]
    fn states_travel_as_screaming_snake_case() {
        let p: ListParams = serde_json::from_value(json!({"state": "ROLLED_BACK"})).unwrap();
        assert_eq!(p.state, Some(TaskState::RolledBack));
        assert!(serde_json::from_value::<ListParams>(json!({"bogus": 1})).is_err());
    }

    #[test]
    fn an_unknown_method_names_the_known_ones() {
        let e = Call::parse("tasks.explode", Value::Null).unwrap_err();
        assert_eq!(e.code, code::METHOD_NOT_FOUND);
        assert!(e.message.contains("unknown method \"tasks.explode\"") && e.message.contains("tasks.list"), "{e}");
        assert!(is_mutating(methods::TasksRetry::NAME) && !is_mutating(methods::TasksGet::NAME));
        assert!(METHODS.contains(&"subscribe") && METHODS.contains(&"agent.status"));
    }

    #[test]
    fn a_call_parses_into_its_typed_params() {
        let call = Call::parse("tasks.get", json!({"id": "01J"})).unwrap();
        assert!(matches!(&call, Call::TasksGet(p) if p.id == "01J"), "{call:?}");
        assert_eq!(call.method(), "tasks.get");
        let e = Call::parse("tasks.get", json!({"ident": "01J"})).unwrap_err();
        assert_eq!(e.code, code::INVALID_PARAMS);
        assert!(e.message.starts_with("tasks.get: ") && e.message.contains("(expected id)"), "{e}");
        // No params at all reads as {}.
        assert!(matches!(Call::parse("agent.status", Value::Null).unwrap(), Call::AgentStatus(_)));
    }

    #[test]
    fn an_unknown_topic_is_refused_naming_the_known_ones() {
        let e = serde_json::from_value::<SubscribeParams>(json!({"topics": ["gossip"]})).unwrap_err();
        assert!(
            e.to_string().contains("unknown topic \"gossip\" (expected any of: tasks, defs, alerts, queues, agent)"),
            "{e}"
        );
    }
}
