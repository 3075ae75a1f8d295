//! Serde for `Arc<str>` without serde's `rc` feature, for a name many
//! records share in memory (a topic): written as a plain string, read back
//! into an `Arc<str>` of its own. Use with `#[serde(with =
//! "spate_core::shared_str")]`.

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serializer};

/// Writes the shared string as a plain string.
pub fn serialize<S: Serializer>(value: &Arc<str>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(value)
}

/// Reads a plain string into a new `Arc<str>`.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Arc<str>, D::Error> {
    String::deserialize(deserializer).map(Arc::from)
}
