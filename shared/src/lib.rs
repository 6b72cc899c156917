//! apollo-shared: the vocabulary the Apollo-11 agent and its clients speak.
//!
//! This crate does no IO: no files, no sockets, no runtime. It is the only
//! crate both `apollo-agent` and `apollo-tui` import, so anything they must
//! agree on lives here.
//!
//! Layout:
//! - [`state`]: task and step states and the one transition table.
//! - [`def`]: task definitions, parsed from text, with file/line/field errors.
//! - [`yaml`]: the single YAML entry point, with size, alias and depth guards.
//! - [`template`]: step parameters rendered over the context.
//! - [`cron`]: cron expression parsing.
//! - [`context`]: the per-instance context and its size limits.
//! - [`protocol`]: JSON-RPC 2.0 types, methods, error codes, frame limit.
//! - [`paths`]: the one resolution order of config, tasks, data and socket.
//! - [`text`]: text shortened to one line for tables, history and alerts.
//! - `man` (feature `man`): the binaries' man pages, with EXIT STATUS and EXAMPLES.

pub mod context;
pub mod cron;
pub mod def;
#[cfg(feature = "man")]
pub mod man;
pub mod paths;
pub mod protocol;
pub mod state;
pub mod template;
pub mod text;
pub mod yaml;

pub use state::{StepState, TaskState};
