//! Line numbers of keys, for messages about semantic errors that the YAML
//! parser cannot place.

/// Finds the lines of keys in the source, for messages about semantic errors
/// that serde_yaml cannot place.
pub(super) struct Lines<'a> {
    lines: Vec<&'a str>,
}

impl<'a> Lines<'a> {
    pub(super) fn new(src: &'a str) -> Self {
        Lines { lines: src.lines().collect() }
    }

    /// 1-based line of the first `key:` between lines `from` (0-based) and `to`.
    pub(super) fn key(&self, key: &str, from: usize, to: usize) -> Option<usize> {
        let key = key.rsplit('.').next().unwrap_or(key);
        if key.is_empty() {
            return None;
        }
        let end = to.min(self.lines.len());
        (from.min(end)..end)
            .find(|&i| {
                let t = self.lines[i].trim_start().trim_start_matches("- ").trim_start();
                t.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with(':'))
                    || t.strip_prefix(&format!("\"{key}\"")).is_some_and(|r| r.trim_start().starts_with(':'))
            })
            .map(|i| i + 1)
    }

    /// 1-based lines where the items of the top-level list `key` start.
    pub(super) fn list_items(&self, key: &str) -> Vec<usize> {
        let Some(at) = self.key(key, 0, usize::MAX) else { return Vec::new() };
        let mut out = Vec::new();
        let mut indent = None;
        for (i, line) in self.lines.iter().enumerate().skip(at) {
            let t = line.trim_start();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            let ind = line.len() - t.len();
            if ind == 0 && !t.starts_with('-') {
                break;
            }
            if t.starts_with("- ") || t == "-" {
                match indent {
                    None => {
                        indent = Some(ind);
                        out.push(i + 1);
                    }
                    Some(x) if x == ind => out.push(i + 1),
                    _ => {}
                }
            }
        }
        out
    }
}
