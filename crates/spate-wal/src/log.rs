//! The [`WriteAheadLog`] trait: what every write-ahead log offers.

use std::sync::Arc;

use spate_core::{Time, WalRecordHandle};

use crate::error::WalError;

/// Every live record of a log, oldest segment first, read lazily.
pub type RecordIter<'a> = Box<dyn Iterator<Item = Result<Vec<u8>, WalError>> + Send + 'a>;

/// A durable, append-only log of opaque records, each written at a time.
///
/// Implementations are shared between threads: concurrent `write`s are
/// allowed (and are what group commit batches together).
pub trait WriteAheadLog: Send + Sync {
    /// Appends `record`, written at `time`, and returns its handle once the
    /// record is as durable as the log's sync policy promises (by default:
    /// fsynced). After an error the record must be treated as not written.
    fn write(&self, record: &[u8], time: Time) -> Result<WalRecordHandle, WalError>;

    /// [`write`](Self::write) for a record the caller shares rather than
    /// lends: a log may append it from that buffer instead of copying it
    /// first, which matters for large records (received blocks).
    fn write_shared(&self, record: Arc<Vec<u8>>, time: Time) -> Result<WalRecordHandle, WalError> {
        self.write(&record, time)
    }

    /// [`write_shared`](Self::write_shared) for a record whose CRC32C the
    /// caller already has (derived from a checksum the record carries): a
    /// log may use it instead of reading the record once more. A wrong value
    /// makes the record fail its check when read, so pass only a checksum of
    /// exactly these bytes.
    fn write_shared_with_crc32c(
        &self,
        record: Arc<Vec<u8>>,
        crc32c: u32,
        time: Time,
    ) -> Result<WalRecordHandle, WalError> {
        let _ = crc32c;
        self.write_shared(record, time)
    }

    /// Reads back the record behind `handle`, checking its CRC.
    fn read(&self, handle: &WalRecordHandle) -> Result<Vec<u8>, WalError>;

    /// Every record of every live segment, in time order, streamed rather
    /// than loaded at once.
    fn read_all(&self) -> Result<RecordIter<'_>, WalError>;

    /// Deletes the segments whose records are all older than `threshold`.
    /// Runs in the background unless `wait_for_completion` is set.
    fn clean(&self, threshold: Time, wait_for_completion: bool) -> Result<(), WalError>;

    /// Flushes and closes the log; later writes fail with [`WalError::Closed`].
    fn close(&self) -> Result<(), WalError>;
}
