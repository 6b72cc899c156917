//! Every problem of a config file at once. A file whose types do not fit is
//! parsed again one top-level section at a time (the other sections' lines
//! blanked, so every line keeps its number): a type error in one section
//! does not hide another's, nor the checks of the sections that parse.

use apollo_shared::yaml::YamlError;
use serde::de::DeserializeOwned;

/// A config file that was read and is not valid: its problems, one a line
/// (`file: line N: field: message`). `apollo-agent check` exits 1 on these,
/// and 2 on a file it cannot read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problems(pub Vec<String>);

impl std::fmt::Display for Problems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join("\n"))
    }
}

impl std::error::Error for Problems {}

/// A YAML error of `file`, with its line.
pub(super) fn said(file: &str, e: &YamlError) -> String {
    match e.line {
        Some(line) => format!("{file}: line {line}: {}", e.message),
        None => format!("{file}: {}", e.message),
    }
}

/// The top-level sections of `lines`, as (first line, end) 0-based: a
/// section starts at a line that starts with a key.
fn sections(lines: &[&str]) -> Vec<(usize, usize)> {
    let starts: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with(|c: char| !c.is_whitespace() && !matches!(c, '#' | '-' | '.' | '%')))
        .map(|(i, _)| i)
        .collect();
    starts.iter().enumerate().map(|(n, &s)| (s, starts.get(n + 1).copied().unwrap_or(lines.len()))).collect()
}

/// Every problem of `src`, whose whole parse as a `T` failed: each
/// section's own type error, then `checks` of the sections that parse
/// (given the `T` they make and their text). `None` when no section alone
/// fails (the file's shape is what is wrong: its first error says it).
pub(super) fn every_section<T: DeserializeOwned>(
    src: &str,
    file: &str,
    checks: impl FnOnce(T, &str) -> Vec<String>,
) -> Option<Vec<String>> {
    let lines: Vec<&str> = src.lines().collect();
    let parts = sections(&lines);
    // What comes before the first section (`---`, comments) is kept in each.
    let head = parts.first().map_or(0, |p| p.0);
    let only = |keep: &dyn Fn(usize) -> bool| -> String {
        let kept: Vec<&str> =
            lines.iter().enumerate().map(|(i, l)| if i < head || keep(i) { *l } else { "" }).collect();
        kept.join("\n")
    };
    let (mut errors, mut good) = (Vec::new(), Vec::new());
    for &(start, end) in &parts {
        match apollo_shared::yaml::from_str::<T>(&only(&|i| (start..end).contains(&i))) {
            Ok(_) => good.push((start, end)),
            // An alias of another section's anchor: that section says what is wrong.
            Err(e) if e.message.contains("unknown anchor") => {}
            Err(e) => errors.push(said(file, &e)),
        }
    }
    if errors.is_empty() {
        return None;
    }
    if !good.is_empty() {
        let rest = only(&|i| good.iter().any(|&(s, e)| (s..e).contains(&i)));
        if let Ok(cfg) = apollo_shared::yaml::from_str::<T>(&rest) {
            errors.extend(checks(cfg, &rest));
        }
    }
    Some(errors)
}
