//! What went wrong in a command, and which exit code it means.

use crate::client::ClientError;
use serde_json::{json, Value};

/// What went wrong, and which exit code it means.
pub enum Failure {
    Usage(String),
    Unreachable(String),
    Refused(String),
    /// The agent's refusal, as it worded it.
    Agent(apollo_shared::protocol::RpcError),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Rpc(e) => Failure::Agent(e),
            ClientError::Closed => Failure::Unreachable("the connection to the agent closed".into()),
            other => Failure::Unreachable(other.to_string()),
        }
    }
}

impl Failure {
    pub fn exit(&self) -> u8 {
        match self {
            Failure::Usage(_) | Failure::Unreachable(_) => 2,
            Failure::Refused(_) | Failure::Agent(_) => 1,
        }
    }

    pub fn message(&self) -> String {
        match self {
            Failure::Usage(m) | Failure::Unreachable(m) | Failure::Refused(m) => m.clone(),
            Failure::Agent(e) => format!("agent refused: {e}"),
        }
    }

    /// The error as `--json` prints it.
    pub fn to_json(&self, command: &[String]) -> Value {
        let (kind, code, data) = match self {
            Failure::Usage(_) => ("usage", Value::Null, Value::Null),
            Failure::Unreachable(_) => ("unreachable", Value::Null, Value::Null),
            Failure::Refused(_) => ("refused", Value::Null, Value::Null),
            Failure::Agent(e) => ("agent", json!(e.code), e.data.clone().unwrap_or(Value::Null)),
        };
        let message = match self {
            Failure::Agent(e) => e.message.clone(),
            other => other.message(),
        };
        json!({"error": {"kind": kind, "message": message, "exit": self.exit(), "code": code,
                         "data": data, "command": command}})
    }
}
