//! Plugins: the four calls every step goes through, the built-ins, and the
//! registry that maps the names definitions use to registrations.
//!
//! Layout:
//! - `contract`: the `Plugin` trait, `Call`, `PluginError`, panics as failures.
//! - `registry`: names to registrations, the built-ins, loading `plugins/`.
//! - `rollout`: how a rollout shapes the version a step resolves to.
//! - `inforce`: the registry in force, and its views for rollout arms.
//! - `params`: reading and checking step parameters, shared by the built-ins.
//! - `process`: subprocesses in their own process group, killed as a group.
//! - `external`: plugins that are executables speaking JSON (PLUGINS.md).
//! - `worker`: the process pool of external plugins in worker mode.
//! - `shell`, `downloader`, `parser`, `report`, `http`, `sleep`: the built-ins.

pub mod approval;
mod contract;
mod downloader;
pub mod external;
mod http;
mod inforce;
pub mod kit;
mod params;
mod parser;
pub mod process;
mod registry;
mod report;
pub mod rollout;
mod s3;
mod shell;
mod sleep;
mod task;
pub mod template;
pub mod worker;

pub use contract::{panic_message, unwinding, Call, CallContext, ParamDoc, Plugin, PluginError};
pub use inforce::Plugins;
pub use registry::{load, Broken, Registration, Registry};
