//! The `apollo` binary: see `apollo_tui::cli` for commands and exit codes.

use clap::{CommandFactory, Parser};

fn main() -> std::process::ExitCode {
    // `apollo ls | head` ends quietly when head has read enough, as any
    // Unix filter does, instead of panicking on the closed pipe.
    // SAFETY: set before any thread starts; SIG_DFL has no handler to run.
    unsafe {
        let _ = nix::sys::signal::signal(nix::sys::signal::Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl);
    }
    // A shell asking for completions (`COMPLETE=bash apollo -- …`) is
    // answered here, and the process ends.
    clap_complete::CompleteEnv::with_factory(apollo_tui::cli::Args::command).complete();
    let args = match apollo_tui::cli::Args::try_parse() {
        Ok(args) => args,
        Err(e) => return apollo_tui::cli::parse_failed(e),
    };
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt.block_on(apollo_tui::cli::main(args)),
        Err(e) => {
            eprintln!("apollo: cannot start the runtime: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
