//! The definition catalog: every `*.yaml` / `*.yml` file directly under the
//! tasks directory, parsed, validated against the plugin registry, and keyed
//! by task name. A file that fails keeps its errors here (shown by
//! `defs.list` and `apollo-agent check`); it never stops the others loading.

mod children;

use crate::plugins::Registry;
use apollo_shared::def::{self, DefError, TaskDef};
use apollo_shared::template;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One definition version in force.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub def: Arc<TaskDef>,
    /// sha256 of the file's text: the version instances are pinned to.
    pub hash: String,
    pub file: PathBuf,
    pub source: Arc<str>,
}

#[derive(Debug, Default, Clone)]
pub struct Catalog {
    pub defs: BTreeMap<String, Loaded>,
    /// Files that did not load, with every error found in each.
    pub errors: BTreeMap<PathBuf, Vec<DefError>>,
    /// Tasks whose file was deleted since the agent started, with that file.
    pub removed: BTreeMap<String, PathBuf>,
}

impl Catalog {
    /// The catalog after a reload: `fresh` as loaded from the directory,
    /// except that a file that now fails keeps its previous version in force
    /// (its errors are reported beside it), and tasks whose file is gone are
    /// remembered as removed.
    pub fn merge(old: &Catalog, mut fresh: Catalog) -> Catalog {
        for (file, _) in fresh.errors.iter() {
            if let Some(prev) = old.defs.values().find(|l| &l.file == file) {
                fresh.defs.entry(prev.def.task.clone()).or_insert_with(|| prev.clone());
            }
        }
        fresh.removed = old.removed.clone();
        for (task, l) in &old.defs {
            if !fresh.defs.contains_key(task) && !l.file.exists() {
                fresh.removed.insert(task.clone(), l.file.clone());
            }
        }
        fresh.removed.retain(|task, _| !fresh.defs.contains_key(task));
        fresh
    }
}

pub fn hash(source: &str) -> String {
    hex::encode(Sha256::digest(source.as_bytes()))
}

/// Checks what needs the registry: each step's plugin and version pin.
pub fn check_plugins(d: &TaskDef, file: &str, registry: &Registry) -> Vec<DefError> {
    d.steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            registry.resolve(&s.plugin, s.version.as_deref()).err().map(|message| DefError {
                file: file.into(),
                line: s.line,
                field: format!("steps[{i}].plugin"),
                message,
            })
        })
        .collect()
}

/// A template's `steps.X.F` must be an output X's plugin gives, where the
/// plugin says what it gives (a shell step's `result` is its command's own:
/// what is under it is not checked).
pub fn check_outputs(d: &TaskDef, file: &str, registry: &Registry) -> Vec<DefError> {
    let mut out = Vec::new();
    for (i, field, step, output) in def::step_refs(&d.steps) {
        let Some(x) = d.steps.iter().find(|s| s.name == step) else { continue };
        let Ok(reg) = registry.resolve(&x.plugin, x.version.as_deref()) else { continue };
        // A fan-out step's output is its items' (see `scheduler::executor::fanout`).
        let outputs = match (&x.foreach, reg.plugin.outputs()) {
            (Some(_), _) => ["items", "failed", "ok", "total"].map(String::from).to_vec(),
            (None, Some(o)) => o,
            (None, None) => continue,
        };
        if outputs.contains(&output) {
            continue;
        }
        let known: Vec<&str> = outputs.iter().map(String::as_str).collect();
        let near =
            apollo_shared::text::closest(&output, &known).map(|k| format!("; did you mean {k:?}?")).unwrap_or_default();
        out.push(DefError {
            file: file.into(),
            line: d.steps[i].line,
            field: format!("steps[{i}].{field}"),
            message: format!(
                "steps.{step}.{output}: step {step:?} ({} plugin) gives no output {output:?} (its outputs: {}{near})",
                x.plugin,
                known.join(", ")
            ),
        });
    }
    out
}

/// Whether a step's params hold a template (checked only once rendered).
fn has_template(params: &serde_json::Map<String, Value>) -> bool {
    template::strings(&Value::Object(params.clone()), "").iter().any(|(_, t)| t.contains("{{") || t.contains("{%"))
}

