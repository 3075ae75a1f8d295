//! An in-memory [`WriteAheadLog`] test double: records in a vector, writes
//! that can be made to fail or to panic, and cleaning at single-record
//! granularity (the most aggressive a segmented log could be).

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, Sender};

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
    /// The next write says it started, waits for a release, then panics.
    panicking_write: Option<(Sender<()>, Receiver<()>)>,
    /// The next write says it started and waits for a release, then writes.
    held_write: Option<(Sender<()>, Receiver<()>)>,
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

    /// Makes the next write send on `entered`, wait for `release` (or its
    /// sender's drop) and then panic, as a bug inside the log would.
    pub(crate) fn panic_in_next_write(&self, entered: Sender<()>, release: Receiver<()>) {
        self.inner.lock().unwrap().panicking_write = Some((entered, release));
    }

    /// Makes the next write send on `entered` and wait for `release` (or
    /// its sender's drop) before it writes.
    pub(crate) fn hold_next_write(&self, entered: Sender<()>, release: Receiver<()>) {
        self.inner.lock().unwrap().held_write = Some((entered, release));
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
        let (held, panicking) = {
            let mut inner = self.inner.lock().unwrap();
            (inner.held_write.take(), inner.panicking_write.take())
        };
        if let Some((entered, release)) = held {
            let _ = entered.send(());
            let _ = release.recv();
        }
        if let Some((entered, release)) = panicking {
            let _ = entered.send(());
            let _ = release.recv();
            panic!("injected panic inside the event log's write");
        }
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
