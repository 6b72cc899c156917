//! The `apollo` binary: see `apollo_tui::cli` for commands and exit codes.

use clap::{CommandFactory, Parser};

fn main() -> std::process::ExitCode {
    // A shell asking for completions (`COMPLETE=bash apollo -- …`) is
    // answered here, and the process ends.
    clap_complete::CompleteEnv::with_factory(apollo_tui::cli::Args::command).complete();
    let args = apollo_tui::cli::Args::parse();
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt.block_on(apollo_tui::cli::main(args)),
        Err(e) => {
            eprintln!("apollo: cannot start the runtime: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
