//! The `spate` command (see the `spate_cli` crate doc for commands and exit codes).

use std::io::Write;

fn main() {
    let outcome = spate_cli::run_command(std::env::args_os());
    // A closed stdout or stderr (e.g. piped into `head`) is not worth a panic.
    if !outcome.stdout.is_empty() {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{}", outcome.stdout.trim_end());
        let _ = stdout.flush();
    }
    if !outcome.stderr.is_empty() {
        let _ = writeln!(std::io::stderr().lock(), "{}", outcome.stderr.trim_end());
    }
    std::process::exit(outcome.code);
}
