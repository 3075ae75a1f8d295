//! The `spate` command (see the `spate_cli` crate doc for commands and exit codes).

use std::io::Write;

fn main() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fixed_mmap_threshold::ensure();
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

/// glibc raises its mmap threshold to the size of each large block freed
/// (up to 32 MiB); after that a batch's large buffers come from the
/// threads' arenas, which keep what is freed. A member of an application
/// running a backlog then held about 110 MB more than it used (the
/// application benchmark, one member: peak RSS 457 MB, 348 MB with the
/// threshold fixed). Fixed at 256 KiB, large buffers are mapped and go back
/// to the system when freed. glibc reads the setting from the environment
/// at start, and the workspace allows no `unsafe` (`mallopt`), so the
/// process starts itself again with it, once, unless it is set already.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod fixed_mmap_threshold {
    use std::os::unix::process::CommandExt;

    const VARIABLE: &str = "MALLOC_MMAP_THRESHOLD_";
    const BYTES: &str = "262144";

    pub(super) fn ensure() {
        if std::env::var_os(VARIABLE).is_some() {
            return;
        }
        let Ok(exe) = std::env::current_exe() else { return };
        let mut args = std::env::args_os();
        let mut command = std::process::Command::new(exe);
        if let Some(arg0) = args.next() {
            command.arg0(arg0);
        }
        // Returns only when the exec failed: the process goes on as it is.
        let _ = command.args(args).env(VARIABLE, BYTES).exec();
    }
}
