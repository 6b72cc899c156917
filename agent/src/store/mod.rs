//! The store: the only module that writes SQL, on either backend — SQLite
//! (the embedded default, one agent per file) or PostgreSQL (several agents
//! sharing one schema). The portable SQL is written once; what differs is
//! an operation of the [`Driver`] trait ([`db`]), and each backend's driver
//! owns its SQL for it ([`sqlite`], [`postgres`]). Shared code never names
//! a backend.
//!
//! Each store has one writer. All writes go to one writer thread that owns
//! the write connection; it takes every write waiting in its queue, runs them
//! in one transaction, commits, and only then acknowledges each caller
//! (group commit). One failing write does not fail its batch-mates: a batch
//! with a failure is rolled back and run again, each write in its own
//! savepoint (`writer.rs`). Reads use a small pool of connections on blocking
//! threads and never wait for the writer.
//!
//! Every state write calls the transition table in `apollo_shared::state`
//! first; a refused transition leaves the row as it was, is logged as a
//! warning and raised as an alert.

pub mod affinity;
mod approvals;
mod bookkeeping;
pub mod capable;
mod children;
pub mod db;
mod docs;
mod error;
mod history;
mod items;
mod leases;
pub mod listen;
mod location;
mod locks;
pub mod migrate;
mod model;
mod operator;
mod ops;
mod pauses;
mod pool;
pub mod postgres;
mod read;
mod records;
mod rollouts;
mod rows;
pub mod schema;
pub mod sqlite;
mod timeline;
pub mod value;
mod whole;
mod write;
mod writer;
mod zombies;

pub use apollo_shared::protocol::{child_key, parent_of};
pub use bookkeeping::Kept;
pub use db::{Conn, Db, Driver};
pub use error::{Result, StoreError};
pub use items::{ClaimedItem, FanoutPlan, ItemPlan, Offer, OfferNow, Open};
pub use leases::{PauseEnds, QueuePolicy, Recover};
pub use location::Location;
pub use model::{Claimed, FailurePlan, NewInstance};
pub use ops::{ClaimTerms, Created, Followed, Then};
pub use pool::Store;
pub use read::ListFilter;
pub use records::Heartbeat;
pub use sqlite::backup;
pub use timeline::TimelineRead;
pub use write::Decide;
pub use zombies::{Running, StepDurations};
