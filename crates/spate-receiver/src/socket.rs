//! The socket receiver: connects to a TCP peer and stores each line of text
//! it sends as one record (Spark's `socketTextStream`).
//!
//! Lines are written into the block in place, straight from the read
//! buffer (`ReceiverContext::store_in_place_with`): no `String` is made for
//! a line, and a line is copied once, into the block's bytes.
//!
//! Policies, as tested:
//! - a line ends at `\n`; a `\r` before it is dropped;
//! - bytes that are not UTF-8 are replaced with U+FFFD by default (what
//!   Spark's `InputStreamReader` does) or fail the run with
//!   [`ReceiverError::InvalidUtf8`] naming the line and byte offset;
//! - a line longer than the maximum fails the run ([`ReceiverError::LineTooLong`])
//!   rather than growing a buffer without bound;
//! - when the peer disconnects in the middle of a line, that partial line is
//!   dropped (it may be cut short) and counted; the run then ends with
//!   [`ReceiverError::SourceClosed`], so the supervisor reconnects after its
//!   backoff, as Spark's receiver restarts.
//!
//! A plain socket cannot replay what it sent, so this receiver is not
//! reliable: lines buffered when the process dies are lost, WAL or not.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tracing::{info, warn};

use crate::error::ReceiverError;
use crate::storage::StorageLevel;
use crate::supervisor::{Receiver, ReceiverContext};

/// What to do with a line that is not valid UTF-8.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InvalidUtf8Policy {
    /// Replace each invalid sequence with U+FFFD and keep the line.
    #[default]
    Replace,
    /// Fail the run with [`ReceiverError::InvalidUtf8`].
    Fail,
}

/// How a [`SocketTextReceiver`] connects and reads.
#[derive(Clone, Debug)]
pub struct SocketSettings {
    /// The peer, `host:port`.
    pub address: String,
    /// What to do with invalid UTF-8.
    pub invalid_utf8: InvalidUtf8Policy,
    /// The longest line accepted, in bytes (without its terminator).
    pub max_line_bytes: usize,
    /// Lines handed to the block generator at once, at most.
    pub batch_lines: usize,
    /// The level the runtime should store the blocks at.
    pub storage_level: StorageLevel,
}

impl SocketSettings {
    /// Defaults for `address`: replace invalid UTF-8, lines up to 1 MiB.
    pub fn new(address: impl Into<String>) -> Self {
        SocketSettings {
            address: address.into(),
            invalid_utf8: InvalidUtf8Policy::Replace,
            max_line_bytes: 1 << 20,
            batch_lines: 4096,
            storage_level: StorageLevel::default(),
        }
    }
}

/// Counters of a [`SocketTextReceiver`], readable while it runs.
#[derive(Debug, Default)]
pub struct SocketStats {
    lines: AtomicU64,
    replaced: AtomicU64,
    dropped_partial: AtomicU64,
    connections: AtomicU64,
}

impl SocketStats {
    /// Lines stored.
    pub fn lines(&self) -> u64 {
        self.lines.load(Ordering::Acquire)
    }

    /// Lines stored with invalid UTF-8 replaced.
    pub fn replaced_lines(&self) -> u64 {
        self.replaced.load(Ordering::Acquire)
    }

    /// Partial lines dropped because the peer disconnected mid-line.
    pub fn dropped_partial_lines(&self) -> u64 {
        self.dropped_partial.load(Ordering::Acquire)
    }

    /// Connections made.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Acquire)
    }
}

/// Stores each line a TCP peer sends; see the module documentation.
#[derive(Debug)]
pub struct SocketTextReceiver {
    config: SocketSettings,
    stats: Arc<SocketStats>,
}

impl SocketTextReceiver {
    /// A receiver for `config`.
    pub fn new(config: SocketSettings) -> Self {
        SocketTextReceiver { config, stats: Arc::default() }
    }

    /// Its counters.
    pub fn stats(&self) -> Arc<SocketStats> {
        Arc::clone(&self.stats)
    }

    /// Stores the lines of one read, `buffer`: first the line carried over
    /// from earlier reads when this read ends it, then every complete line
    /// of the buffer; the bytes after the last line end are carried over.
    fn take_lines(
        &self,
        ctx: &ReceiverContext<String>,
        state: &mut LineReader,
        buffer: &[u8],
    ) -> Result<(), ReceiverError> {
        let mut rest = buffer;
        if !state.carried.is_empty() {
            let Some(end) = rest.iter().position(|b| *b == b'\n') else {
                state.carried.extend_from_slice(rest);
                return self.check_carried(state);
            };
            state.carried.extend_from_slice(&rest[..=end]);
            rest = &rest[end + 1..];
            let carried = std::mem::take(&mut state.carried);
            let stored = self.store_complete_lines(ctx, state, &carried);
            // Its buffer is kept for the next line carried over.
            state.carried = carried;
            state.carried.clear();
            stored?;
        }
        let consumed = self.store_complete_lines(ctx, state, rest)?;
        state.carried.extend_from_slice(&rest[consumed..]);
        self.check_carried(state)
    }

    /// A line begun and not ended may not pass the maximum either (one
    /// byte more is allowed: a `\r` that the line end will drop).
    fn check_carried(&self, state: &LineReader) -> Result<(), ReceiverError> {
        if state.carried.len() > self.config.max_line_bytes + 1 {
            return Err(self.line_too_long(state.lines + 1));
        }
        Ok(())
    }

