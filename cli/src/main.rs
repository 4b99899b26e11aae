//! The `sluice` binary: the command line of [`sluice_cli`].

fn main() -> std::process::ExitCode {
    sluice_cli::main()
}
