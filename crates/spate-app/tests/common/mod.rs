//! What the tests against the local broker share.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::time::{SystemTime, UNIX_EPOCH};

/// The broker `cargo xtask test` (or `cargo xtask kafka start`) runs.
pub fn brokers() -> String {
    std::env::var("SPATE_KAFKA_BROKERS").unwrap_or_else(|_| {
        panic!(
            "SPATE_KAFKA_BROKERS is not set: start a broker with `cargo xtask kafka start` (or run `cargo xtask test`)"
        )
    })
}

/// A name no other test or run uses.
pub fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}
