//! The demo's exactly-once file sink: every window's result is appended to
//! `output.jsonl` once, however often the job crashes and re-runs a batch.
//!
//! Like a Kafka transaction, the appended bytes only count once a marker
//! says so: `_sink_commit` holds the last written batch and the file length
//! after it, and is replaced atomically (temp file, fsync, rename, directory
//! fsync). A batch at or below the marker is skipped (its output is already
//! there); otherwise the file is first cut back to the marked length, which
//! drops whatever a crash left half-written, then appended to and fsynced,
//! and only then is the marker moved.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::error::CliError;

/// The output file's name in the sink directory.
pub(crate) const OUTPUT_FILE: &str = "output.jsonl";
/// The commit marker's name in the sink directory.
pub(crate) const MARKER_FILE: &str = "_sink_commit";

/// The exactly-once file sink of one directory.
#[derive(Debug)]
pub(crate) struct FileSink {
    dir: PathBuf,
}

/// What the marker says: the last batch written and the file length after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Marker {
    batch: Option<u64>,
    bytes: u64,
}

impl FileSink {
    /// The sink writing into `dir`; the directory is created at the first write.
    pub(crate) fn new(dir: &Path) -> FileSink {
        FileSink { dir: dir.to_path_buf() }
    }

    fn read_marker(&self) -> Result<Marker, CliError> {
        let path = self.dir.join(MARKER_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Marker::default()),
            Err(e) => return Err(CliError::io("read the sink marker", path, e)),
        };
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| CliError::io("parse the sink marker", &path, std::io::Error::other(e)))?;
        match (value["batch"].as_u64(), value["bytes"].as_u64()) {
            (Some(batch), Some(bytes)) => Ok(Marker { batch: Some(batch), bytes }),
            _ => Err(CliError::io("parse the sink marker", path, std::io::Error::other("missing batch or bytes"))),
        }
    }

    fn write_marker(&self, marker: Marker) -> Result<(), CliError> {
        let path = self.dir.join(MARKER_FILE);
        let temp = self.dir.join(format!(".{MARKER_FILE}.tmp"));
        let body = json!({"batch": marker.batch, "bytes": marker.bytes}).to_string();
        let mut file = File::create(&temp).map_err(|e| CliError::io("create", &temp, e))?;
        file.write_all(body.as_bytes()).map_err(|e| CliError::io("write", &temp, e))?;
        file.sync_all().map_err(|e| CliError::io("fsync", &temp, e))?;
        fs::rename(&temp, &path).map_err(|e| CliError::io("rename into", &path, e))?;
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(|e| CliError::io("fsync", &self.dir, e))
    }

    /// Appends `lines` as batch `batch`'s output, once: false when the batch
    /// was already written (a re-run after a crash).
    pub(crate) fn write_batch(&self, batch: u64, lines: &[Value]) -> Result<bool, CliError> {
        let marker = self.read_marker()?;
        if marker.batch.is_some_and(|done| batch <= done) {
            return Ok(false);
        }
        fs::create_dir_all(&self.dir).map_err(|e| CliError::io("create the output directory", &self.dir, e))?;
        let path = self.dir.join(OUTPUT_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| CliError::io("open", &path, e))?;
        // Drop what an interrupted earlier attempt appended past the marker.
        file.set_len(marker.bytes).map_err(|e| CliError::io("truncate", &path, e))?;
        let mut bytes = Vec::new();
        for line in lines {
            bytes.extend_from_slice(line.to_string().as_bytes());
            bytes.push(b'\n');
        }
        file.write_all_at(&bytes, marker.bytes).map_err(|e| CliError::io("append to", &path, e))?;
        file.sync_all().map_err(|e| CliError::io("fsync", &path, e))?;
        self.write_marker(Marker { batch: Some(batch), bytes: marker.bytes + bytes.len() as u64 })?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(dir: &Path) -> Vec<String> {
        fs::read_to_string(dir.join(OUTPUT_FILE)).unwrap().lines().map(str::to_string).collect()
    }

    #[test]
    fn a_batch_is_written_once() {
        let root = tempfile::tempdir().unwrap();
        let sink = FileSink::new(root.path());
        assert!(sink.write_batch(1, &[json!({"b": 1})]).unwrap());
        assert!(!sink.write_batch(1, &[json!({"b": 1})]).unwrap());
        assert!(sink.write_batch(3, &[json!({"b": 3}), json!({"b": 3.5})]).unwrap());
        assert!(!sink.write_batch(2, &[json!({"b": 2})]).unwrap());
        assert_eq!(lines(root.path()), [r#"{"b":1}"#, r#"{"b":3}"#, r#"{"b":3.5}"#]);
    }

    #[test]
    fn bytes_past_the_marker_are_dropped_on_the_next_write() {
        let root = tempfile::tempdir().unwrap();
        let sink = FileSink::new(root.path());
        sink.write_batch(1, &[json!({"b": 1})]).unwrap();
        // A crash after appending batch 3 but before its marker moved.
        let mut file = OpenOptions::new().append(true).open(root.path().join(OUTPUT_FILE)).unwrap();
        file.write_all(b"{\"b\":3}\n{\"b\"").unwrap();
        assert!(sink.write_batch(3, &[json!({"b": 3})]).unwrap());
        assert_eq!(lines(root.path()), [r#"{"b":1}"#, r#"{"b":3}"#]);
    }
}