/// The params a step gives that its plugin does not take, whatever their
/// values (a template too): every built-in declares its params, and an
/// external plugin that lists `params` in its describe is held to them.
/// Then the built-ins' own checks of parameters that are not templates: the
/// agent refuses at load what a run would refuse half-way. (External
/// plugins' values are asked by `check_static_params`, which runs them.)
pub fn check_builtin_params(d: &TaskDef, file: &str, registry: &Registry) -> Vec<DefError> {
    let mut out = Vec::new();
    for (i, s) in d.steps.iter().enumerate() {
        let Ok(reg) = registry.resolve(&s.plugin, s.version.as_deref()) else { continue };
        let error =
            |message| DefError { file: file.into(), line: s.line, field: format!("steps[{i}].params"), message };
        if let Some(gate) = s.foreach.as_ref().and_then(|f| f.gate.as_ref()) {
            if let Err(message) = crate::plugins::approval::check_gate(&gate.params) {
                let field = format!("steps[{i}].approve_after_batch");
                out.push(DefError { file: file.into(), line: s.line, field, message });
            }
        }
        if let Some(message) = unknown_param(&reg.plugin.describe(), &s.plugin, &s.params) {
            out.push(error(message));
            continue;
        }
        // An approval's approvers are checked whatever its message renders to.
        if reg.command.is_none() && reg.plugin.name() == "approval" && has_template(&s.params) {
            if let Err(message) = crate::plugins::approval::check_templated(&s.params) {
                out.push(error(message));
                continue;
            }
        }
        if reg.command.is_some() || has_template(&s.params) {
            continue;
        }
        if let Err(message) = reg.plugin.check_params(&s.params) {
            out.push(error(message));
        }
    }
    out
}

/// The first param of `params` that `describe` does not list, said with the
/// closest name it does (`None` when the plugin lists no params).
fn unknown_param(describe: &Value, plugin: &str, params: &serde_json::Map<String, Value>) -> Option<String> {
    let declared = describe.get("params")?.as_array()?;
    let known: Vec<&str> = declared.iter().filter_map(|p| p["name"].as_str()).collect();
    let unknown = params.keys().find(|k| !known.contains(&k.as_str()))?;
    // A typo is the closest name; a wrong suffix (`expect_code` for
    // `expect_status`) is the one sharing the longest start.
    let same_start = |k: &&str| k.chars().zip(unknown.chars()).take_while(|(a, b)| a == b).count();
    let by_start = known.iter().filter(|k| same_start(k) >= 4).max_by_key(|k| same_start(k)).copied();
    let hint = match apollo_shared::text::closest(unknown, &known).or(by_start) {
        Some(close) => format!("did you mean {close:?}? "),
        None => String::new(),
    };
    let expected = if known.is_empty() { "none".to_string() } else { known.join(", ") };
    Some(format!("unknown parameter {unknown:?} of the {plugin} plugin ({hint}expected one of: {expected})"))
}

/// Runs each plugin's validate on the parameters that are not templates, so
/// `apollo-agent check` finds bad values before a run does.
pub async fn check_static_params(d: &TaskDef, file: &str, registry: &Registry) -> Vec<DefError> {
    let mut out = Vec::new();
    for (i, s) in d.steps.iter().enumerate() {
        let Ok(reg) = registry.resolve(&s.plugin, s.version.as_deref()) else { continue };
        if has_template(&s.params) {
            continue;
        }
        if let Err(e) = reg.plugin.validate(&s.params).await {
            let message = e.message;
            out.push(DefError { file: file.into(), line: s.line, field: format!("steps[{i}].params"), message });
        }
    }
    out
}

/// A step's unknown field that is a param of its plugin (`command:` beside
/// `plugin: shell`) is said to be one, to be indented under `params:`.
fn params_at_step_level(source: &str, registry: &Registry, mut errors: Vec<DefError>) -> Vec<DefError> {
    let Ok(doc) = apollo_shared::yaml::from_str::<Value>(source) else { return errors };
    for e in &mut errors {
        let Some(rest) = e.field.strip_prefix("steps[") else { continue };
        let Some((index, key)) = rest.split_once("].") else { continue };
        if !e.message.starts_with("unknown field") || key.contains('.') {
            continue;
        }
        let step = &doc["steps"][index.parse::<usize>().unwrap_or(usize::MAX)];
        let Some(plugin) = step["plugin"].as_str() else { continue };
        let Ok(reg) = registry.resolve(plugin, step["version"].as_str()) else { continue };
        let describe = reg.plugin.describe();
        let takes = describe["params"].as_array().into_iter().flatten().any(|p| p["name"] == key);
        if takes {
            e.message = format!("{key:?} is a param of the {plugin} plugin: indent it under params:");
        }
    }
    errors
}

/// Parses one file's text into a definition, or every error in it.
pub fn load_source(source: &str, file: &Path, registry: &Registry) -> Result<Loaded, Vec<DefError>> {
    let name = file.display().to_string();
    let d = def::parse(source, &name).map_err(|e| params_at_step_level(source, registry, e.0))?;
    let mut errors = check_plugins(&d, &name, registry);
    errors.extend(check_builtin_params(&d, &name, registry));
    errors.extend(check_outputs(&d, &name, registry));
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Loaded { def: Arc::new(d), hash: hash(source), file: file.to_path_buf(), source: source.into() })
}

