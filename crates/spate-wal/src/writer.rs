//! The write path: group commit, rolling, syncing and poisoning.
//!
//! Writers put their encoded records in a queue. Whoever finds no commit in
//! progress becomes the leader: it takes the whole queue, appends it with
//! one vectored write, passes the lead on, syncs once, and hands every
//! waiter its result. While it works, new writers queue up behind it, so
//! under load each sync covers many records, and the next commit appends
//! while this one syncs. Commits finish in the order they appended.
//!
//! Each waiter waits on a slot of its own, first yielding the processor
//! between polls (the leader is blocked in `fdatasync`, so the processor is
//! idle), then parked; the leader wakes exactly the writers it synced. On a
//! small machine, waking parked writers one after the other after every
//! sync costs about as much as the sync itself.
//!
//! After a failed append or sync the log is poisoned: the state of the
//! unsynced bytes is unknown, so it never retries and refuses every later
//! write. After a failed fence check (another writer holds the checkpoint)
//! it refuses every later write the same way. The leader checks the fence
//! under the writer lock right before it appends, and before it starts,
//! truncates or deletes a file; a stale writer that passes the check just
//! before the takeover writes only into segments named with its own epoch,
//! which the new writer reads only as far as its seal says.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::Thread;
use std::time::{Duration, Instant};

use spate_core::sync::{lock, write};
use spate_core::{Time, WalRecordHandle};

use crate::error::WalError;
use crate::file_log::Shared;
use crate::files::SegmentWriter;
use crate::header::{SEGMENT_HEADER_LEN, SegmentHeader, encode_segment_header};
use crate::record::{HEADER_LEN, MIN_DIRECT, PAGE, ZEROS, encode_frame, header_with_crc, padding_header};
use crate::segment::{Segment, SegmentId, segment_name};
use crate::settings::SyncPolicy;
use crate::takeover::check_fence;

/// The longest a new leader waits for the last commit's writers to queue
/// again; below one `fdatasync`, and only reached when writers leave.
const COLLECTION_WAIT: Duration = Duration::from_micros(100);

/// How long a waiting writer yields between polls before it parks.
const SPIN_WAIT: Duration = Duration::from_micros(250);

type WriteResult = Result<Vec<WalRecordHandle>, WalError>;

/// Records waiting for the next commit.
#[derive(Debug, Default)]
pub(crate) struct CommitQueue {
    pending: Vec<Request>,
    leader_busy: bool,
    /// Requests in the largest commit since a leader last waited in vain:
    /// the writers likely to queue again.
    last_group: usize,
}

/// One caller's records, framed, with their times, and where to tell it
/// the outcome.
#[derive(Debug)]
struct Request {
    slot: Arc<Slot>,
    records: Vec<QueuedRecord>,
}

/// A record as queued: framed whole (a copy of a caller's slice), or its
/// header beside a payload shared with the caller, so a large record is
/// appended from the caller's own buffer rather than copied first.
#[derive(Debug)]
enum QueuedRecord {
    Framed(Vec<u8>, Time),
    Shared([u8; HEADER_LEN], Arc<Vec<u8>>, Time),
}

impl QueuedRecord {
    fn time(&self) -> Time {
        match self {
            QueuedRecord::Framed(_, time) | QueuedRecord::Shared(_, _, time) => *time,
        }
    }

    /// The buffers to append, in order, and their total length.
    fn parts(&self) -> ([&[u8]; 2], u64) {
        let parts: [&[u8]; 2] = match self {
            QueuedRecord::Framed(frame, _) => [frame, &[]],
            QueuedRecord::Shared(header, payload, _) => [header, payload],
        };
        (parts, (parts[0].len() + parts[1].len()) as u64)
    }

    /// The frame's largest piece that is one buffer in memory, and where in
    /// the frame it starts: what direct I/O can write without a copy.
    fn contiguous_part(&self) -> (u64, &[u8]) {
        match self.parts().0 {
            [whole, []] => (0, whole),
            [header, payload] => (header.len() as u64, payload),
        }
    }
}

