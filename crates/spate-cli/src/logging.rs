//! Logging to stderr through tracing-subscriber: `RUST_LOG` when set,
//! otherwise the level chosen with `-v` (warnings only without it).

use tracing_subscriber::EnvFilter;

/// Installs the subscriber once; later calls (tests running several commands) do nothing.
pub(crate) fn init(verbose: u8) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => EnvFilter::new(spec),
        _ => EnvFilter::new(match verbose {
            0 => "warn",
            1 => "info",
            2 => "debug",
            _ => "trace",
        }),
    };
    // Fails only when a subscriber is already installed, which is fine.
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
