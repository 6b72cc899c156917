//! The end-to-end tests, one binary with a module per area (ripgrep's
//! layout): each module starts the real `apollo-agent` on temp dirs and real
//! sockets through the harness in `src/lib.rs`. One binary links the
//! dependency tree once instead of once per area.

mod affinity;
mod approvals;
mod archive;
mod audit;
mod backup;
mod bad_input;
mod capable;
mod chaos;
mod checks;
mod cli;
mod clock;
mod console;
mod crash;
mod docs;
mod engine;
mod errors;
mod external;
mod failpoints;
mod failures;
mod fanout;
mod faults;
mod fleet;
mod follow;
mod hooks;
mod hostile;
mod instructions;
mod layers;
mod locks;
mod metrics;
mod newuser;
mod package;
mod panics;
mod pauses;
mod policy;
mod postgres;
mod reaper;
mod reload;
mod rollout;
mod s3;
mod screen;
mod scripts;
mod sdk;
mod secrets;
mod sources;
mod ssh;
mod storage;
mod subtasks;
mod systemd;
mod timeline;
mod timeouts;
mod triggers;
mod upgrade;
mod workers;
