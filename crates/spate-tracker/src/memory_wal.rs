//! An in-memory [`WriteAheadLog`] test double: records in a vector, writes
//! that can be made to fail, and cleaning at single-record granularity (the
//! most aggressive a segmented log could be).

use std::path::PathBuf;
use std::sync::Mutex;

use spate_core::{Time, WalRecordHandle};
use spate_wal::{RecordIter, WalError, WriteAheadLog};

#[derive(Debug, Default)]
pub(crate) struct MemoryWal {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    records: Vec<(Time, Vec<u8>)>,
    failing_writes: u32,
    closed: bool,
}

impl MemoryWal {
    /// A log holding `records` (written at their times).
    pub(crate) fn with_records(records: Vec<(Time, Vec<u8>)>) -> Self {
        MemoryWal { inner: Mutex::new(Inner { records, ..Inner::default() }) }
    }

    /// Makes the next `n` writes fail.
    pub(crate) fn fail_next_writes(&self, n: u32) {
        self.inner.lock().unwrap().failing_writes = n;
    }

    /// The live records with their write times.
    pub(crate) fn records(&self) -> Vec<(Time, Vec<u8>)> {
        self.inner.lock().unwrap().records.clone()
    }

    fn dir() -> PathBuf {
        PathBuf::from("memory")
    }
}

impl WriteAheadLog for MemoryWal {
    fn write(&self, record: &[u8], time: Time) -> Result<WalRecordHandle, WalError> {
        let mut inner = self.inner.lock().unwrap();
        if inner.closed {
            return Err(WalError::Closed { dir: Self::dir() });
        }
        if inner.failing_writes > 0 {
            inner.failing_writes -= 1;
            let source = std::io::Error::other("injected write failure");
            return Err(WalError::Io { op: "write", path: Self::dir(), source });
        }
        inner.records.push((time, record.to_vec()));
        let offset = inner.records.len() as u64 - 1;
        Ok(WalRecordHandle { segment: "memory".into(), offset, length: record.len() as u32 })
    }

    fn read(&self, handle: &WalRecordHandle) -> Result<Vec<u8>, WalError> {
        let inner = self.inner.lock().unwrap();
        let bad =
            || WalError::BadHandle { handle: handle.to_string(), dir: Self::dir(), reason: "no such record".into() };
        let index = usize::try_from(handle.offset).map_err(|_| bad())?;
        inner.records.get(index).map(|(_, bytes)| bytes.clone()).ok_or_else(bad)
    }

    fn read_all(&self) -> Result<RecordIter<'_>, WalError> {
        let records: Vec<_> = self.records().into_iter().map(|(_, bytes)| Ok(bytes)).collect();
        Ok(Box::new(records.into_iter()))
    }

    fn clean(&self, threshold: Time, _wait_for_completion: bool) -> Result<(), WalError> {
        self.inner.lock().unwrap().records.retain(|(time, _)| *time >= threshold);
        Ok(())
    }

    fn close(&self) -> Result<(), WalError> {
        self.inner.lock().unwrap().closed = true;
        Ok(())
    }
}
