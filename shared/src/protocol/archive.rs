//! `archive.export`: the archive's documents, page by page, for `apollo
//! archive export` (JSON lines that `apollo show --file` reads back).

use super::Instance;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportParams {
    /// Archived instances that ended before this.
    pub before: DateTime<Utc>,
    /// The page starts after this id (the last page's `next`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportPage {
    /// Each archived instance as `apollo show` has it: steps, attempts, history.
    pub docs: Vec<Instance>,
    /// Where the next page starts; `None` on the last.
    pub next: Option<String>,
}
