//! The read paths: one record by handle, every record in order, and the
//! scan of the last segment that repairs a torn tail on open.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

use spate_core::WalRecordHandle;

use crate::error::WalError;
use crate::file_log::Shared;
use crate::files::FileLayer;
use crate::header::{RecordsStart, SEGMENT_HEADER_LEN, read_segment_header};
use crate::record::{BadRecord, HEADER_LEN, RecordScanner, Step, decode_header, read_payload};
use crate::segment::{Segment, parse_segment_name};
use crate::settings::WalSettings;

/// Read buffer of the sequential readers: large enough that a scan runs at
/// memory speed, small enough to keep one per open iterator.
const SCAN_BUFFER: usize = 256 * 1024;

/// Reads the record behind `handle` and checks both of its checksums.
pub(crate) fn read_record(shared: &Shared, handle: &WalRecordHandle) -> Result<Vec<u8>, WalError> {
    let bad_handle =
        |reason: String| WalError::BadHandle { handle: handle.to_string(), dir: shared.dir.clone(), reason };
    let Some(id) = parse_segment_name(&handle.segment) else {
        return Err(bad_handle(String::from("not a segment file name of this log")));
    };
    let max = u64::from(shared.options.max_record_size);
    let payload_len = match u64::from(handle.length).checked_sub(HEADER_LEN as u64) {
        Some(len) if len <= max => len,
        _ => return Err(bad_handle(format!("length must be {HEADER_LEN}..={} bytes", max + HEADER_LEN as u64))),
    };
    let path = shared.dir.join(&handle.segment);
    let mut file = match shared.files.open_read(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(bad_handle(String::from("the segment does not exist (cleaned?)")));
        }
        Err(e) => return Err(WalError::Io { op: "open", path, source: e }),
    };
    let file_len = file.metadata().map_err(WalError::io("stat", &path))?.len();
    match read_segment_header(&mut file, &path, id.epoch, file_len, shared.options.salvage)? {
        RecordsStart::At(start) if handle.offset >= start => {}
        RecordsStart::At(_) => return Err(bad_handle(String::from("inside the segment header"))),
        RecordsStart::TornHeader => {
            return Err(bad_handle(String::from("the segment ends inside its header: it holds no records")));
        }
    }
    let corrupt =
        |path: &PathBuf, reason: String| WalError::Corrupt { segment: path.clone(), offset: handle.offset, reason };
    let mut header_bytes = [0u8; HEADER_LEN];
    match read_exact_at(&mut file, handle.offset, &mut header_bytes) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(bad_handle(String::from("past the end of the segment")));
        }
        Err(e) => return Err(WalError::Io { op: "read", path, source: e }),
    }
    let Some(header) = decode_header(&header_bytes) else {
        return Err(corrupt(&path, BadRecord::HeaderChecksum.to_string()));
    };
    if header.padding {
        return Err(corrupt(&path, String::from("the handle points at padding, not at a record")));
    }
    if u64::from(header.len) != payload_len {
        let reason = format!("the record holds {} bytes but the handle says {payload_len}", header.len);
        return Err(corrupt(&path, reason));
    }
    // Allocated only after the length passed both the maximum and the header check.
    let payload = match read_payload(&mut file, header.len) {
        Ok(payload) => payload,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            let reason = format!("record truncated: the segment ends inside its {} bytes", handle.length);
            return Err(corrupt(&path, reason));
        }
        Err(e) => return Err(WalError::Io { op: "read", path, source: e }),
    };
    let computed = crc32c::crc32c(&payload);
    if computed != header.payload_crc {
        return Err(corrupt(&path, BadRecord::PayloadChecksum { stored: header.payload_crc, computed }.to_string()));
    }
    Ok(payload)
}

fn read_exact_at(file: &mut File, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(buf)
}

/// Every record of a snapshot of the live segments, read lazily.
///
/// The snapshot holds each segment's readable length at the time of
/// `read_all`, so records acknowledged later are not seen. A segment that
/// cleaning deleted before it was opened is skipped; one deleted while it is
/// open stays readable through the open file.
pub(crate) struct AllRecords {
    files: Arc<dyn FileLayer>,
    max_record_size: u32,
    salvage: bool,
    pending: VecDeque<(Arc<Segment>, u64)>,
    current: Option<(Arc<Segment>, RecordScanner<BufReader<File>>)>,
    done: bool,
}

impl AllRecords {
    pub(crate) fn new(shared: &Shared, snapshot: Vec<(Arc<Segment>, u64)>) -> Self {
        AllRecords {
            files: Arc::clone(&shared.files),
            max_record_size: shared.options.max_record_size,
            salvage: shared.options.salvage,
            pending: snapshot.into(),
            current: None,
            done: false,
        }
    }

