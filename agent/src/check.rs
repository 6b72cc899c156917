//! `apollo-agent check`: validates the config and every definition, printing
//! each problem as `file: line N: field: message`.

use crate::catalog;
use crate::config::Config;
use crate::plugins::Registry;

/// Returns the number of problems found, after printing them.
pub fn run(config: &Config, out: &mut impl std::io::Write) -> std::io::Result<usize> {
    let registry = Registry::new(&config.plugins);
    let dir = config.tasks_dir();
    let cat = catalog::load_dir(&dir, &registry);
    let mut problems = 0;
    for errs in cat.errors.values() {
        for e in errs {
            writeln!(out, "{e}")?;
            problems += 1;
        }
    }
    for l in cat.defs.values() {
        for e in catalog::check_static_params(&l.def, &l.file.display().to_string(), &registry) {
            writeln!(out, "{e}")?;
            problems += 1;
        }
    }
    let source =
        config.source.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "defaults (no config file)".into());
    writeln!(
        out,
        "config: {source}; tasks: {} — {} definition(s) valid, {} problem(s)",
        dir.display(),
        cat.defs.len()
            - cat.defs.values().filter(|l| !catalog::check_static_params(&l.def, "", &registry).is_empty()).count(),
        problems
    )?;
    Ok(problems)
}
