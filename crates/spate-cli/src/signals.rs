//! Stopping a job: the first SIGINT or SIGTERM asks for a graceful stop (the
//! batch in flight finishes and commits, the lock is released); a second one
//! ends the process at once with exit code 130. The checkpoint stays
//! consistent either way: an uncommitted batch re-runs at the next start.
//!
//! Only signals are counted here. A graceful stop the job asked for itself
//! (`--seconds`, `--until-batch`) is not a signal, so the first Ctrl-C after
//! it is still the first.
//!
//! The second signal exits the process without releasing the writer lock
//! first: the lock is an OS lock on the open lock file, which the kernel
//! drops only once every thread of the process is gone. So no output job
//! of the abandoned batch can run after another writer could take the
//! checkpoint over. In S3 the lease is not released either: the next writer
//! takes over once it has run out, long after this process is gone.

use crate::error::{CliError, ExitCode};

/// Listens for SIGINT and SIGTERM while alive (dropping it stops listening).
#[derive(Debug)]
pub(crate) struct SignalListener {
    _runtime: tokio::runtime::Runtime,
}

/// Starts listening: the first signal calls `on_first` (a graceful stop),
/// the second exits the process at once with code 130.
pub(crate) fn listen(on_first: impl FnOnce() + Send + 'static) -> Result<SignalListener, CliError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("spate-signals")
        .enable_all()
        .build()
        .map_err(|e| CliError::io("start the signal listener for", "SIGINT/SIGTERM", e))?;
    let (mut interrupt, mut terminate) = runtime
        .block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            Ok::<_, std::io::Error>((signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?))
        })
        .map_err(|e| CliError::io("listen for", "SIGINT/SIGTERM", e))?;
    runtime.spawn(async move {
        // Signals only: the job's own stop requests are not counted here.
        let mut on_first = Some(on_first);
        loop {
            let name = tokio::select! {
                _ = interrupt.recv() => "SIGINT",
                _ = terminate.recv() => "SIGTERM",
            };
            match on_first.take() {
                Some(stop) => {
                    tracing::info!(signal = name, "graceful stop requested");
                    say(&format!(
                        "{name}: stopping gracefully after the queued batches; send it again to stop at once"
                    ));
                    stop();
                }
                None => {
                    say(&format!("{name} again: stopping at once; the uncommitted batch re-runs at the next start"));
                    std::process::exit(ExitCode::Interrupted.code());
                }
            }
        }
    });
    Ok(SignalListener { _runtime: runtime })
}

/// One line on stderr; a closed stderr is ignored.
pub(crate) fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
