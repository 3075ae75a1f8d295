//! Who holds a checkpoint's writer lock: the plain record that the lock
//! file and the lease carry, and that [`crate::LogStoreError::Locked`]
//! reports. Kept apart from the lock itself so the error type can name it
//! without depending on the locking code.

use std::fmt;

use serde::{Deserialize, Serialize};
use spate_core::Time;

/// Who holds (or last held) a checkpoint's writer lock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHolder {
    /// The holder's process id.
    pub pid: u32,
    /// The holder's host name.
    pub host: String,
    /// When it took the lock.
    #[serde(rename = "sinceMs")]
    pub since: Time,
    /// Its epoch: one more than the previous holder's.
    pub epoch: u64,
}

impl fmt::Display for LockHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} on host {} since {} (epoch {})", self.pid, self.host, self.since.to_iso8601(), self.epoch)
    }
}
