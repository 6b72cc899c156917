//! The `apollo-agent` binary: parses arguments, sets up tracing and signals,
//! and calls `apollo_agent::run`.

use anyhow::Context as _;
use apollo_agent::config::{self, Config};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "apollo-agent",
    version,
    about = "Apollo-11 agent: runs task definitions as recoverable chains of steps"
)]
struct Args {
    /// Config file (default: $APOLLO_CONFIG, else ./apollo.yaml, else /etc/apollo/apollo.yaml outside a project directory, else built-in defaults).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Definitions directory (default: ./tasks; /etc/apollo/tasks for the system config).
    #[arg(long, global = true)]
    tasks: Option<PathBuf>,
    /// Data directory: database, logs, work dirs (default: ./.apollo; /var/lib/apollo for the system config).
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// Socket path (default: $APOLLO_SOCKET, else <data dir>/agent.sock; /run/apollo/agent.sock for the system config).
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    /// This agent's name in leases, history, alerts and the console (default: agent.name, else the host name).
    #[arg(long, global = true)]
    name: Option<String>,
    /// Log format on stderr.
    #[arg(long, global = true, value_parser = ["pretty", "json"])]
    log_format: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent in the foreground (the default).
    Run,
    /// Validate the config and every definition (of the tasks directory, or
    /// of the files and directories given); exit 1 when anything is wrong.
    Check {
        /// Definition files, or directories of them (default: the tasks directory). They are
        /// checked against the plugins of the directory they are in when it has a plugins/.
        paths: Vec<PathBuf>,
    },
    /// Bridge stdin/stdout to the agent's socket (used through SSH).
    DialStdio,
    /// Print this command's man page (roff), or with --dir write every page (apollo-agent.1,
    /// apollo-agent-check.1, …) there.
    Man {
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Print a shell completion script: `apollo-agent completions bash > /etc/bash_completion.d/apollo-agent`.
    Completions { shell: clap_complete::Shell },
    /// Write a consistent copy of the store to FILE, while the agent runs or
    /// not. To restore: stop the agent, put the copy at <data dir>/apollo.db
    /// (removing apollo.db-wal and apollo.db-shm), start it.
    Backup {
        /// Where to write the copy (written to FILE.partial, then renamed).
        file: PathBuf,
    },
    /// Promote this installation from SQLite to PostgreSQL: copy its store
    /// (stopped) into an empty schema in one transaction, verify every
    /// table's row count and checksum, and print a report.
    Migrate {
        /// The PostgreSQL database: postgres://user@host:port/db (the
        /// password from database.password_env or PGPASSWORD).
        #[arg(long)]
        to: String,
        /// The schema to fill (default: database.schema, else apollo).
        #[arg(long)]
        schema: Option<String>,
    },
    /// Tools for plugin authors.
    #[command(subcommand)]
    Plugin(PluginCmd),
}

#[derive(Subcommand)]
enum PluginCmd {
    /// Check an external plugin before registering it: describe, validate,
    /// execute twice with one idempotency key, rollback.
    Test {
        /// The plugin executable.
        exe: PathBuf,
        /// Params to use (JSON object; default: the `example_params` its describe declares).
        #[arg(long)]
        params: Option<String>,
    },
    /// Write a new plugin on the Python SDK (sdk/python) and its tests:
    /// `<dir>/NAME.py` and `<dir>/test_NAME.py`.
    New {
        /// The plugin's name (its file name: lower-case letters, digits, _ and -).
        #[arg(id = "plugin", value_name = "NAME")]
        name: String,
        /// Python, on the SDK (the only language `new` writes).
        #[arg(long, required = true)]
        python: bool,
        /// Where to write (default: the tasks directory's plugins/, where the agent registers it).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// The agent's exit statuses, on every man page.
const EXIT_STATUS: &[(&str, &str)] = &[
    ("0", "The agent stopped as asked (SIGTERM, SIGINT); check found nothing wrong; a command succeeded."),
    ("1", "check found a problem in the config (printed on stderr) or a definition (on stdout), each as file: line N: field: message; plugin test failed."),
    ("2", "The agent could not start or a command could not run: an unreadable config (or, but for check, an invalid one), a data dir another agent holds, a store that cannot be opened; the reason is on stderr."),
];

/// The examples of each command, by its path.
fn examples(path: &str) -> Vec<(&'static str, &'static str)> {
    match path {
        "apollo-agent" => vec![
            ("Run the agent on the project in the current directory:", "apollo-agent"),
            ("Run it as the installed service does:", "apollo-agent --config /etc/apollo/apollo.yaml"),
        ],
        "apollo-agent run" => vec![("The same as apollo-agent alone:", "apollo-agent run --log-format json")],
        "apollo-agent check" => vec![
            ("Check the config and every definition before a reload:", "apollo-agent check"),
            ("Check one file you are writing:", "apollo-agent check tasks/restart_service.yaml"),
        ],
        "apollo-agent dial-stdio" => {
            vec![("What apollo-tui --ssh runs on the remote host:", "ssh ops@db-7 apollo-agent dial-stdio")]
        }
        "apollo-agent man" => vec![("Write every page:", "apollo-agent man --dir /usr/local/share/man/man1")],
        "apollo-agent completions" => vec![(
            "Completion for bash:",
            "apollo-agent completions bash > ~/.local/share/bash-completion/completions/apollo-agent",
        )],
        "apollo-agent backup" => {
            vec![("A consistent copy while the agent runs:", "apollo-agent backup /var/backups/apollo.db")]
        }
        "apollo-agent migrate" => {
            vec![("Move the store to PostgreSQL:", "apollo-agent migrate --to postgres://apollo@db:5432/ops")]
        }
        "apollo-agent plugin" | "apollo-agent plugin test" => {
            vec![(
                "Check an external plugin before registering it:",
                "apollo-agent plugin test tasks/plugins/inventory.py",
            )]
        }
        "apollo-agent plugin new" => {
            vec![("A Python plugin and its tests in tasks/plugins/:", "apollo-agent plugin new restart_api --python")]
        }
        _ => Vec::new(),
    }
}

fn env_socket() -> Option<PathBuf> {
    std::env::var_os("APOLLO_SOCKET").filter(|s| !s.is_empty()).map(PathBuf::from)
}

fn load(args: &Args) -> anyhow::Result<Config> {
    let (path, install) = config::resolve_path(args.config.as_deref());
    let mut cfg = match path {
        Some(path) => Config::load(&path)?,
        None => Config::default(),
    };
    cfg.install = install;
    let cwd = std::env::current_dir()?;
    Ok(cfg.with_overrides(config::Overrides {
        tasks: args.tasks.as_ref().map(|t| cwd.join(t)),
        data_dir: args.data_dir.as_ref().map(|d| cwd.join(d)),
        socket: args.socket.clone().or(env_socket()).map(|s| cwd.join(s)),
        name: args.name.clone(),
    }))
    .and_then(|c| {
        c.validate_name("--name")?;
        Ok(c)
    })
}

/// mimalloc: allocations are a good part of a step's cost (a step's
/// context, output and rows are built and dropped in many small pieces);
/// see docs/benchmarks.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `arena_eager_commit` (option 4 of the pinned mimalloc 3):
/// committed eagerly, its arenas are backed by huge pages on Linux and the
/// agent's resident size grows by about 15 MB; committed as used, it stays
/// where the system allocator left it.
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
/// mimalloc's `purge_delay` (option 15): freed memory goes back to the
/// system at once rather than 10 ms later, which keeps the resident size
/// within the 40 MB the agent must stay under (2-3 MB less in engine_bench).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Runs before `main` and before the first allocation (from the ELF
/// initialisers, where the standard library allocates nothing), so the
/// first arena is already committed as used.
extern "C" fn allocator_options() {
    // SAFETY: sets a plain option; no thread exists yet.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0);
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
    }
}
#[used]
#[link_section = ".init_array"]
static ALLOCATOR_OPTIONS: extern "C" fn() = allocator_options;

fn main() -> ExitCode {
    // Fault tests configure fail points through FAILPOINTS (a no-op unless
    // built with the `failpoints` feature).
    let _failpoints = fail::FailScenario::setup();
    let args = Args::parse();
    match real_main(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("apollo-agent: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn real_main(args: Args) -> anyhow::Result<ExitCode> {
    use clap::CommandFactory;
    match &args.command {
        Some(Command::Man { dir }) => {
            let extra = apollo_shared::man::Extra { exit_status: EXIT_STATUS, examples: &examples };
            match dir {
                Some(d) => drop(apollo_shared::man::write_all(Args::command(), &extra, d)?),
                None => {
                    let mut cmd = Args::command();
                    cmd.build();
                    apollo_shared::man::render(cmd, "apollo-agent", &extra, &mut std::io::stdout())?;
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        Some(Command::Completions { shell }) => {
            clap_complete::generate(*shell, &mut Args::command(), "apollo-agent", &mut std::io::stdout());
            return Ok(ExitCode::SUCCESS);
        }
        _ => {}
    }
    let cfg = match load(&args) {
        // For check, a config read and found invalid is a problem found (1),
        // not a command that could not run (2).
        Err(e) if matches!(args.command, Some(Command::Check { .. })) && e.is::<config::Problems>() => {
            eprintln!("apollo-agent: {e:#}");
            return Ok(ExitCode::from(1));
        }
        loaded => loaded?,
    };
    match args.command.unwrap_or(Command::Run) {
        Command::Check { paths } => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let problems = rt.block_on(apollo_agent::check::run(&cfg, &paths, &mut std::io::stdout()))?;
            Ok(if problems == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Plugin(PluginCmd::Test { exe, params }) => {
            let params = match params {
                Some(p) => Some(serde_json::from_str(&p).context("--params: not a JSON object")?),
                None => None,
            };
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let ok = rt.block_on(apollo_agent::plugins::kit::run(&exe, params, &mut std::io::stdout()))?;
            Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Plugin(PluginCmd::New { name, python: _, dir }) => {
            let dir = dir.unwrap_or_else(|| cfg.tasks_dir().join("plugins"));
            match apollo_agent::plugins::template::python(&name, &dir) {
                Ok(w) => {
                    let (plugin, test) = (w.plugin.display(), w.test.display());
                    println!("wrote {plugin} (the plugin) and {test} (its tests)");
                    println!("next (the SDK must be importable by the agent's python3: pip install ./sdk/python,");
                    println!("or the apollo package's copy):");
                    println!("  apollo-agent plugin test {plugin}");
                    println!("  python3 {test}");
                    println!("  a step:  - plugin: {name}");
                    println!("             params: {{note: hello}}");
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("apollo-agent plugin new: {e}");
                    Ok(ExitCode::from(1))
                }
            }
        }
        Command::Man { .. } | Command::Completions { .. } => Ok(ExitCode::SUCCESS),
        Command::Backup { file } => {
            let db = cfg.db_path();
            let report = apollo_agent::store::backup(&db, &file)?;
            println!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate { to, schema } => {
            let db = cfg.db_path();
            let _lock = apollo_agent::lock_data_dir(&cfg.data_dir()).map_err(|e| {
                anyhow::anyhow!("{e:#}\napollo-agent migrate: stop the agent before migrating its store")
            })?;
            let schema = schema.unwrap_or_else(|| cfg.database.schema.clone());
            let password = match &cfg.database.password_env {
                Some(var) => std::env::var(var).ok(),
                None => std::env::var("PGPASSWORD").ok(),
            };
            let target = apollo_agent::store::postgres::Target::new(&to, &schema, password)?;
            let report = apollo_agent::store::migrate::to_postgres(&db, &target)?;
            println!("migrated {} to {}", db.display(), target.shown);
            for t in &report {
                println!("  {:<16} {:>9} rows  sha256 {}", t.table, t.rows, &t.checksum[..16]);
            }
            println!(
                "verified: every table's rows and checksum match. Next: in apollo.yaml set\n  database:\n    url: {to}\n    \
                 schema: {schema}\nand start the agents; they continue every unfinished instance."
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::DialStdio => {
            // Reached through SSH in a login directory: with nothing said
            // there, the first socket that exists of the project's and the
            // system's (the order the clients use).
            let said =
                args.socket.is_some() || env_socket().is_some() || cfg.source.is_some() || args.data_dir.is_some();
            let socket = if said {
                cfg.socket_path()
            } else {
                apollo_shared::paths::client_sockets(None, None)
                    .into_iter()
                    .find(|p| p.exists())
                    .unwrap_or_else(|| cfg.socket_path())
            };
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(apollo_agent::server::dial::run(&socket))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Run => {
            let format = args.log_format.clone().unwrap_or_else(|| cfg.logging.format.clone());
            let _guard = apollo_agent::telemetry::init(&cfg.logging, cfg.log_dir().as_deref(), &format);
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(async {
                let shutdown = CancellationToken::new();
                apollo_agent::shutdown::on_signals(shutdown.clone());
                apollo_agent::run(cfg, shutdown).await.context("agent failed")
            })?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
