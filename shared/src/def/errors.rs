//! A definition's problems, each naming its file, line and field.

use serde::{Deserialize, Serialize};
use std::fmt;

/// One problem in a definition or config file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefError {
    pub file: String,
    pub line: Option<usize>,
    /// Dotted path of the field, e.g. `steps[1].timeout`; empty for the whole document.
    pub field: String,
    pub message: String,
}

impl fmt::Display for DefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ": line {line}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Every problem found in one file (never empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DefErrors(pub Vec<DefError>);

impl fmt::Display for DefErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.0.iter().map(|e| e.to_string()).collect();
        f.write_str(&lines.join("\n"))
    }
}
