//! The two entry types of a checkpoint: the offsets of a batch
//! ([`OffsetSeq`], in `offsets/N`) and its commit ([`CommitMetadata`], in
//! `commits/N`), in Spark Structured Streaming's file layout.
//!
//! # The offsets file, and how sources are named
//!
//! ```text
//! v1
//! {"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{…},"sources":["kafka-in","socket"]}
//! {"events":{"0":36,"1":12}}
//! -
//! ```
//!
//! Line 2 is the batch metadata, then one line per source: that source's
//! offsets as JSON, or `-` when the source has no offsets yet. Spark's lines
//! are positional: the i-th line belongs to the i-th source of the query. A
//! spate pipeline's code may change between runs (sources added, reordered),
//! so spate also writes the names of the sources, in order, as a `"sources"`
//! list in the metadata line. Spark's reader ignores fields it does not know,
//! so the file stays readable by Spark; spate's reader uses the list when it
//! is there and otherwise (a file written by Spark) names the sources by
//! position: `"0"`, `"1"`, … — the same numbers Spark gives its
//! `sources/<i>` directories. [`OffsetSeq::offset_of`] finds a source by name.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use spate_core::Time;

use crate::log::{BodyError, LogEntry, MetadataLog, clip, first_line};

/// The text of a source line for a source that has no offsets.
pub const NO_OFFSET: &str = "-";

/// The offsets of one source in one batch.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceOffset {
    /// The source's stable name (positional, `"0"`, `"1"`, … in files written by Spark).
    pub name: String,
    /// The source's offsets as JSON (its own format), or `None` when it has none yet.
    pub offset: Option<Value>,
}

impl SourceOffset {
    /// Source `name` at `offset`.
    pub fn new(name: impl Into<String>, offset: Option<Value>) -> Self {
        SourceOffset { name: name.into(), offset }
    }
}

/// One entry of the offsets log: where each source is at the end of a batch,
/// and the batch's metadata (Spark's `OffsetSeq` with `OffsetSeqMetadata`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OffsetSeq {
    /// The event-time watermark the batch runs with.
    pub batch_watermark: Time,
    /// The batch time.
    pub batch_timestamp: Time,
    /// Settings pinned for the life of the checkpoint (they must not change on restart).
    pub conf: BTreeMap<String, String>,
    /// The sources, in order.
    pub sources: Vec<SourceOffset>,
}

impl OffsetSeq {
    /// The offsets of the source named `name`; `None` when there is no such
    /// source, `Some(None)` when it has no offsets yet.
    pub fn offset_of(&self, name: &str) -> Option<Option<&Value>> {
        self.sources.iter().find(|s| s.name == name).map(|s| s.offset.as_ref())
    }
}

/// The metadata line as it is written (Spark's field names, plus `sources`).
#[derive(Serialize, Deserialize)]
struct MetadataLine {
    #[serde(rename = "batchWatermarkMs", default)]
    batch_watermark: Time,
    #[serde(rename = "batchTimestampMs", default)]
    batch_timestamp: Time,
    #[serde(default)]
    conf: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sources: Option<Vec<String>>,
}

impl LogEntry for OffsetSeq {
    const VERSION: u32 = 1;

    fn encode_body(&self) -> Result<String, String> {
        check_names(self.sources.iter().map(|s| s.name.as_str())).map_err(|e| e.reason)?;
        let meta = MetadataLine {
            batch_watermark: self.batch_watermark,
            batch_timestamp: self.batch_timestamp,
            conf: self.conf.clone(),
            sources: Some(self.sources.iter().map(|s| s.name.clone()).collect()),
        };
        let mut body = serde_json::to_string(&meta).map_err(|e| e.to_string())?;
        for source in &self.sources {
            body.push('\n');
            match &source.offset {
                Some(offset) => body.push_str(&serde_json::to_string(offset).map_err(|e| e.to_string())?),
                None => body.push_str(NO_OFFSET),
            }
        }
        Ok(body)
    }

    fn decode_body(_version: u32, body: &str) -> Result<Self, BodyError> {
        let mut lines = body.lines();
        let meta_text = lines.next().ok_or_else(|| BodyError::new(2, "missing the metadata line"))?.trim();
        // Spark writes an empty metadata line for queries without metadata.
        let meta: MetadataLine = if meta_text.is_empty() {
            MetadataLine {
                batch_watermark: Time::ZERO,
                batch_timestamp: Time::ZERO,
                conf: BTreeMap::new(),
                sources: None,
            }
        } else {
            serde_json::from_str(meta_text).map_err(|e| BodyError::new(2, format!("metadata: {e}")))?
        };
        let offsets =
            lines.enumerate().map(|(i, line)| parse_offset_line(i + 3, line)).collect::<Result<Vec<_>, _>>()?;
        let names = match meta.sources {
            Some(names) => {
                check_names(names.iter().map(String::as_str))?;
                if names.len() != offsets.len() {
                    let reason = format!("{} source names but {} offset lines", names.len(), offsets.len());
                    return Err(BodyError::new(2, reason));
                }
                names
            }
            None => (0..offsets.len()).map(|i| i.to_string()).collect(),
        };
        let sources = names.into_iter().zip(offsets).map(|(name, offset)| SourceOffset { name, offset }).collect();
        Ok(OffsetSeq {
            batch_watermark: meta.batch_watermark,
            batch_timestamp: meta.batch_timestamp,
            conf: meta.conf,
            sources,
        })
    }
}

