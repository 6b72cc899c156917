//! `apollo-agent plugin new NAME --python`: a plugin on the Python SDK
//! (sdk/python) and its tests, which pass `plugin test` as written.

use std::path::{Path, PathBuf};

const PLUGIN: &str = include_str!("../../../sdk/python/templates/plugin.py.tmpl");
const TEST: &str = include_str!("../../../sdk/python/templates/test_plugin.py.tmpl");

/// What `new` wrote.
pub struct Written {
    pub plugin: PathBuf,
    pub test: PathBuf,
}

/// Writes `<dir>/<name>.py` (executable) and `<dir>/test_<name>.py` (not
/// executable, so a plugins directory does not register it); never
/// overwrites.
pub fn python(name: &str, dir: &Path) -> Result<Written, String> {
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !valid {
        return Err(format!(
            "plugin name {name:?}: lower-case letters, digits, _ and -, starting with a letter (e.g. restart_api); \
             it is registered under its file name"
        ));
    }
    let plugin = dir.join(format!("{name}.py"));
    let test = dir.join(format!("test_{name}.py"));
    for path in [&plugin, &test] {
        if path.exists() {
            return Err(format!("{} exists; plugin new never overwrites a file", path.display()));
        }
    }
    let class: String =
        name.split(['_', '-']).filter(|w| !w.is_empty()).map(|w| w[..1].to_ascii_uppercase() + &w[1..]).collect();
    let fill = |t: &str| {
        t.replace("{{NAME}}", name)
            .replace("{{CLASS}}", &class)
            .replace("{{MODULE}}", &name.replace('-', "_"))
            .replace("{{FILE_NAME}}", &format!("{name}.py"))
            .replace("{{FILE}}", &plugin.display().to_string())
            .replace("{{TEST}}", &test.display().to_string())
    };
    let write = |path: &Path, text: String, mode: u32| -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, text)
            .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    write(&plugin, fill(PLUGIN), 0o755)?;
    write(&test, fill(TEST), 0o644)?;
    Ok(Written { plugin, test })
}