    fn line_too_long(&self, line: u64) -> ReceiverError {
        ReceiverError::LineTooLong { peer: self.config.address.clone(), line, max: self.config.max_line_bytes }
    }

    /// Stores the complete lines at the start of `bytes` and returns the
    /// bytes they took (up to and with the last line end). A line longer
    /// than the maximum is the error, after the lines before it are stored.
    fn store_complete_lines(
        &self,
        ctx: &ReceiverContext<String>,
        state: &mut LineReader,
        bytes: &[u8],
    ) -> Result<usize, ReceiverError> {
        let mut spans = std::mem::take(&mut state.spans);
        spans.clear();
        let (mut start, mut too_long) = (0, None);
        for end in bytes.iter().enumerate().filter(|(_, b)| **b == b'\n').map(|(i, _)| i) {
            let content_end = if end > start && bytes[end - 1] == b'\r' { end - 1 } else { end };
            state.lines += 1;
            if content_end - start > self.config.max_line_bytes {
                too_long = Some(state.lines);
                break;
            }
            spans.push(Span { start, end: content_end, line: state.lines, offset: state.offset });
            state.offset += (end + 1 - start) as u64;
            start = end + 1;
        }
        let stored = self.store_lines(ctx, bytes, &spans);
        state.spans = spans;
        stored?;
        match too_long {
            Some(line) => Err(self.line_too_long(line)),
            None => Ok(start),
        }
    }

    /// Stores the lines `spans` of `bytes` (all of them, or those before
    /// the first that is not UTF-8 under [`InvalidUtf8Policy::Fail`], which
    /// is then the error), written in place into the block, `batch_lines`
    /// at a time: no `String` is made for a line.
    fn store_lines(&self, ctx: &ReceiverContext<String>, bytes: &[u8], spans: &[Span]) -> Result<(), ReceiverError> {
        let line_bytes = |span: &Span| bytes.get(span.start..span.end).unwrap_or_default();
        let mut valid = spans.len();
        let mut failure = None;
        for (index, span) in spans.iter().enumerate() {
            if let Err(e) = std::str::from_utf8(line_bytes(span)) {
                if self.config.invalid_utf8 == InvalidUtf8Policy::Fail {
                    (valid, failure) = (index, Some((*span, e)));
                    break;
                }
                self.stats.replaced.fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut lines = spans[..valid].iter();
        for group in spans[..valid].chunks(self.config.batch_lines.max(1)) {
            ctx.store_in_place_with(group.len(), |block, n| {
                for span in lines.by_ref().take(n) {
                    // Borrowed unless the line is not UTF-8 (then replaced).
                    block.push(&String::from_utf8_lossy(line_bytes(span)));
                }
            })?;
            self.stats.lines.fetch_add(group.len() as u64, Ordering::Relaxed);
        }
        match failure {
            None => Ok(()),
            Some((span, e)) => Err(ReceiverError::InvalidUtf8 {
                peer: self.config.address.clone(),
                line: span.line,
                byte_offset: span.offset,
                reason: e.to_string(),
            }),
        }
    }
}

/// One complete line of a read: its bytes (terminator removed), its
/// number on the connection (from 1) and the byte offset it starts at.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: usize,
    end: usize,
    line: u64,
    offset: u64,
}

/// Where the reading of one connection is.
#[derive(Debug, Default)]
struct LineReader {
    /// The start of a line whose end has not been read yet.
    carried: Vec<u8>,
    /// Lines ended so far.
    lines: u64,
    /// The byte offset of the next line's start.
    offset: u64,
    /// The lines of the current read, kept from read to read.
    spans: Vec<Span>,
}

#[async_trait]
impl Receiver<String> for SocketTextReceiver {
    fn name(&self) -> String {
        format!("socket({})", self.config.address)
    }

    fn storage_level(&self) -> StorageLevel {
        self.config.storage_level
    }

    async fn run(&mut self, ctx: ReceiverContext<String>) -> Result<(), ReceiverError> {
        let peer = self.config.address.clone();
        let io_err = |op, source| ReceiverError::Socket { peer: peer.clone(), op, source };
        let stream = TcpStream::connect(&peer).await.map_err(|e| io_err("connect", e))?;
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        info!(%peer, "connected");
        let mut reader = BufReader::with_capacity(64 << 10, stream);
        let mut state = LineReader::default();
        loop {
            let buffer = reader.fill_buf().await.map_err(|e| io_err("read", e))?;
            if buffer.is_empty() {
                // End of stream: what was complete is stored; drop a partial line.
                if !state.carried.is_empty() {
                    self.stats.dropped_partial.fetch_add(1, Ordering::Relaxed);
                    let (line, bytes) = (state.lines + 1, state.carried.len());
                    warn!(%peer, line, bytes, "peer disconnected mid-line; the partial line is dropped");
                }
                return Err(ReceiverError::SourceClosed { source_name: peer });
            }
            // Every line of this read is handed over before waiting for more.
            let (read, taken) = (buffer.len(), self.take_lines(&ctx, &mut state, buffer));
            reader.consume(read);
            taken?;
        }
    }
}
