//! The vocabulary every spate crate shares.
//!
//! spate-core holds what the rest of the engine agrees on and nothing else:
//!
//! - time: [`Time`] and [`Duration`] in whole milliseconds (batch times are
//!   multiples of the batch interval);
//! - identity: [`BatchId`], [`StreamId`], [`StreamBlockId`];
//! - the [`Clock`] every time-based behaviour goes through, with a
//!   [`ManualClock`] for tests that must not sleep;
//! - the record frame, [`FrameCodec`]: magic, format version, length,
//!   CRC32C and a bincode payload, whose decoder refuses malformed input
//!   with a clear [`CoreError`] and never allocates past a configured bound;
//! - the [`WriterFence`] that storage layers below the log store check
//!   before each change, with the writer's epoch to stamp into what they write;
//! - records read in place ([`InPlace`], [`Views`]): borrowed views of
//!   an encoded block's records, without an allocation per record;
//! - the [`MemoryBudget`] the inputs of a process share, which makes a
//!   source that outruns the engine wait instead of filling memory;
//! - the block descriptions that pass from receivers to the tracker
//!   ([`ReceivedBlockInfo`], [`BlockStoreResult`], [`WalRecordHandle`]);
//! - [`sync`]: the one way the engine takes a lock, ignoring poison.
//!
//! It is not a place for I/O: nothing here touches a file or a socket.
//!
//! ```
//! use spate_core::{BatchId, Duration, FrameCodec, Time};
//!
//! let interval = Duration::from_secs(1);
//! assert_eq!(Time::from_millis(2_345).floor(interval), Time::from_millis(2_000));
//!
//! let codec = FrameCodec::new(1);
//! let bytes = codec.encode(&(BatchId(7), "words".to_string()))?;
//! let frame = codec.decode::<(BatchId, String)>(&bytes)?;
//! assert_eq!(frame.value.0, BatchId(7));
//! # Ok::<(), spate_core::CoreError>(())
//! ```

#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod block;
mod clock;
mod crc;
mod error;
mod fence;
mod frame;
mod frame_stream;
mod ids;
mod in_place;
mod memory;
pub mod shared_str;
pub mod sync;
mod time;

pub use block::{BlockStoreResult, ReceivedBlockInfo, WalRecordHandle};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::CoreError;
pub use fence::{Unfenced, WriterFence};
pub use frame::{FRAME_HEADER_LEN, FRAME_MAGIC, Frame, FrameCodec, PayloadChunks, PayloadSink, RawFrame, SeekWrite};
pub use frame_stream::{PayloadStream, ReadSeek};
pub use ids::{BatchId, StreamBlockId, StreamId};
pub use in_place::{InPlace, PayloadReader, Views, varint_len, write_varint};
pub use memory::{MemoryBudget, Reservation};
pub use time::{Duration, Time};
