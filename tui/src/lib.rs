//! apollo-tui: the clients of the Apollo-11 agent.
//!
//! Layout:
//! - [`client`]: the async JSON-RPC client (Unix socket or SSH), shared by
//!   the CLI, the console and the end-to-end tests.
//! - [`local`]: `--local`, an agent started for the current directory.
//! - [`cli`]: the `apollo` command line: arguments, human and JSON output.
//! - [`console`]: `apollo-tui`, the terminal console (ratatui).
//! - [`contexts`]: named agents (`contexts.yaml`), read-only and production flags.
//! - [`reach`]: why a socket could not be reached, in words an operator acts on.
//!
//! This crate never imports the agent crate; the two meet only in the
//! protocol types of `apollo-shared`.

// JSON-RPC errors travel as values with a message and optional data; they are
// returned on rare paths, so their size does not matter.
#![allow(clippy::result_large_err)]

pub mod cli;
pub mod client;
pub mod console;
pub mod contexts;
pub mod local;
pub mod reach;