/// The padding to put before `record`'s frame when it would start at file
/// offset `at`, so that its large contiguous part lands at the same offset
/// within a page as in memory; `None` when it is small or lands so already.
fn padding_before(record: &QueuedRecord, at: u64) -> Option<Piece<'static>> {
    let (lead, part) = record.contiguous_part();
    if (part.len() as u64) < MIN_DIRECT {
        return None;
    }
    // Bytes from the part's address up to the next page boundary.
    let to_boundary = part.as_ptr().align_offset(PAGE as usize) as u64 % PAGE;
    padding_to(at + lead + to_boundary, PAGE)
}

/// Padding from file offset `at` that ends at a multiple of `page` (one
/// page further when the gap is too small for a padding header); `None`
/// when `at` is one already.
fn padding_to(at: u64, page: u64) -> Option<Piece<'static>> {
    let mut len = (page - at % page) % page;
    if len == 0 {
        return None;
    }
    if len < HEADER_LEN as u64 {
        len += page;
    }
    let zeros = len as usize - HEADER_LEN;
    Some(Piece::Padding(padding_header(zeros), zeros))
}

/// A piece of a pending append: bytes of a queued record, or padding.
enum Piece<'a> {
    Bytes(&'a [u8]),
    /// A padding header and the number of zero bytes after it.
    Padding([u8; HEADER_LEN], usize),
    /// The fields of a segment header; zeros fill the rest of its page.
    Header(SegmentHeader),
}

impl Piece<'_> {
    fn len(&self) -> u64 {
        match self {
            Piece::Bytes(bytes) => bytes.len() as u64,
            Piece::Padding(_, zeros) => (HEADER_LEN + zeros) as u64,
            Piece::Header(_) => SEGMENT_HEADER_LEN,
        }
    }

    fn slices(&self) -> [&[u8]; 2] {
        match self {
            Piece::Bytes(bytes) => [bytes, &[]],
            Piece::Padding(header, zeros) => [header, ZEROS.get(..*zeros).unwrap_or_default()],
            Piece::Header(fields) => {
                [fields, ZEROS.get(..SEGMENT_HEADER_LEN as usize - fields.len()).unwrap_or_default()]
            }
        }
    }
}

/// Where one waiting writer learns its result, or that it leads next.
#[derive(Debug)]
struct Slot {
    state: Mutex<SlotState>,
    /// Set with every change of `state`: what a spinning waiter polls.
    changed: AtomicBool,
    thread: Thread,
}

#[derive(Debug)]
enum SlotState {
    Waiting,
    /// The previous leader handed this writer the next commit.
    Lead,
    Done(WriteResult),
}

impl Slot {
    fn for_current_thread() -> Arc<Slot> {
        Arc::new(Slot {
            state: Mutex::new(SlotState::Waiting),
            changed: AtomicBool::new(false),
            thread: std::thread::current(),
        })
    }

    /// Sets the state and wakes the owner (a leader finishing its own
    /// request needs no wake-up).
    fn set(&self, state: SlotState) {
        *lock(&self.state) = state;
        self.changed.store(true, Ordering::Release);
        if self.thread.id() != std::thread::current().id() {
            self.thread.unpark();
        }
    }

    /// Waits until the state is no longer `Waiting`, and takes it: first
    /// yielding the processor between polls for about one `fdatasync`, then
    /// parked. A commit's writers write again as soon as it ends, and a
    /// parked thread takes far longer to wake than a yielding one, while
    /// the processor the spinning uses is idle anyway: the leader is
    /// blocked in the sync.
    fn wait(&self) -> SlotState {
        let spin_until = Instant::now() + SPIN_WAIT;
        loop {
            if self.changed.swap(false, Ordering::AcqRel) {
                let state = std::mem::replace(&mut *lock(&self.state), SlotState::Waiting);
                if !matches!(state, SlotState::Waiting) {
                    return state;
                }
            }
            if Instant::now() < spin_until {
                std::thread::yield_now();
            } else {
                std::thread::park();
            }
        }
    }
}

