//! A definition's secrets, read when a step starts (never stored): their
//! values for the step's templates (`{{ secrets.NAME }}`) and the masker that
//! replaces them with `***` in whatever the step leaves behind — its params
//! as recorded, its log, its output, its error and an approval's request
//! (and so the context, the history, alerts and hook payloads, which are
//! made of those). The masker masks each value whole, line by line and
//! encoded (see [`Masker`]); what a step cuts is masked before the cut.

use apollo_shared::def::{Masker, SecretSource, TaskDef};
use serde_json::{Map, Value};

/// A definition's secrets, read.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    /// By name, for the templates (`None` when the definition has none).
    pub values: Option<Map<String, Value>>,
    pub masker: Masker,
}

/// Reads one secret's value.
fn read(name: &str, source: &SecretSource) -> Result<String, String> {
    let missing = |why: String| format!("secret {name}: {} {why}", source.describe());
    match source {
        SecretSource::Env(var) => match std::env::var(var) {
            Ok(v) if !v.is_empty() => Ok(v),
            Ok(_) => Err(missing("is empty".into())),
            Err(_) => Err(missing("is not set in the agent's environment".into())),
        },
        SecretSource::File(path) => match std::fs::read_to_string(path) {
            Ok(v) => match v.strip_suffix('\n').unwrap_or(&v).to_string() {
                v if v.is_empty() => Err(missing("is empty".into())),
                v => Ok(v),
            },
            Err(e) => Err(missing(format!("cannot be read: {e}"))),
        },
    }
}

/// Every secret of `def`, read; the first one missing is named.
pub fn resolve(def: &TaskDef) -> Result<Secrets, String> {
    if def.secrets.is_empty() {
        return Ok(Secrets::default());
    }
    let mut values = Map::new();
    for (name, source) in &def.secrets {
        values.insert(name.clone(), Value::String(read(name, source)?));
    }
    let masker = Masker::new(values.values().filter_map(|v| v.as_str().map(str::to_string)));
    Ok(Secrets { values: Some(values), masker })
}

/// Every secret of `def` that cannot be read now, each named (for checks
/// before anything runs).
pub fn missing(def: &TaskDef) -> Vec<String> {
    def.secrets.iter().filter_map(|(name, source)| read(name, source).err()).collect()
}

/// For each secret of `def` in name order, why it cannot be read now
/// (`None`: it can).
pub fn each_missing(def: &TaskDef) -> Vec<Option<String>> {
    def.secrets.iter().map(|(name, source)| read(name, source).err()).collect()
}

/// The masker of whatever values of `def`'s secrets can be read now.
pub fn masker(def: &TaskDef) -> Masker {
    if def.secrets.is_empty() {
        return Masker::default();
    }
    Masker::new(def.secrets.iter().filter_map(|(n, s)| read(n, s).ok()))
}
