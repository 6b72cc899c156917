//! Where things are: the one resolution order the agent, `dial-stdio` and
//! the clients share. Pure: the caller says which paths exist.
//!
//! 1. Flags (`--config`, `--tasks`, `--data-dir`, `--socket`).
//! 2. Variables: `APOLLO_CONFIG`, `APOLLO_SOCKET`.
//! 3. A project directory — the current directory when it holds
//!    `apollo.yaml`, `.apollo/` or `tasks/`: config `./apollo.yaml`, tasks
//!    `./tasks`, data `./.apollo`, socket `./.apollo/agent.sock`.
//! 4. The system installation, when `/etc/apollo/apollo.yaml` exists (or, for
//!    a client, when the system socket does): tasks `/etc/apollo/tasks`, data
//!    `/var/lib/apollo`, socket `/run/apollo/agent.sock`.
//! 5. Otherwise the project defaults, relative to the current directory.

use std::path::{Path, PathBuf};

pub const PROJECT_CONFIG: &str = "apollo.yaml";
pub const PROJECT_TASKS: &str = "tasks";
pub const PROJECT_DATA: &str = ".apollo";
pub const PROJECT_SOCKET: &str = ".apollo/agent.sock";
pub const SYSTEM_CONFIG: &str = "/etc/apollo/apollo.yaml";
pub const SYSTEM_TASKS: &str = "/etc/apollo/tasks";
pub const SYSTEM_DATA: &str = "/var/lib/apollo";
pub const SYSTEM_SOCKET: &str = "/run/apollo/agent.sock";

/// Which installation a process serves when no flag or variable says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Install {
    /// The current directory's project (also the default).
    #[default]
    Project,
    /// The system installation under /etc/apollo, /var/lib/apollo, /run/apollo.
    System,
}

/// Whether the current directory is a project directory.
pub fn is_project(exists: &dyn Fn(&Path) -> bool) -> bool {
    [PROJECT_CONFIG, PROJECT_DATA, PROJECT_TASKS].iter().any(|p| exists(Path::new(p)))
}

/// The config file to read, and the installation it belongs to: the flag,
/// then `APOLLO_CONFIG`, then the project's, then the system's; `None` for
/// built-in defaults.
pub fn config(flag: Option<&Path>, env: Option<&Path>, exists: &dyn Fn(&Path) -> bool) -> (Option<PathBuf>, Install) {
    if let Some(p) = flag.or(env) {
        let install = if p == Path::new(SYSTEM_CONFIG) { Install::System } else { Install::Project };
        return (Some(p.to_path_buf()), install);
    }
    if exists(Path::new(PROJECT_CONFIG)) {
        return (Some(PathBuf::from(PROJECT_CONFIG)), Install::Project);
    }
    if !is_project(exists) && exists(Path::new(SYSTEM_CONFIG)) {
        return (Some(PathBuf::from(SYSTEM_CONFIG)), Install::System);
    }
    (None, Install::Project)
}

/// The sockets a client tries, in order: the flag, else `APOLLO_SOCKET`, else
/// the project's then the system's.
pub fn client_sockets(flag: Option<&Path>, env: Option<&Path>) -> Vec<PathBuf> {
    match flag.or(env) {
        Some(p) => vec![p.to_path_buf()],
        None => vec![PathBuf::from(PROJECT_SOCKET), PathBuf::from(SYSTEM_SOCKET)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn only(present: &'static [&'static str]) -> impl Fn(&Path) -> bool {
        move |p: &Path| present.iter().any(|q| Path::new(q) == p)
    }

    #[test]
    fn flags_then_variables_then_project_then_system() {
        let none = only(&[]);
        let sys = only(&[SYSTEM_CONFIG]);
        let both = only(&[SYSTEM_CONFIG, PROJECT_CONFIG]);
        let proj_dir = only(&[SYSTEM_CONFIG, PROJECT_DATA]);
        assert_eq!(config(Some(Path::new("a.yaml")), Some(Path::new("b.yaml")), &sys).0, Some("a.yaml".into()));
        assert_eq!(config(None, Some(Path::new("b.yaml")), &sys).0, Some("b.yaml".into()));
        assert_eq!(config(None, None, &both), (Some(PROJECT_CONFIG.into()), Install::Project));
        assert_eq!(config(None, None, &sys), (Some(SYSTEM_CONFIG.into()), Install::System));
        // A project directory without a config file uses the defaults, not the system's config.
        assert_eq!(config(None, None, &proj_dir), (None, Install::Project));
        assert_eq!(config(None, None, &none), (None, Install::Project));
        assert_eq!(config(Some(Path::new(SYSTEM_CONFIG)), None, &none).1, Install::System);
    }

    #[test]
    fn clients_try_the_project_socket_then_the_system_one() {
        assert_eq!(client_sockets(None, None), [PathBuf::from(PROJECT_SOCKET), PathBuf::from(SYSTEM_SOCKET)]);
        assert_eq!(client_sockets(None, Some(Path::new("/x.sock"))), [PathBuf::from("/x.sock")]);
        assert_eq!(client_sockets(Some(Path::new("/y.sock")), Some(Path::new("/x.sock"))), [PathBuf::from("/y.sock")]);
    }
}
