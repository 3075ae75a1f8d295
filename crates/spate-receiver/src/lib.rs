//! Receivers and the path from a receiver to stored, durable blocks.
//!
//! A [`Receiver`] pulls records from a source that cannot replay them (a
//! socket, a generator) and stores them through its [`ReceiverContext`].
//! Around it:
//!
//! - [`ReceiverSupervisor`] runs a receiver on its own thread, restarts it
//!   with a backoff after an error and stops it cleanly, joining every task;
//! - [`BlockGenerator`] buffers records, cuts a block every block interval
//!   (on the [`spate_core::Clock`]) or earlier at a cap of records, bytes
//!   (by default well under the receiver WAL's largest record) or memory
//!   as records, encodes records as they are stored when blocks are stored
//!   serialized (so a receiver's owned records are dropped at once), queues
//!   blocks in a bounded queue (a slow store holds the receiver back) and
//!   applies a [`RateLimiter`] that backpressure can change while running;
//! - [`BlockManager`] keeps blocks by id in memory within a budget and spills
//!   memory-and-disk blocks to RocksDB, least recently used first, in an
//!   owner-only directory it made itself (it never wipes one it did not make);
//! - a [`ReceivedBlockHandler`] stores each block: in the block manager
//!   ([`BlockManagerBasedBlockHandler`]) or, with the write-ahead log on, in
//!   the block manager and the receiver WAL at once
//!   ([`WriteAheadLogBasedBlockHandler`]), returning only when the block is
//!   durable; [`read_block_from_wal`] reads it back after a crash;
//! - every stored block is described by a [`spate_core::ReceivedBlockInfo`]
//!   sent to a [`BlockInfoSink`] (the runtime connects the tracker);
//! - built-in receivers: [`SocketTextReceiver`] (lines of a TCP peer) and
//!   [`GeneratorReceiver`] (seeded random words, see [`WordGenerator`]).
//!
//! It is not the tracker (which blocks belong to which batch) nor the
//! write-ahead log itself (`spate-wal`), and it does not schedule jobs.
//!
//! ```
//! use std::sync::Arc;
//! use spate_core::{StreamId, SystemClock};
//! use spate_receiver::{
//!     BlockManager, BlockManagerBasedBlockHandler, BlockManagerSettings, GeneratorSettings, GeneratorReceiver,
//!     ReceiverState, ReceiverSupervisor, StorageLevel, SupervisorSettings, WordGenerator,
//! };
//!
//! let clock = Arc::new(SystemClock);
//! let blocks = Arc::new(BlockManager::<String>::open(BlockManagerSettings::in_memory(64 << 20), clock.clone())?);
//! let handler = Arc::new(BlockManagerBasedBlockHandler::new(blocks.clone(), StorageLevel::MEMORY_ONLY));
//! let (sink, infos) = crossbeam::channel::unbounded();
//!
//! let mut config = GeneratorSettings::new(7);
//! config.total_records = Some(10_000);
//! let supervisor = ReceiverSupervisor::start(
//!     GeneratorReceiver::new(config),
//!     SupervisorSettings::new(StreamId(0)),
//!     handler,
//!     Arc::new(sink),
//!     clock,
//! )?;
//! supervisor.wait_for_state(|s| s == ReceiverState::Finished, std::time::Duration::from_secs(60));
//! supervisor.stop()?;
//!
//! let mut received = Vec::new();
//! for info in infos.try_iter() {
//!     received.extend(blocks.get_records(info.block_id())?.map(|r| r.to_vec()).unwrap_or_default());
//! }
//! assert_eq!(received, WordGenerator::new(7).words(0, 10_000));
//! # Ok::<(), spate_receiver::ReceiverError>(())
//! ```

#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod block;
mod block_generator;
mod block_manager;
mod codec;
mod disk_store;
mod error;
mod generator;
mod handler;
mod rate_limiter;
mod signal;
mod socket;
mod storage;
mod supervisor;

pub use block::{
    BlockData, ReceivedBlock, block_payload, count_block_records, decode_block, decode_block_in_chunks, encode_block,
};
pub use block_generator::{
    BlockGenerator, BlockGeneratorListener, BlockGeneratorSettings, BlockWriter, DEFAULT_MAX_BLOCK_BYTES,
    DEFAULT_MAX_BLOCK_MEMORY, DEFAULT_MAX_BLOCK_RECORDS,
};
pub use block_manager::{BlockLocation, BlockManager, BlockManagerSettings};
pub use codec::{BLOCK_FORMAT_VERSION, Record, allocation_bytes};
pub use error::{BoxError, ReceiverError};
pub use generator::{
    GeneratorProgress, GeneratorReceiver, GeneratorSettings, MAX_KEYS, MAX_ZIPF_KEYS, VOCABULARY, Word, WordGenerator,
    check_keys, splitmix64,
};
pub use handler::{
    BlockManagerBasedBlockHandler, Pending, RECEIVER_WAL_SPARES, ReceivedBlockHandler, WalHandlerSettings,
    WriteAheadLogBasedBlockHandler, open_receiver_wal, read_block_from_wal, receiver_wal_dir, receiver_wal_options,
};
pub use rate_limiter::RateLimiter;
pub use socket::{InvalidUtf8Policy, SocketSettings, SocketStats, SocketTextReceiver};
pub use storage::StorageLevel;
pub use supervisor::{
    BlockInfoSink, FnSink, Receiver, ReceiverContext, ReceiverState, ReceiverSupervisor, SupervisorSettings,
};
