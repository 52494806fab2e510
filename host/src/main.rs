//! `abridge`: the command-line runner for the abridge summarization engine.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