    /// Opens the next segment of the snapshot; `Ok(false)` when there is none.
    fn open_next(&mut self) -> Result<bool, WalError> {
        while let Some((segment, len)) = self.pending.pop_front() {
            if len == 0 {
                continue;
            }
            match self.files.open_read(&segment.path) {
                Ok(mut file) => {
                    let start = match read_segment_header(&mut file, &segment.path, segment.epoch, len, self.salvage)? {
                        RecordsStart::At(start) => start,
                        RecordsStart::TornHeader if self.salvage => {
                            tracing::warn!(segment = %segment.path.display(), len,
                                "salvage: skipping a segment that ends inside its header");
                            continue;
                        }
                        RecordsStart::TornHeader => {
                            let reason = format!(
                                "the segment ends inside its {SEGMENT_HEADER_LEN}-byte header, and it is not a torn tail"
                            );
                            return Err(WalError::Corrupt { segment: segment.path.clone(), offset: 0, reason });
                        }
                    };
                    let reader = BufReader::with_capacity(SCAN_BUFFER, file);
                    let mut scanner = RecordScanner::new(reader, len, self.max_record_size);
                    scanner.seek(start);
                    self.current = Some((segment, scanner));
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    tracing::debug!(segment = %segment.path.display(), "segment cleaned before it was read; skipping");
                }
                Err(e) => return Err(WalError::Io { op: "open", path: segment.path.clone(), source: e }),
            }
        }
        Ok(false)
    }

    /// The next record of the current segment, `None` at its end.
    fn next_in_current(&mut self) -> Option<Result<Vec<u8>, WalError>> {
        let (segment, scanner) = self.current.as_mut()?;
        loop {
            let read_error = |e| WalError::Io { op: "read", path: segment.path.clone(), source: e };
            match scanner.next_step() {
                Ok(Step::Record { payload, .. }) => return Some(Ok(payload)),
                Ok(Step::End) => return None,
                Ok(Step::Bad { offset, problem }) if self.salvage => match scanner.resync(offset) {
                    Ok(Some(next)) => {
                        warn_skipped(segment, offset, next, &problem);
                        scanner.seek(next);
                    }
                    Ok(None) => {
                        warn_skipped(segment, offset, scanner.end(), &problem);
                        return None;
                    }
                    Err(e) => return Some(Err(read_error(e))),
                },
                Ok(Step::Bad { offset, problem }) => {
                    let segment = segment.path.clone();
                    return Some(Err(WalError::Corrupt { segment, offset, reason: problem.to_string() }));
                }
                Err(e) => return Some(Err(read_error(e))),
            }
        }
    }
}

fn warn_skipped(segment: &Segment, offset: u64, next: u64, problem: &BadRecord) {
    tracing::warn!(
        segment = %segment.path.display(),
        offset,
        resumed_at = next,
        %problem,
        "salvage: skipping a damaged record; its data is lost"
    );
}

impl Iterator for AllRecords {
    type Item = Result<Vec<u8>, WalError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            if self.current.is_none() {
                match self.open_next() {
                    Ok(true) => {}
                    Ok(false) => self.done = true,
                    Err(e) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
                continue;
            }
            match self.next_in_current() {
                Some(Ok(record)) => return Some(Ok(record)),
                Some(Err(e)) => {
                    // An error ends the iteration: what follows a corrupt
                    // record cannot be trusted to be in order.
                    self.done = true;
                    return Some(Err(e));
                }
                None => self.current = None,
            }
        }
        None
    }
}

/// Scans the first `len` bytes of a segment and returns the length of its
/// valid records. A bad record with no good record after it is a torn
/// write that was never acknowledged: the valid length ends before it. A
/// bad record followed by good ones is damage: an error, or with salvage
/// a warning and a skip.
pub(crate) fn valid_len(
    files: &dyn FileLayer,
    segment: &Segment,
    len: u64,
    options: &WalSettings,
) -> Result<u64, WalError> {
    let path = &segment.path;
    let mut file = files.open_read(path).map_err(WalError::io("open", path))?;
    let start = match read_segment_header(&mut file, path, segment.epoch, len, options.salvage)? {
        RecordsStart::At(start) => start,
        RecordsStart::TornHeader => {
            tracing::warn!(segment = %path.display(), dropped_bytes = len,
                "the segment ends inside its header: its creation was cut short (no record was acknowledged)");
            return Ok(0);
        }
    };
    let reader = BufReader::with_capacity(SCAN_BUFFER, file);
    let mut scanner = RecordScanner::new(reader, len, options.max_record_size);
    scanner.seek(start);
    let mut records = 0u64;
    loop {
        let step = scanner.next_step().map_err(WalError::io("read", path))?;
        let (offset, problem) = match step {
            Step::Record { .. } => {
                records += 1;
                continue;
            }
            Step::End => break,
            Step::Bad { offset, problem } => (offset, problem),
        };
        let next =
            if problem.is_truncation() { None } else { scanner.resync(offset).map_err(WalError::io("read", path))? };
        match next {
            None => {
                tracing::warn!(segment = %path.display(), offset, dropped_bytes = len - offset, %problem,
                    "a torn record ends the segment (it was never acknowledged)");
                return Ok(offset);
            }
            Some(next) if options.salvage => {
                warn_skipped(segment, offset, next, &problem);
                scanner.seek(next);
            }
            Some(next) => {
                let reason = format!("{problem}; a good record follows at byte {next}, so this is not a torn tail");
                return Err(WalError::Corrupt { segment: path.clone(), offset, reason });
            }
        }
    }
    tracing::debug!(segment = %path.display(), records, "scanned segment");
    Ok(len)
}