fn parse_offset_line(line_no: usize, line: &str) -> Result<Option<Value>, BodyError> {
    let line = line.trim();
    if line == NO_OFFSET {
        return Ok(None);
    }
    if line.is_empty() {
        return Err(BodyError::new(line_no, "empty source line (a source without offsets is written `-`)"));
    }
    serde_json::from_str(line)
        .map(Some)
        .map_err(|e| BodyError::new(line_no, format!("source offsets {:?}: {e}", clip(line))))
}

fn check_names<'a>(names: impl Iterator<Item = &'a str>) -> Result<(), BodyError> {
    let mut seen = BTreeSet::new();
    for name in names {
        if name.is_empty() {
            return Err(BodyError::new(2, "a source name is empty"));
        }
        if !seen.insert(name) {
            return Err(BodyError::new(2, format!("source name {:?} appears twice", clip(name))));
        }
    }
    Ok(())
}

/// One entry of the commit log: batch N finished (Spark's `CommitMetadata`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitMetadata {
    /// The watermark the next batch starts from.
    #[serde(rename = "nextBatchWatermarkMs", default)]
    pub next_batch_watermark: Time,
}

impl CommitMetadata {
    /// A commit whose next batch starts at watermark `next_batch_watermark`.
    pub fn new(next_batch_watermark: Time) -> Self {
        CommitMetadata { next_batch_watermark }
    }
}

impl LogEntry for CommitMetadata {
    const VERSION: u32 = 1;

    fn encode_body(&self) -> Result<String, String> {
        serde_json::to_string(self).map_err(|e| e.to_string())
    }

    fn decode_body(_version: u32, body: &str) -> Result<Self, BodyError> {
        let line = first_line(body).ok_or_else(|| BodyError::new(2, "missing the JSON line after the version"))?;
        serde_json::from_str(line.trim()).map_err(|e| BodyError::new(2, e.to_string()))
    }
}

/// The offsets log, `<checkpoint>/offsets/`.
pub type OffsetLog = MetadataLog<OffsetSeq>;
/// The commit log, `<checkpoint>/commits/`.
pub type CommitLog = MetadataLog<CommitMetadata>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{decode_entry, encode_entry};
    use serde_json::json;
    use std::path::Path;

    fn sample() -> OffsetSeq {
        OffsetSeq {
            batch_watermark: Time::from_millis(5_000),
            batch_timestamp: Time::from_millis(1_700_000_000_000),
            conf: BTreeMap::from([("spate.shuffle.partitions".to_string(), "8".to_string())]),
            sources: vec![
                SourceOffset::new("kafka-in", Some(json!({"events": {"0": 36, "1": 12}}))),
                SourceOffset::new("socket", None),
            ],
        }
    }

    #[test]
    fn offsets_are_written_in_sparks_layout_with_names() {
        let text = String::from_utf8(encode_entry(&sample()).unwrap()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "v1");
        assert!(lines[1].starts_with(r#"{"batchWatermarkMs":5000,"batchTimestampMs":1700000000000,"conf":"#));
        assert!(lines[1].contains(r#""sources":["kafka-in","socket"],"crc32c":""#), "{}", lines[1]);
        assert_eq!(&lines[2..], [r#"{"events":{"0":36,"1":12}}"#, "-"]);
        let back: OffsetSeq = decode_entry(Path::new("offsets/0"), text.as_bytes()).unwrap();
        assert_eq!(back, sample());
    }

    #[test]
    fn names_must_match_the_lines() {
        let text = "v1\n{\"sources\":[\"a\",\"b\"]}\n-";
        let err = decode_entry::<OffsetSeq>(Path::new("offsets/3"), text.as_bytes()).unwrap_err().to_string();
        assert!(err.contains("offsets/3") && err.contains("2 source names but 1 offset lines"), "{err}");
        let dup = OffsetSeq { sources: vec![SourceOffset::new("a", None), SourceOffset::new("a", None)], ..sample() };
        assert!(encode_entry(&dup).unwrap_err().contains("appears twice"));
    }

    #[test]
    fn empty_metadata_line_reads_as_defaults() {
        let seq: OffsetSeq = decode_entry(Path::new("offsets/0"), b"v1\n\n{\"t\":{\"0\":1}}").unwrap();
        assert_eq!(seq.batch_timestamp, Time::ZERO);
        assert_eq!(seq.offset_of("0"), Some(Some(&json!({"t": {"0": 1}}))));
    }

    #[test]
    fn commit_is_sparks_line() {
        let bytes = encode_entry(&CommitMetadata::default()).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("v1\n{\"nextBatchWatermarkMs\":0,\"crc32c\":\""), "{text}");
        assert_eq!(text.len(), "v1\n{\"nextBatchWatermarkMs\":0,\"crc32c\":\"01234567\"}".len());
        assert_eq!(
            decode_entry::<CommitMetadata>(Path::new("commits/0"), text.as_bytes()).unwrap(),
            CommitMetadata::default()
        );
        let back: CommitMetadata =
            decode_entry(Path::new("commits/0"), b"v1\n{\"nextBatchWatermarkMs\":42,\"x\":1}\n").unwrap();
        assert_eq!(back, CommitMetadata::new(Time::from_millis(42)));
    }
}