/// The file's text; one over the size limit is refused with the line where
/// the limit is crossed (only that much of it is read).
fn read_capped(path: &Path) -> Result<String, (Option<usize>, String)> {
    use std::io::Read;
    let max = apollo_shared::yaml::MAX_YAML_BYTES;
    let meta = std::fs::metadata(path).map_err(|e| (None, e.to_string()))?;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| (None, e.to_string()))?;
    if bytes.len() > max {
        let line = bytes[..max].iter().filter(|b| **b == b'\n').count() + 1;
        return Err((
            Some(line),
            format!("file is {} bytes, larger than the {max} byte limit for a definition", meta.len()),
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        let good = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        (Some(good.iter().filter(|b| **b == b'\n').count() + 1), "file is not UTF-8 text".to_string())
    })
}

/// The definition files (`*.yaml`, `*.yml`) directly under `dir`, sorted.
pub fn files_in(dir: &Path) -> Result<Vec<PathBuf>, DefError> {
    let entries = std::fs::read_dir(dir).map_err(|e| DefError {
        file: dir.display().to_string(),
        line: None,
        field: String::new(),
        message: format!("cannot read the tasks directory: {e}"),
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && matches!(p.extension().and_then(|x| x.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    Ok(files)
}

/// Loads every definition file directly under `dir`.
pub fn load_dir(dir: &Path, registry: &Registry) -> Catalog {
    match files_in(dir) {
        Ok(files) => load_files(Catalog::default(), files, registry),
        Err(e) => {
            let mut cat = Catalog::default();
            cat.errors.insert(dir.to_path_buf(), vec![e]);
            cat
        }
    }
}

/// Loads these definition files into `cat` (a task defined twice is an
/// error of the second file).
pub fn load_files(mut cat: Catalog, files: Vec<PathBuf>, registry: &Registry) -> Catalog {
    for file in files {
        let name = file.display().to_string();
        let err = |(line, message): (Option<usize>, String)| {
            vec![DefError { file: name.clone(), line, field: String::new(), message }]
        };
        let loaded = read_capped(&file).map_err(err).and_then(|src| load_source(&src, &file, registry));
        match loaded {
            Ok(l) => match cat.defs.get(&l.def.task) {
                Some(first) => {
                    let message = format!(
                        "task {:?} is already defined in {} (task names must be unique)",
                        l.def.task,
                        first.file.display()
                    );
                    cat.errors.insert(
                        file.clone(),
                        vec![DefError { file: name, line: Some(1), field: "task".into(), message }],
                    );
                }
                None => {
                    cat.defs.insert(l.def.task.clone(), l);
                }
            },
            Err(errors) => {
                cat.errors.insert(file, errors);
            }
        }
    }
    check_children(cat)
}

/// Refuses the definitions whose `task:` steps name an unknown task, pass
/// params the child does not declare, or close a cycle ([`children`]).
fn check_children(mut cat: Catalog) -> Catalog {
    if !cat.defs.values().any(|l| l.def.steps.iter().any(|s| s.task.is_some())) {
        return cat;
    }
    let defs: std::collections::BTreeMap<String, (&TaskDef, String)> =
        cat.defs.iter().map(|(k, l)| (k.clone(), (&*l.def, l.file.display().to_string()))).collect();
    let bad = children::problems(&defs);
    for (task, errors) in bad {
        if let Some(l) = cat.defs.remove(&task) {
            cat.errors.insert(l.file.clone(), errors);
        }
    }
    cat
}

/// The queues and tasks the config's freeze windows name that neither the
/// config (`scheduler.queues`) nor a definition of `cat` knows: such a
/// window would freeze nothing. Refused by `apollo-agent check` (and by a
/// reload of the config), each with its line and the closest known name.
pub fn freeze_targets(config: &crate::config::Config, cat: &Catalog) -> Vec<String> {
    let mut queues: Vec<&str> = config.scheduler.queues.keys().map(String::as_str).collect();
    queues.extend(cat.defs.values().map(|l| l.def.queue.as_str()));
    queues.sort_unstable();
    queues.dedup();
    let tasks: Vec<&str> = cat.defs.keys().map(String::as_str).collect();
    let file = config.source.as_ref().map_or_else(|| "config".to_string(), |p| p.display().to_string());
    crate::config::unknown_targets(&config.scheduler.freezes, &file, &queues, &tasks)
}
