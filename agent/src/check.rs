//! `apollo-agent check`: validates the config and every definition, printing
//! each problem as `file: line N: field: message`. (A config that does not
//! load is refused before: `main.rs` prints its every problem and exits 1.)

use crate::catalog;
use crate::config::Config;

/// Returns the number of problems found, after printing them. `paths`
/// are definition files or directories of them to check instead of the
/// tasks directory (which is checked when none is given).
pub async fn run(
    config: &Config,
    paths: &[std::path::PathBuf],
    out: &mut impl std::io::Write,
) -> std::io::Result<usize> {
    let registry = match plugins_home(paths) {
        Some(dir) => crate::plugins::load(&Config { tasks: Some(dir), plugins_path: None, ..config.clone() }).await,
        None => crate::plugins::load(config).await,
    };
    for b in &registry.broken {
        writeln!(out, "{}: plugin {:?}: {}", b.command.display(), b.name, b.error)?;
    }
    let mut problems = registry.broken.len();
    let dir = config.tasks_dir();
    let cat = match paths {
        [] => catalog::load_dir(&dir, &registry),
        paths => {
            let mut cat = catalog::Catalog::default();
            let mut files = Vec::new();
            for p in paths {
                if p.is_dir() {
                    match catalog::files_in(p) {
                        Ok(found) => files.extend(found),
                        Err(e) => {
                            cat.errors.insert(p.clone(), vec![e]);
                        }
                    }
                } else if p.exists() {
                    files.push(p.clone());
                } else {
                    writeln!(out, "{}: no such file or directory", p.display())?;
                    problems += 1;
                }
            }
            files.sort();
            files.dedup();
            // A file's `task:` steps name tasks of its directory: those are
            // loaded beside it, and only the files asked about are reported.
            let mut beside = files.clone();
            for f in &files {
                beside.extend(f.parent().and_then(|d| catalog::files_in(d).ok()).into_iter().flatten());
            }
            beside.sort();
            beside.dedup();
            let mut cat = catalog::load_files(cat, beside, &registry);
            let asked = |p: &std::path::PathBuf| files.contains(p) || paths.contains(p);
            cat.errors.retain(|p, _| asked(p));
            cat.defs.retain(|_, l| asked(&l.file));
            cat
        }
    };
    for errs in cat.errors.values() {
        for e in errs {
            writeln!(out, "{e}")?;
            problems += 1;
        }
    }
    // The queues and tasks freeze windows name are known only with every
    // definition: of the tasks directory, not of files given.
    if paths.is_empty() {
        for p in catalog::freeze_targets(config, &cat) {
            writeln!(out, "{p}")?;
            problems += 1;
        }
    }
    let mut invalid = 0;
    for l in cat.defs.values() {
        let errs = catalog::check_static_params(&l.def, &l.file.display().to_string(), &registry).await;
        invalid += usize::from(!errs.is_empty());
        for e in errs {
            writeln!(out, "{e}")?;
            problems += 1;
        }
    }
    // A secret this environment cannot read: a warning, not a problem (the
    // agent's environment may hold it), but `apollo run` would be refused.
    let mut warnings = 0;
    for l in cat.defs.values() {
        for (name, said) in l.def.secrets.keys().zip(crate::secrets::each_missing(&l.def)) {
            let Some(said) = said else { continue };
            let line = secret_line(&l.source, name).map(|n| format!(" line {n}:")).unwrap_or_default();
            writeln!(
                out,
                "{}:{line} secrets.{name}: warning: {said}: `apollo run {}` is refused until the agent can read it",
                l.file.display(),
                l.def.task
            )?;
            warnings += 1;
        }
    }
    let warned = if warnings > 0 { format!(", {warnings} warning(s)") } else { String::new() };
    let source =
        config.source.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "defaults (no config file)".into());
    let checked = if paths.is_empty() {
        dir.display().to_string()
    } else {
        paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    };
    writeln!(
        out,
        "config: {source}; tasks: {checked} — {} definition(s) valid, {} problem(s){warned}",
        cat.defs.len() - invalid,
        problems
    )?;
    Ok(problems)
}

/// The line of secret `name` under `secrets:` in `source` (1-based).
fn secret_line(source: &str, name: &str) -> Option<usize> {
    let lines: Vec<&str> = source.lines().collect();
    let start = lines.iter().position(|l| l.starts_with("secrets:"))?;
    let key = format!("{name}:");
    lines[start + 1..]
        .iter()
        .take_while(|l| l.is_empty() || l.starts_with([' ', '#']))
        .position(|l| l.trim_start().starts_with(&key))
        .map(|i| start + i + 2)
}

/// The definitions given are checked against the plugins they would run
/// with: those of the directory they are in (a directory given, or a file's
/// own) when it holds `plugins/` and they are all in that one; else the
/// config's tasks directory's.
fn plugins_home(paths: &[std::path::PathBuf]) -> Option<std::path::PathBuf> {
    let home = |p: &std::path::PathBuf| {
        let dir = if p.is_dir() { p.as_path() } else { p.parent()? };
        std::fs::canonicalize(dir).ok()
    };
    let first = home(paths.first()?)?;
    (first.join("plugins").is_dir() && paths.iter().all(|p| home(p).as_ref() == Some(&first))).then_some(first)
}