/// How far commits have finished, in the order they appended.
#[derive(Debug, Default)]
pub(crate) struct CommitOrder {
    /// The sequence number of the last finished group.
    finished: u64,
    /// Set when a group's sync failed: every later group fails too.
    failure: Option<String>,
}

/// A commit's records, appended, and what is left to do for them.
struct AppendedGroup {
    seq: u64,
    /// The file to `fdatasync` (`None` inside when it was closed after the
    /// write), unless the policy skips this sync.
    sync: Option<(Option<Arc<dyn SegmentWriter>>, std::path::PathBuf)>,
    /// The segment and length to make readable once durable.
    readable: Option<(Arc<Segment>, u64)>,
}

/// The state only the commit leader touches.
pub(crate) struct Writer {
    active: Option<Active>,
    /// Groups appended so far; the last one's sequence number.
    groups: u64,
    last_sync: Time,
    poisoned: Option<String>,
    /// Set when the fence refused an operation: the operation and why.
    fenced: Option<(&'static str, String)>,
    closed: bool,
}

/// The segment being appended to.
struct Active {
    segment: Arc<Segment>,
    /// `None` between batches when files are closed after each write.
    file: Option<Arc<dyn SegmentWriter>>,
    /// Bytes in the file, as far as this writer appended them.
    len: u64,
    /// The file is a recycled segment: past `len` it holds zeros, which
    /// sealing cuts off.
    recycled: bool,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("active", &self.active.as_ref().map(|a| &a.segment.name))
            .field("poisoned", &self.poisoned)
            .field("closed", &self.closed)
            .finish()
    }
}

impl Writer {
    pub(crate) fn new(now: Time) -> Self {
        Writer { active: None, groups: 0, last_sync: now, poisoned: None, fenced: None, closed: false }
    }

    fn refusal(&self, shared: &Shared) -> Option<WalError> {
        if self.closed {
            Some(WalError::Closed { dir: shared.dir.clone() })
        } else if let Some((op, reason)) = &self.fenced {
            Some(WalError::Fenced { dir: shared.dir.clone(), epoch: shared.epoch, op, reason: reason.clone() })
        } else {
            self.poisoned.as_ref().map(|cause| WalError::Poisoned { dir: shared.dir.clone(), cause: cause.clone() })
        }
    }

    fn needs_roll(&self, time: Time) -> bool {
        self.active.as_ref().is_none_or(|a| a.segment.end <= time)
    }
}

/// Frames waiting to be appended to the active segment.
#[derive(Default)]
struct PendingAppend<'a> {
    pieces: Vec<Piece<'a>>,
    bytes: u64,
}

impl<'a> PendingAppend<'a> {
    fn push(&mut self, piece: Piece<'a>) {
        self.bytes += piece.len();
        self.pieces.push(piece);
    }
}

impl Shared {
    /// Checks the fence before `op`; a refusal is remembered, and every
    /// later write is refused with it.
    fn fence(&self, writer: &mut Writer, op: &'static str) -> Result<(), WalError> {
        if let Some(refusal) = writer.fenced.as_ref().and(writer.refusal(self)) {
            return Err(refusal);
        }
        check_fence(&self.dir, &self.options, op).inspect_err(|e| {
            if let WalError::Fenced { reason, .. } = e {
                writer.fenced = Some((op, reason.clone()));
            }
        })
    }

    /// [`Shared::fence`] for an operation outside the commit path (cleaning).
    pub(crate) fn fence_writer(&self, op: &'static str) -> Result<(), WalError> {
        self.fence(&mut lock(&self.writer), op)
    }

