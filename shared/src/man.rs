//! Man pages for the three binaries (behind the `man` feature, which the
//! binaries turn on): clap_mangen's page of a command and of each of its
//! subcommands, every page with EXIT STATUS and EXAMPLES sections. Nothing
//! here touches the file system but [`write_all`], given a directory.

use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What a binary says on every page: its exit statuses, and the examples
/// of each (sub)command by its path (`"apollo"`, `"apollo run"`).
pub struct Extra<'a> {
    pub exit_status: &'a [(&'a str, &'a str)],
    pub examples: &'a dyn Fn(&str) -> Vec<(&'a str, &'a str)>,
}

/// Renders the page of `cmd` (already built, named by `path`).
pub fn render(cmd: clap::Command, path: &str, extra: &Extra, w: &mut dyn Write) -> std::io::Result<()> {
    let man = Man::new(cmd.clone());
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(w)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(w)?;
    }
    let mut roff = Roff::default();
    roff.control("SH", ["EXIT STATUS"]);
    for (code, what) in extra.exit_status {
        roff.control("TP", []).text([bold(*code)]).text([roman(*what)]);
    }
    roff.control("SH", ["EXAMPLES"]);
    let examples = (extra.examples)(path);
    let examples = if examples.is_empty() { vec![("Its options and what they do:", "")] } else { examples };
    for (what, command) in examples {
        roff.control("TP", []).text([roman(what)]);
        if !command.is_empty() {
            roff.text([bold(command)]);
        } else {
            roff.text([bold(format!("{path} --help"))]);
        }
    }
    roff.to_writer(w)?;
    if cmd.get_version().is_some() {
        man.render_version_section(w)?;
    }
    Ok(())
}

/// Writes the page of `cmd` and of each of its subcommands, at any depth,
/// into `dir`: `apollo.1`, `apollo-run.1`, …, the names the pages refer to
/// one another by. Returns the files written.
pub fn write_all(cmd: clap::Command, extra: &Extra, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    fn walk(cmd: &clap::Command, path: &str, extra: &Extra, dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        let file = dir.join(format!("{}.1", path.replace(' ', "-")));
        let mut bytes = Vec::new();
        render(cmd.clone(), path, extra, &mut bytes)?;
        std::fs::write(&file, bytes)?;
        out.push(file);
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, &format!("{path} {}", sub.get_name()), extra, dir, out)?;
        }
        Ok(())
    }
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    let name = cmd.get_name().to_string();
    walk(&cmd, &name, extra, dir, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_a_page_names_exists_and_has_both_sections() {
        let cmd = clap::Command::new("tool")
            .about("a tool")
            .subcommand(clap::Command::new("go").about("goes").subcommand(clap::Command::new("far").about("far")));
        let examples = |path: &str| if path == "tool go" { vec![("Go:", "tool go")] } else { Vec::new() };
        let extra = Extra { exit_status: &[("0", "fine"), ("2", "usage")], examples: &examples };
        let dir = std::env::temp_dir().join(format!("apollo-man-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = write_all(cmd, &extra, &dir).unwrap();
        let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["tool.1", "tool-go.1", "tool-go-far.1"]);
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            assert!(text.contains(".SH \"EXIT STATUS\"") && text.contains(".SH EXAMPLES"), "{text}");
            // Each page it refers to was written.
            for word in text.replace("\\-", "-").split_whitespace() {
                if let Some(page) = word.strip_suffix("(1)") {
                    assert!(names.contains(&format!("{page}.1")), "{} refers to {page}(1)", f.display());
                }
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
