//! The `apollo-tui` binary: the console. See `apollo_tui::console`.

use apollo_tui::client::Target;
use apollo_tui::console;
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "apollo-tui", version, about = "Apollo-11 console: live queues, timelines, step context and control")]
struct Args {
    /// The agent's socket (default: $APOLLO_SOCKET, ./.apollo/agent.sock, /run/apollo/agent.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Attach to an agent on another host through SSH: [user@]host[:port].
    #[arg(long, conflicts_with = "local")]
    ssh: Option<String>,
    /// Start an agent for the current directory (or reuse one), and stop the one started on exit.
    #[arg(long)]
    local: bool,
    /// Hide and refuse actions that change state.
    #[arg(long)]
    readonly: bool,
    /// Attach to a context from $XDG_CONFIG_HOME/apollo/contexts.yaml (its socket or SSH target;
    /// read-only and production flags apply).
    #[arg(long, conflicts_with_all = ["local", "ssh", "socket"])]
    context: Option<String>,
    /// Print the man page (roff) and exit.
    #[arg(long, hide = true)]
    man: bool,
    /// Print a shell completion script and exit (bash, zsh, fish, elvish, powershell).
    #[arg(long, hide = true, value_name = "SHELL")]
    completions: Option<clap_complete::Shell>,
}

const EXIT_STATUS: &[(&str, &str)] = &[
    ("0", "The console was quit (q, :q or Ctrl-C)."),
    ("2", "The console could not start: a context that is not in contexts.yaml, no terminal, an agent that --local could not start."),
];

fn examples(_: &str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("Attach to the agent of this directory, or of this host:", "apollo-tui"),
        ("Attach to an agent on another host through SSH:", "apollo-tui --ssh ops@db-7"),
        ("Start an agent for this directory and attach:", "apollo-tui --local"),
        ("A named context of contexts.yaml, read-only:", "apollo-tui --context prod-eu --readonly"),
    ]
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.man {
        use clap::CommandFactory;
        let extra = apollo_shared::man::Extra { exit_status: EXIT_STATUS, examples: &examples };
        let mut cmd = Args::command();
        cmd.build();
        return match apollo_shared::man::render(cmd, "apollo-tui", &extra, &mut std::io::stdout()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(2),
        };
    }
    if let Some(shell) = args.completions {
        use clap::CommandFactory;
        clap_complete::generate(shell, &mut Args::command(), "apollo-tui", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("apollo-tui: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    rt.block_on(async move {
        let mut started = None;
        let context = match args.context.as_deref().map(apollo_tui::contexts::Contexts::find) {
            None => None,
            Some(Ok(c)) => Some(c),
            Some(Err(e)) => {
                eprintln!("apollo-tui: {e}");
                return ExitCode::from(2);
            }
        };
        let target = if let Some(c) = &context {
            Target::of(c)
        } else if let Some(t) = args.ssh {
            Target::Ssh { target: t, socket: args.socket.map(|p| p.display().to_string()) }
        } else if args.local {
            let dir = std::env::current_dir().unwrap_or_default();
            match apollo_tui::local::attach(&dir).await {
                Ok((_, agent)) => {
                    started = agent;
                    Target::Socket(dir.join(".apollo/agent.sock"))
                }
                Err(e) => {
                    eprintln!("apollo-tui: {e}");
                    return ExitCode::from(2);
                }
            }
        } else {
            let candidates = apollo_tui::client::socket_candidates(args.socket.as_deref());
            let found = candidates.iter().find(|p| p.exists()).cloned();
            Target::Socket(found.unwrap_or_else(|| candidates[0].clone()))
        };
        let result = console::run(target, args.readonly, context).await;
        if let Some(a) = started {
            a.stop().await;
        }
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("apollo-tui: {e:#}");
                ExitCode::from(2)
            }
        }
    })
}