    pub(crate) fn write_batch(&self, records: &[(&[u8], Time)]) -> Result<Vec<WalRecordHandle>, WalError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let mut queued = Vec::with_capacity(records.len());
        for (record, time) in records {
            self.check_size(record)?;
            queued.push(QueuedRecord::Framed(encode_frame(record), *time));
        }
        self.commit_records(queued)
    }

    /// Writes a record the caller shares rather than lends: it is appended
    /// from that buffer, without a copy.
    pub(crate) fn write_shared(
        &self,
        record: Arc<Vec<u8>>,
        crc32c: u32,
        time: Time,
    ) -> Result<WalRecordHandle, WalError> {
        self.check_size(&record)?;
        let header = header_with_crc(record.len(), crc32c);
        let handles = self.commit_records(vec![QueuedRecord::Shared(header, record, time)])?;
        self.only_handle(handles)
    }

    /// The handle of a write of one record.
    pub(crate) fn only_handle(&self, mut handles: Vec<WalRecordHandle>) -> Result<WalRecordHandle, WalError> {
        handles.pop().ok_or_else(|| WalError::BadHandle {
            handle: String::from("(none)"),
            dir: self.dir.clone(),
            reason: String::from("the writer returned no handle for the record"),
        })
    }

    fn check_size(&self, record: &[u8]) -> Result<(), WalError> {
        let max = u64::from(self.options.max_record_size);
        if record.len() as u64 > max {
            return Err(WalError::RecordTooLarge { len: record.len() as u64, max });
        }
        Ok(())
    }

    /// Queues one caller's records for the next commit and waits until they
    /// are committed, leading commits while nobody else does.
    fn commit_records(&self, queued: Vec<QueuedRecord>) -> Result<Vec<WalRecordHandle>, WalError> {
        let slot = Slot::for_current_thread();
        let mut lead = {
            let mut queue = lock(&self.queue);
            queue.pending.push(Request { slot: Arc::clone(&slot), records: queued });
            self.queued.store(queue.pending.len(), Ordering::Release);
            !std::mem::replace(&mut queue.leader_busy, true)
        };
        loop {
            if lead {
                // A leader's own request is in the batch it commits, so its
                // slot holds the result afterwards.
                self.lead();
            }
            match slot.wait() {
                SlotState::Done(result) => return result,
                SlotState::Lead => lead = true,
                SlotState::Waiting => lead = false,
            }
        }
    }

    /// Commits what is queued (after letting the last group gather), hands
    /// every request its result, and passes the lead on to a writer queued
    /// meanwhile, if any: as soon as this commit's records are appended, so
    /// the next commit appends while this one syncs.
    fn lead(&self) {
        let requests = self.take_queue(self.await_group(lock(&self.queue)));
        let mut guard = LeaderGuard {
            shared: self,
            slots: requests.iter().map(|r| Arc::clone(&r.slot)).collect(),
            lead_passed: false,
            group: None,
        };
        let results = self.commit(requests, &mut guard);
        guard.slots.clear();
        for (slot, result) in results {
            slot.set(SlotState::Done(result));
        }
    }

    /// Hands the next commit to the first queued writer, or marks the log
    /// free for the next writer to lead.
    fn pass_lead(&self, committed: usize) {
        let mut queue = lock(&self.queue);
        queue.last_group = queue.last_group.max(committed);
        match queue.pending.first() {
            Some(next) => next.slot.set(SlotState::Lead),
            None => queue.leader_busy = false,
        }
    }

    /// Lets as many writers queue as the largest recent commit had before a
    /// new leader takes the queue: they usually write again at once, so
    /// waiting for them puts their next records in this commit instead of
    /// leaving them for one more sync. The wait is bounded, since fewer
    /// writers may be left; a wait that runs out lowers the target.
    fn await_group<'q>(&'q self, mut queue: MutexGuard<'q, CommitQueue>) -> MutexGuard<'q, CommitQueue> {
        let deadline = Instant::now() + COLLECTION_WAIT;
        while queue.pending.len() < queue.last_group {
            if Instant::now() >= deadline {
                queue.last_group = queue.pending.len();
                break;
            }
            // Yield rather than park: the writers being waited for are
            // runnable and need the processor, and the wait is short. Poll
            // the count, not the lock, which the writers need to queue.
            let target = queue.last_group;
            drop(queue);
            while self.queued.load(Ordering::Acquire) < target && Instant::now() < deadline {
                std::thread::yield_now();
            }
            queue = lock(&self.queue);
        }
        queue
    }

    /// Takes every queued request.
    fn take_queue(&self, mut queue: MutexGuard<'_, CommitQueue>) -> Vec<Request> {
        self.queued.store(0, Ordering::Release);
        std::mem::take(&mut queue.pending)
    }

    /// Appends one batch, joined by whatever queued until its append, passes
    /// the lead on, then syncs by the policy; returns each request's result.
    fn commit(&self, mut batch: Vec<Request>, guard: &mut LeaderGuard<'_>) -> Vec<(Arc<Slot>, WriteResult)> {
        let mut handles = Vec::with_capacity(batch.len());
        let appended = {
            let mut writer = lock(&self.writer);
            match writer.refusal(self) {
                Some(refusal) => Err(refusal),
                None => self.append_group(&mut writer, &mut batch, &mut handles, guard),
            }
        };
        guard.lead_passed = true;
        self.pass_lead(batch.len());
        let outcome = appended.and_then(|group| self.finish_group(group, guard));
        match outcome {
            Ok(()) => batch.into_iter().map(|r| r.slot).zip(handles.into_iter().map(Ok)).collect(),
            Err(error) => {
                let mut results: Vec<_> = batch.into_iter().map(|r| (r.slot, Err(error.duplicate()))).collect();
                if let Some(first) = results.first_mut() {
                    first.1 = Err(error);
                }
                results
            }
        }
    }

    /// Appends `batch` with the requests queued since it was taken (one
    /// append, one sync: they join at no cost) and says what is left to do
    /// once the writer lock is released.
    fn append_group(
        &self,
        writer: &mut Writer,
        batch: &mut Vec<Request>,
        handles: &mut Vec<Vec<WalRecordHandle>>,
        guard: &mut LeaderGuard<'_>,
    ) -> Result<AppendedGroup, WalError> {
        let late = self.take_queue(lock(&self.queue));
        guard.slots.extend(late.iter().map(|r| Arc::clone(&r.slot)));
        batch.extend(late);
        // Checked under the writer lock, right before the bytes are written.
        self.fence(writer, "append")?;
        self.append_requests(writer, batch, handles)?;
        let (records, bytes) =
            handles.iter().flatten().fold((0u64, 0u64), |(n, b), handle| (n + 1, b + u64::from(handle.length)));
        self.metrics.appended(records, bytes);
        writer.groups += 1;
        let sync_due = self.sync_due(writer);
        let mut group = AppendedGroup { seq: writer.groups, sync: None, readable: None };
        guard.group = Some(group.seq);
        if let Some(active) = writer.active.as_mut() {
            if sync_due {
                writer.last_sync = self.options.clock.now();
                group.sync = Some((active.file.clone(), active.segment.path.clone()));
            }
            group.readable = Some((Arc::clone(&active.segment), active.len));
            if self.options.close_file_after_write {
                // A sync still to come holds its own reference to the file.
                active.file = None;
            }
        }
        Ok(group)
    }

    /// Whether this commit syncs, by the policy.
    fn sync_due(&self, writer: &Writer) -> bool {
        match self.options.sync_policy {
            SyncPolicy::EveryWrite => true,
            SyncPolicy::Interval(interval) => self.options.clock.now() >= writer.last_sync + interval,
            SyncPolicy::Never => false,
        }
    }

    /// Syncs an appended group (outside the writer lock), then, once every
    /// earlier group has finished, makes its records readable. A group
    /// fails if its sync or any earlier one failed: the error of a failed
    /// `fdatasync` is reported to one caller only, and the pages it lost
    /// may hold this group's bytes too.
    fn finish_group(&self, group: AppendedGroup, guard: &mut LeaderGuard<'_>) -> Result<(), WalError> {
        let syncing = std::time::Instant::now();
        let synced = match &group.sync {
            Some((Some(file), path)) => file.sync_data().map_err(|e| (path.clone(), e)),
            // Closed after its last write: reopen just to sync.
            Some((None, path)) => self
                .files
                .open_append(path, false, None)
                .and_then(|(file, _)| file.sync_data())
                .map_err(|e| (path.clone(), e)),
            None => Ok(()),
        };
        if group.sync.is_some() && synced.is_ok() {
            self.metrics.synced(syncing.elapsed());
        }
        let mut order = self.await_turn(group.seq);
        let result = match (synced, &order.failure) {
            (_, Some(cause)) => Err(WalError::Poisoned { dir: self.dir.clone(), cause: cause.clone() }),
            (Err((path, e)), None) => {
                let mut writer = lock(&self.writer);
                let error = self.poison(&mut writer, "fdatasync", path, e);
                order.failure = writer.poisoned.clone();
                Err(error)
            }
            (Ok(()), None) => {
                if let Some((segment, len)) = &group.readable {
                    if group.sync.is_some() {
                        segment.extend_synced_len(*len);
                    }
                    segment.extend_readable_len(*len);
                }
                Ok(())
            }
        };
        order.finished = group.seq;
        guard.group = None;
        self.group_finished.notify_all();
        result
    }

    /// Waits until every group appended before `seq` has finished.
    fn await_turn(&self, seq: u64) -> MutexGuard<'_, CommitOrder> {
        let mut order = lock(&self.order);
        while order.finished + 1 < seq {
            order = self.group_finished.wait(order).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        order
    }

    /// Appends the requests' frames, rolling segments as their times require.
    fn append_requests(
        &self,
        writer: &mut Writer,
        requests: &[Request],
        handles: &mut Vec<Vec<WalRecordHandle>>,
    ) -> Result<(), WalError> {
        let mut pending = PendingAppend::default();
        for request in requests {
            let mut request_handles = Vec::with_capacity(request.records.len());
            for record in &request.records {
                let time = record.time();
                if writer.needs_roll(time) {
                    self.flush(writer, &mut pending)?;
                    self.seal_active(writer)?;
                    self.start_segment(writer, time)?;
                    // An empty file (new, recycled, or cut to nothing by
                    // recovery) starts with the header, in the same append
                    // as its first records; one with records keeps its
                    // layout (a segment from before headers stays without).
                    if writer.active.as_ref().is_some_and(|a| a.len == 0) {
                        pending.push(Piece::Header(encode_segment_header(self.epoch)));
                    }
                }
                let active = self.ensure_open(writer)?;
                if self.options.direct_io
                    && cfg!(target_os = "linux")
                    && let Some(padding) = padding_before(record, active.len + pending.bytes)
                {
                    pending.push(padding);
                }
                let (parts, len) = record.parts();
                request_handles.push(WalRecordHandle {
                    segment: active.segment.name.clone(),
                    offset: active.len + pending.bytes,
                    // Bounded by the maximum record size, which `open` keeps below u32::MAX.
                    length: u32::try_from(len).unwrap_or(u32::MAX),
                });
                for part in parts {
                    pending.push(Piece::Bytes(part));
                }
            }
            handles.push(request_handles);
        }
        self.flush(writer, &mut pending)
    }

    /// Appends the pending frames to the active segment.
    fn flush(&self, writer: &mut Writer, pending: &mut PendingAppend<'_>) -> Result<(), WalError> {
        if pending.pieces.is_empty() {
            return Ok(());
        }
        if let Some(Active { len, .. }) = writer.active.as_ref()
            && let Some(padding) = self.end_padding(*len + pending.bytes, pending.bytes)
        {
            pending.push(padding);
        }
        let bufs: Vec<&[u8]> = pending.pieces.iter().flat_map(Piece::slices).collect();
        let result = match writer.active.as_mut() {
            Some(Active { file: Some(file), segment, len, .. }) => {
                file.append(&bufs).map(|()| *len += pending.bytes).map_err(|e| (segment.path.clone(), e))
            }
            // Frames are only queued after `ensure_open`, so this is unreachable.
            _ => return Err(WalError::Closed { dir: self.dir.clone() }),
        };
        drop(bufs);
        pending.pieces.clear();
        pending.bytes = 0;
        result.map_err(|(path, e)| self.poison(writer, "append", path, e))
    }

    /// The padding that ends a large append of a direct-I/O log, at file
    /// offset `end`, on a page boundary: the append is then whole pages,
    /// all written directly, and the next one starts on a fresh page.
    fn end_padding(&self, end: u64, bytes: u64) -> Option<Piece<'static>> {
        if !self.options.direct_io || !cfg!(target_os = "linux") || bytes < MIN_DIRECT {
            return None;
        }
        padding_to(end, PAGE)
    }

    /// `fdatasync`s the active segment unless a finished sync covered all of it.
    fn sync_active(&self, writer: &mut Writer) -> Result<(), WalError> {
        let Some(active) = writer.active.as_mut() else {
            return Ok(());
        };
        if active.segment.synced_len() >= active.len {
            return Ok(());
        }
        let path = active.segment.path.clone();
        let syncing = std::time::Instant::now();
        let result = match active.file.as_ref() {
            Some(file) => file.sync_data(),
            // Closed after the last batch: reopen just to sync.
            None => self.files.open_append(&path, false, None).and_then(|(file, _)| file.sync_data()),
        };
        match result {
            Ok(()) => {
                self.metrics.synced(syncing.elapsed());
                active.segment.extend_synced_len(active.len);
                writer.last_sync = self.options.clock.now();
                Ok(())
            }
            Err(e) => Err(self.poison(writer, "fdatasync", path, e)),
        }
    }

    /// Finishes the active segment before a new one starts: synced (unless
    /// the policy is never to sync), readable to its end, no longer active.
    fn seal_active(&self, writer: &mut Writer) -> Result<(), WalError> {
        if self.options.sync_policy != SyncPolicy::Never {
            self.sync_active(writer)?;
        }
        if let Some(active) = writer.active.take() {
            active.segment.extend_readable_len(active.len);
            active.segment.set_active(false);
            self.cut_recycled_tail(writer, &active)?;
        }
        Ok(())
    }

    /// Cuts the zeros after the records of a recycled segment, so that a
    /// finished segment ends where its last record does, as a new one does.
    /// A failure poisons the log: left in a segment that is not the last,
    /// the zeros would read as damage.
    fn cut_recycled_tail(&self, writer: &mut Writer, active: &Active) -> Result<(), WalError> {
        if !active.recycled {
            return Ok(());
        }
        self.fence(writer, "truncate")?;
        let path = &active.segment.path;
        let file_len = match self.files.len(path) {
            Ok(len) => len,
            Err(e) => return Err(self.poison(writer, "stat", path.clone(), e)),
        };
        if file_len > active.len
            && let Err(e) = self.files.truncate(path, active.len)
        {
            return Err(self.poison(writer, "truncate", path.clone(), e));
        }
        Ok(())
    }

    /// Starts the segment for records at `time`: `[time, time + rolling interval)`.
    fn start_segment(&self, writer: &mut Writer, time: Time) -> Result<(), WalError> {
        self.fence(writer, "roll")?;
        // Named with this writer's epoch: it never appends to a segment of
        // another epoch, even one of the same time range.
        let name = segment_name(time, time + self.options.rolling_interval, self.epoch);
        let path = self.dir.join(&name);
        // A segment of that name may be live already (a restart writing at a
        // time seen before); then the writer appends to it.
        let existing = write(&self.segments).iter().find(|s| s.name == name).cloned();
        let recycled = existing.is_none() && self.spares.take_as(self.files.as_ref(), &path);
        let at = recycled.then_some(0);
        let (file, len) =
            self.files.open_append(&path, self.options.direct_io, at).map_err(WalError::io("open", &path))?;
        let segment = match existing {
            Some(segment) => segment,
            None => {
                // The new file's directory entry must be durable before any
                // record in it is acknowledged.
                if self.options.sync_policy != SyncPolicy::Never
                    && let Err(e) = self.files.sync_dir(&self.dir)
                {
                    return Err(self.poison(writer, "fsync directory", self.dir.clone(), e));
                }
                let id = SegmentId { start: time, end: time + self.options.rolling_interval, epoch: self.epoch };
                let segment = Arc::new(Segment::new(name, path, id, len));
                let mut segments = write(&self.segments);
                let at = segments.partition_point(|s| s.sort_key() < segment.sort_key());
                segments.insert(at, Arc::clone(&segment));
                segment
            }
        };
        segment.set_active(true);
        tracing::debug!(segment = %segment.path.display(), "started segment");
        writer.active = Some(Active { segment, file: Some(file), len, recycled });
        Ok(())
    }

    /// The active segment, with its file open.
    fn ensure_open<'w>(&self, writer: &'w mut Writer) -> Result<&'w mut Active, WalError> {
        let Some(active) = writer.active.as_mut() else {
            return Err(WalError::Closed { dir: self.dir.clone() });
        };
        if active.file.is_none() {
            let path = &active.segment.path;
            let at = Some(active.len);
            let (file, len) =
                self.files.open_append(path, self.options.direct_io, at).map_err(WalError::io("open", path))?;
            active.file = Some(file);
            active.len = len;
        }
        Ok(active)
    }

    /// Marks the log poisoned after a failed append or sync and returns the error.
    fn poison(&self, writer: &mut Writer, op: &'static str, path: std::path::PathBuf, e: std::io::Error) -> WalError {
        let cause = format!("{op} {}: {e}", path.display());
        tracing::error!(dir = %self.dir.display(), %cause, "write-ahead log poisoned; every later write fails");
        writer.poisoned = Some(cause);
        if let Some(active) = writer.active.as_mut() {
            active.file = None;
        }
        WalError::Io { op, path, source: e }
    }

    /// Syncs the active segment now and makes its records readable.
    pub(crate) fn sync_now(&self) -> Result<(), WalError> {
        let mut writer = lock(&self.writer);
        if let Some(refusal) = writer.refusal(self) {
            return Err(refusal);
        }
        self.sync_active(&mut writer)?;
        if let Some(active) = writer.active.as_ref() {
            active.segment.extend_readable_len(active.len);
        }
        Ok(())
    }

    /// Syncs (unless the policy is never to) and closes the active segment;
    /// every later write fails with [`WalError::Closed`].
    pub(crate) fn close_writer(&self) -> Result<(), WalError> {
        let mut writer = lock(&self.writer);
        if writer.closed {
            return Ok(());
        }
        let result = if writer.poisoned.is_none() && self.options.sync_policy != SyncPolicy::Never {
            self.sync_active(&mut writer)
        } else {
            Ok(())
        };
        if let Some(active) = writer.active.take() {
            let cut = if writer.poisoned.is_none() { self.cut_recycled_tail(&mut writer, &active) } else { Ok(()) };
            active.segment.set_active(false);
            writer.closed = true;
            return result.and(cut);
        }
        writer.closed = true;
        result
    }
}

/// Hands every waiter of a batch an error if the leader unwinds mid-commit,
/// passes the lead on and finishes its group in order, so that nobody
/// waits forever.
struct LeaderGuard<'a> {
    shared: &'a Shared,
    slots: Vec<Arc<Slot>>,
    lead_passed: bool,
    /// The group appended and not yet finished.
    group: Option<u64>,
}

impl Drop for LeaderGuard<'_> {
    fn drop(&mut self) {
        if self.slots.is_empty() {
            return;
        }
        let cause = String::from("a write panicked during a commit");
        lock(&self.shared.writer).poisoned = Some(cause.clone());
        if !self.lead_passed {
            self.shared.pass_lead(0);
        }
        if let Some(seq) = self.group.take() {
            let mut order = self.shared.await_turn(seq);
            order.failure.get_or_insert_with(|| cause.clone());
            order.finished = seq;
            self.shared.group_finished.notify_all();
        }
        for slot in self.slots.drain(..) {
            let error = WalError::Poisoned { dir: self.shared.dir.clone(), cause: cause.clone() };
            slot.set(SlotState::Done(Err(error)));
        }
    }
}
