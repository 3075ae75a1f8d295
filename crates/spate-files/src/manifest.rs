//! A batch's manifest: the list of the files its output is, each with its
//! record count, length and CRC-32C, as one JSON document.
//!
//! The same bytes are written twice: into the batch's staging directory
//! once every file is staged (the batch's files are decided: from here a
//! crash is finished forward, never undone), and into `_manifests/` once
//! every file is in its final place (the batch is visible, whole). The
//! checksums let a publish that finds a final name taken tell its own file,
//! moved before a crash, from anything else.

use serde::{Deserialize, Serialize};
use spate_core::{BatchId, Time};

use crate::partition::BatchKey;

/// The manifest format this build writes and reads.
pub const MANIFEST_VERSION: u32 = 1;

/// The most bytes a manifest may have when read back (a batch of a million
/// files is about 150 MB; anything larger is damage, not a manifest).
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// One file of a batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestFile {
    /// The file's path under the sink's root, `/`-separated:
    /// `dt=2026-12-05/hour=18/part-1796494029000-7-00000.jsonl`.
    pub path: String,
    /// Its records (lines).
    pub records: u64,
    /// Its length in bytes.
    pub bytes: u64,
    /// The CRC-32C of its content.
    pub crc32c: u32,
}

/// What one batch wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`MANIFEST_VERSION`].
    pub version: u32,
    /// The batch id.
    pub batch_id: u64,
    /// The batch time, in milliseconds since the epoch.
    pub batch_time_ms: i64,
    /// The files, in the order they were written.
    pub files: Vec<ManifestFile>,
}

impl Manifest {
    /// The manifest of the batch `key` with `files`.
    pub fn new(key: BatchKey, files: Vec<ManifestFile>) -> Self {
        Manifest { version: MANIFEST_VERSION, batch_id: key.batch_id.0, batch_time_ms: key.time.as_millis(), files }
    }

    /// The batch it belongs to.
    pub fn key(&self) -> BatchKey {
        BatchKey::new(Time::from_millis(self.batch_time_ms), BatchId(self.batch_id))
    }

    /// Records over all its files.
    pub fn records(&self) -> u64 {
        self.files.iter().map(|f| f.records).sum()
    }

    /// The manifest as written: one JSON line.
    pub fn encode(&self) -> Vec<u8> {
        // Numbers and strings only (no map with non-string keys): it cannot fail.
        let mut bytes = serde_json::to_vec(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Reads a manifest back, checking that it is the one of `expected` and
    /// that every path stays under the root; the reason it is not otherwise.
    pub fn decode(bytes: &[u8], expected: BatchKey) -> Result<Manifest, String> {
        let manifest: Manifest = serde_json::from_slice(bytes).map_err(|e| format!("not a manifest: {e}"))?;
        if manifest.version != MANIFEST_VERSION {
            return Err(format!(
                "manifest format v{} (this build reads v{MANIFEST_VERSION}); upgrade spate to read it",
                manifest.version
            ));
        }
        if manifest.key() != expected {
            return Err(format!("holds batch {} instead of batch {}", manifest.key().name(), expected.name()));
        }
        if let Some(file) = manifest.files.iter().find(|f| !is_safe_relative_path(&f.path)) {
            return Err(format!("names the file {:?}, which is not a data file under the root", file.path));
        }
        Ok(manifest)
    }
}

/// True for `dt=…/…/part-….jsonl`: relative, without `.`, `..` or empty
/// components, and outside the sink's own `_` directories. A damaged
/// manifest can so never make a publish move or read anything else.
fn is_safe_relative_path(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    parts.len() >= 2
        && parts.iter().all(|p| !p.is_empty() && *p != "." && *p != ".." && !p.contains('\\'))
        && parts.first().is_some_and(|p| p.starts_with("dt="))
        && parts.last().is_some_and(|p| p.starts_with("part-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        let key = BatchKey::new(Time::from_millis(1_796_494_029_000), BatchId(7));
        let file = ManifestFile {
            path: format!("dt=2026-12-05/hour=18/{}", key.file_name(0)),
            records: 3,
            bytes: 120,
            crc32c: 0xdead_beef,
        };
        Manifest::new(key, vec![file])
    }

    #[test]
    fn a_manifest_round_trips_as_one_json_line() {
        let m = manifest();
        let bytes = m.encode();
        assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 1);
        assert!(bytes.starts_with(b"{\"version\":1,\"batch_id\":7,\"batch_time_ms\":1796494029000,\"files\":[{"));
        assert_eq!(Manifest::decode(&bytes, m.key()).unwrap(), m);
        assert_eq!(m.records(), 3);
    }

    #[test]
    fn another_batch_a_newer_format_or_a_path_outside_is_refused() {
        let m = manifest();
        let other = BatchKey::new(m.key().time, BatchId(8));
        assert!(Manifest::decode(&m.encode(), other).unwrap_err().contains("instead of batch"));
        let newer = Manifest { version: 2, ..m.clone() };
        assert!(Manifest::decode(&newer.encode(), m.key()).unwrap_err().contains("upgrade spate"));
        for path in ["../x/part-1", "/etc/part-1", "dt=a/../../part-1", "_staging/x/part-1", "dt=a//part-1", "dt=a"] {
            let mut bad = m.clone();
            bad.files[0].path = path.to_string();
            let error = Manifest::decode(&bad.encode(), m.key()).unwrap_err();
            assert!(error.contains("not a data file"), "{path}: {error}");
        }
        assert!(Manifest::decode(b"{\"version\":1}", m.key()).unwrap_err().starts_with("not a manifest"));
        assert!(Manifest::decode(b"\xff", m.key()).is_err());
    }
}
