//! `apollo-agent check`: validates the config and every definition, printing
//! each problem as `file: line N: field: message`.

use crate::catalog;
use crate::config::Config;

/// Returns the number of problems found, after printing them.
pub async fn run(config: &Config, out: &mut impl std::io::Write) -> std::io::Result<usize> {
    let registry = crate::plugins::load(config).await;
    for b in &registry.broken {
        writeln!(out, "{}: plugin {:?}: {}", b.command.display(), b.name, b.error)?;
    }
    let mut problems = registry.broken.len();
    let dir = config.tasks_dir();
    let cat = catalog::load_dir(&dir, &registry);
    for errs in cat.errors.values() {
        for e in errs {
            writeln!(out, "{e}")?;
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
    let source =
        config.source.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "defaults (no config file)".into());
    writeln!(
        out,
        "config: {source}; tasks: {} — {} definition(s) valid, {} problem(s)",
        dir.display(),
        cat.defs.len() - invalid,
        problems
    )?;
    Ok(problems)
}
