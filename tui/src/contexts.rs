//! Contexts: named agents an operator looks after, in
//! `$XDG_CONFIG_HOME/apollo/contexts.yaml` (else `~/.config/apollo/`).
//!
//! ```yaml
//! contexts:
//!   - name: prod-eu
//!     ssh: ops@db7.eu            # through SSH (socket: the remote one, optional)
//!     production: true           # destructive actions need the task name and a reason
//!   - name: staging
//!     socket: /srv/staging/.apollo/agent.sock
//!     read_only: true            # nothing that changes state is sent
//! ```

use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Context {
    pub name: String,
    /// A local socket, or with `ssh` the socket on the remote host.
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// `[user@]host[:port]`: reach the agent through SSH.
    #[serde(default)]
    pub ssh: Option<String>,
    /// Refuse every action that changes state, before sending it.
    #[serde(default)]
    pub read_only: bool,
    /// Destructive actions need the task name (or the count) typed and a reason.
    #[serde(default)]
    pub production: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contexts {
    #[serde(default)]
    pub contexts: Vec<Context>,
}

/// The contexts file's path.
pub fn path() -> PathBuf {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from(".config"));
    base.join("apollo/contexts.yaml")
}

impl Contexts {
    /// Reads the file; a missing file is no contexts.
    pub fn load() -> Result<Contexts, String> {
        Self::load_from(&path())
    }

    pub fn load_from(file: &Path) -> Result<Contexts, String> {
        let text = match std::fs::read_to_string(file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Contexts::default()),
            Err(e) => return Err(format!("{}: {e}", file.display())),
        };
        let c: Contexts = apollo_shared::yaml::from_str(&text)
            .map_err(|e| format!("{}: line {}: {}", file.display(), e.line.unwrap_or(1), e.message))?;
        for (i, ctx) in c.contexts.iter().enumerate() {
            if ctx.name.is_empty() {
                return Err(format!("{}: contexts[{i}]: name is empty", file.display()));
            }
            if ctx.socket.is_none() && ctx.ssh.is_none() {
                return Err(format!(
                    "{}: context {:?}: give socket: PATH, or ssh: [user@]host (with an optional remote socket)",
                    file.display(),
                    ctx.name
                ));
            }
            if c.contexts[..i].iter().any(|o| o.name == ctx.name) {
                return Err(format!("{}: context {:?} is defined twice", file.display(), ctx.name));
            }
        }
        Ok(c)
    }

    /// The file's context named `name`.
    pub fn find(name: &str) -> Result<Context, String> {
        Contexts::load()?.get(name).cloned()
    }

    /// The context named `name`, or an error listing the ones there are.
    pub fn get(&self, name: &str) -> Result<&Context, String> {
        self.contexts.iter().find(|c| c.name == name).ok_or_else(|| {
            if self.contexts.is_empty() {
                format!("no context {name:?}: {} defines none (see docs/console.md, \"Contexts\")", path().display())
            } else {
                let known: Vec<&str> = self.contexts.iter().map(|c| c.name.as_str()).collect();
                format!("no context {name:?} in {} (known: {})", path().display(), known.join(", "))
            }
        })
    }
}

impl Context {
    /// Where it points, for headers and lists.
    pub fn describe(&self) -> String {
        match (&self.ssh, &self.socket) {
            (Some(h), _) => format!("ssh {h}"),
            (None, Some(s)) => s.display().to_string(),
            (None, None) => "?".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_load_and_name_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("contexts.yaml");
        assert!(Contexts::load_from(&f).unwrap().contexts.is_empty(), "no file, no contexts");
        std::fs::write(
            &f,
            "contexts:\n  - name: prod\n    ssh: ops@db7\n    production: true\n  - name: dev\n    socket: /tmp/a.sock\n",
        )
        .unwrap();
        let c = Contexts::load_from(&f).unwrap();
        assert!(c.get("prod").unwrap().production);
        assert_eq!(c.get("dev").unwrap().describe(), "/tmp/a.sock");
        assert!(c.get("qa").unwrap_err().contains("known: prod, dev"));
        std::fs::write(&f, "contexts:\n  - name: x\n    production: true\n").unwrap();
        assert!(Contexts::load_from(&f).unwrap_err().contains("give socket: PATH, or ssh:"));
        std::fs::write(&f, "contexts:\n  - name: x\n    sockett: /a\n").unwrap();
        assert!(Contexts::load_from(&f).unwrap_err().contains("line 3"));
    }
}
