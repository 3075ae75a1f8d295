//! The socket receiver: connects to a TCP peer and stores each line of text
//! it sends as one record (Spark's `socketTextStream`).
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
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
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

    /// Turns one line's bytes (terminator removed) into a record.
    fn decode(&self, bytes: Vec<u8>, line: u64, byte_offset: u64) -> Result<String, ReceiverError> {
        match String::from_utf8(bytes) {
            Ok(text) => Ok(text),
            Err(e) if self.config.invalid_utf8 == InvalidUtf8Policy::Replace => {
                self.stats.replaced.fetch_add(1, Ordering::Relaxed);
                Ok(String::from_utf8_lossy(e.as_bytes()).into_owned())
            }
            Err(e) => Err(ReceiverError::InvalidUtf8 {
                peer: self.config.address.clone(),
                line,
                byte_offset,
                reason: e.utf8_error().to_string(),
            }),
        }
    }

    fn store_batch(&self, ctx: &ReceiverContext<String>, batch: &mut Vec<String>) -> Result<(), ReceiverError> {
        if batch.is_empty() {
            return Ok(());
        }
        let n = batch.len() as u64;
        ctx.store_many(std::mem::take(batch))?;
        self.stats.lines.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }
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
        let (mut line_no, mut offset) = (0u64, 0u64);
        let mut batch = Vec::with_capacity(self.config.batch_lines.max(1));
        let limit = self.config.max_line_bytes as u64 + 2; // room for "\r\n"
        loop {
            let mut bytes = Vec::new();
            let n = (&mut reader).take(limit).read_until(b'\n', &mut bytes).await.map_err(|e| io_err("read", e))?;
            line_no += 1;
            if bytes.last() == Some(&b'\n') {
                bytes.pop();
                if bytes.last() == Some(&b'\r') {
                    bytes.pop();
                }
            } else if n as u64 == limit {
                self.store_batch(&ctx, &mut batch)?;
                return Err(ReceiverError::LineTooLong { peer, line: line_no, max: self.config.max_line_bytes });
            } else {
                // End of stream: store what is complete, drop a partial line.
                self.store_batch(&ctx, &mut batch)?;
                if n > 0 {
                    self.stats.dropped_partial.fetch_add(1, Ordering::Relaxed);
                    warn!(%peer, line = line_no, bytes = n, "peer disconnected mid-line; the partial line is dropped");
                }
                return Err(ReceiverError::SourceClosed { source_name: peer });
            }
            if bytes.len() > self.config.max_line_bytes {
                self.store_batch(&ctx, &mut batch)?;
                return Err(ReceiverError::LineTooLong { peer, line: line_no, max: self.config.max_line_bytes });
            }
            let decoded = self.decode(bytes, line_no, offset);
            offset += n as u64;
            match decoded {
                Ok(line) => batch.push(line),
                Err(e) => {
                    self.store_batch(&ctx, &mut batch)?;
                    return Err(e);
                }
            }
            // Hand lines over before waiting for more, so none linger here.
            if batch.len() >= self.config.batch_lines || reader.buffer().is_empty() {
                self.store_batch(&ctx, &mut batch)?;
            }
        }
    }
}
