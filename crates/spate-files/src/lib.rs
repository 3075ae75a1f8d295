//! An exactly-once file sink: a stream's records as JSON lines files under
//! `<root>/dt=YYYY-MM-DD/hour=HH/`, by each record's event time (UTC), on
//! a local disk or in S3, each batch's files published only once its
//! output is complete, so that a crash or a re-run leaves neither a half
//! file nor a second copy.
//!
//! It features:
//!
//! - [`FileSink`]: any `Serialize` record and a function giving its event
//!   time; [`FileSink::write_batch`] from a batch's output, or
//!   [`WriteFiles::write_files`] on a [`spate_dstream::DStream`];
//! - the partition layout of Hive and of Flink's filesystem connector
//!   (`key=value` directories), by hour or, as Nexmark q10 has it, by
//!   minute ([`Partitioning`]);
//! - names that depend only on the batch (`part-<batch time>-<batch
//!   id>-<part>.jsonl`), a manifest a batch (`_manifests/`), and a
//!   recovery that finishes a publication a crash cut short;
//! - every write through spate-logstore's [`CheckpointFileManager`]: on a
//!   disk a temp file, fsync, link and directory fsync; in S3 (feature
//!   `s3`, `s3://bucket/prefix`, the `AWS_*` variables as for checkpoints)
//!   one conditional PUT; and so its fault injection in the tests.
//!
//! It is not a reader, a compactor or a table format: no schema, no
//! statistics, no small-file merging (a batch writes at least one file a
//! partition it touches, so short batches make many small files), and no
//! Parquet. JSON lines is the choice because a record's serde form is its
//! schema, every engine reads it (`spark.read.json`, DuckDB's `read_json`,
//! Hive's JSON SerDe, `jq`), a partial line is plainly visible, and it
//! needs no new dependency; a columnar format would bring the Arrow stack
//! and a schema of its own.
//!
//! # The layout
//!
//! ```text
//! <root>/
//!   dt=2026-12-05/hour=18/part-1796494029000-7-00000.jsonl   the data, one JSON value a line
//!   _manifests/1796494029000-7.json                          batch 7 (at that batch time) is published
//!   _staging/1796494030000-8/…                               batch 8 being written
//! ```
//!
//! # The invariant
//!
//! A data file under its final name is complete, and belongs to a batch
//! whose every file was durably staged and listed in a manifest before
//! any was published. A batch's files are decided once, by the first
//! attempt that writes its manifest; every later attempt (a re-run after a
//! crash, which the runtime feeds the same input) finishes publishing those
//! same files and writes nothing new. So each record of a committed batch
//! is in exactly one data file, once every publication a crash cut short is
//! finished, which the sink does before its first batch after a restart.
//!
//! The steps of a batch, each durable before the next: stage every file under `_staging/<batch>/`; write the manifest
//! there (the decision); move each file to its final name; record the
//! manifest in `_manifests/`; clean the staging directory. A crash before
//! the decision leaves only staged files, which the next run drops (the
//! batch had not finished its output, so it runs again); a crash after it
//! is finished forward. All of this happens in the batch's output, before
//! the runtime writes `commits/N`, so a batch that committed is published.
//!
//! # The rule for readers
//!
//! - Read the files under `dt=*/hour=*/` (or `dt=*/hm=*/`) whose names do
//!   not start with `_` or `.`, the rule of Hive, Spark and Flink, which
//!   skip `_staging/` and `_manifests/` by themselves. Each file is whole,
//!   and no record is in two files. A batch's files appear one by one as
//!   it publishes, and after a crash the rest appear when the job starts
//!   again: a reader listing meanwhile may see part of the newest batch,
//!   never a duplicate.
//! - A reader that must see whole batches only reads a batch's files once
//!   `_manifests/<time>-<id>.json` exists, and reads the files it lists
//!   ([`FileSink::published`]). Manifests of the newest
//!   [`FileSinkSettings::retained_manifests`] batches are kept (1,000 by
//!   default); an older batch was published whole before its manifest was
//!   deleted.
//!
//! One job writes one root: the sink relies on the job's checkpoint lock to
//! run alone, and a new checkpoint needs a new root (or a root whose
//! manifests it cannot mistake: their names carry the batch time).
//!
//! # Departures from Flink's Nexmark q10
//!
//! q10 writes CSV through Flink's filesystem connector into
//! `dt=yyyy-MM-dd/hm=HH:mm` directories (the colon escaped to `%3A`),
//! rolls files every minute and commits a partition with a `_SUCCESS` file
//! a minute after the watermark passes its end. Here: JSON lines (the whole
//! record, so the partition values are in each line too, which Flink leaves
//! out); hourly directories by default and q10's minutes with
//! [`Partitioning::Minute`]; files cut at each batch instead of each
//! minute; and no `_SUCCESS` files, since batches, not partitions, are the
//! unit of commit: a late record still goes to its old partition in a new
//! file, which a success marker would wrongly have declared complete.
//!
//! ```
//! use spate_core::{BatchId, Time};
//! use spate_dstream::BatchInfo;
//! use spate_files::{BatchOutcome, FileSink, FileSinkSettings};
//!
//! #[derive(serde::Serialize)]
//! struct Bid { auction: i64, price: i64, date_time: i64 }
//!
//! let root = tempfile::tempdir()?;
//! let sink = FileSink::open(root.path(), FileSinkSettings::new(), |bid: &Bid| Time::from_millis(bid.date_time))?;
//! // 2026-12-05T18:07:09Z and an hour later.
//! let bids = [Bid { auction: 1, price: 70, date_time: 1_796_494_029_000 },
//!             Bid { auction: 2, price: 90, date_time: 1_796_497_629_000 }];
//! let batch = BatchInfo { time: Time::from_millis(1_796_497_630_000), batch_id: BatchId(7) };
//! let BatchOutcome::Published(manifest) = sink.write_batch(&bids, batch)? else { panic!("not published") };
//! assert_eq!(manifest.files[0].path, "dt=2026-12-05/hour=18/part-1796497630000-7-00000.jsonl");
//! let file = std::fs::read_to_string(root.path().join(&manifest.files[1].path))?;
//! assert_eq!(file, "{\"auction\":2,\"price\":90,\"date_time\":1796497629000}\n");
//!
//! // The same batch again (a re-run after a crash before its commit): nothing new.
//! assert!(matches!(sink.write_batch(&bids, batch)?, BatchOutcome::AlreadyPublished(_)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod error;
mod manifest;
mod partition;
mod sink;
mod stream;

pub use error::{FilesError, Result};
pub use manifest::{MANIFEST_VERSION, MAX_MANIFEST_BYTES, Manifest, ManifestFile};
pub use partition::{BatchKey, Partitioning};
pub use sink::{
    BYTES_PUBLISHED, BatchOutcome, DEFAULT_MAX_FILE_BYTES, DEFAULT_RETAINED_MANIFESTS, FILES_PUBLISHED, FileSink,
    FileSinkSettings, MANIFESTS_DIR, MAX_FILE_BYTES_LIMIT, PENDING_MANIFEST, RECORDS_PUBLISHED, Recovery, STAGING_DIR,
};
pub use spate_dstream::BatchInfo;
pub use spate_logstore::{CheckpointFileManager, ObjectStoreSettings};
pub use stream::WriteFiles;
