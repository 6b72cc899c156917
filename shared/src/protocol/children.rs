//! Sub-runbooks: a step `task: NAME` makes a child instance, and the
//! child's dedup key says whose it is, so the link survives the archive and
//! needs no column of its own.

/// The dedup key of step `seq`'s child of instance `parent` (a
/// sub-runbook's child instance is the one that has it).
pub fn child_key(parent: &str, seq: u32) -> String {
    format!("child:{parent}:{seq}")
}

/// The parent instance and step of a child, from its dedup key.
pub fn parent_of(dedup_key: Option<&str>) -> Option<(String, u32)> {
    let rest = dedup_key?.strip_prefix("child:")?;
    let (id, seq) = rest.rsplit_once(':')?;
    Some((id.to_string(), seq.parse().ok()?))
}
