//! Crash test: a child process receives generated words with the WAL on and
//! prints each block's WAL handle once `store` returned; the parent kills it
//! with SIGKILL mid-stream, reopens the WAL and reads back every
//! acknowledged block, which must be exactly the generated sequence.
//!
//! Runs without the libtest harness: the same binary is the parent and,
//! with `SPATE_RECEIVER_CRASH_CHILD` set, the child.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use spate_core::{StreamId, SystemClock, WalRecordHandle};
use spate_receiver::{
    BlockManager, BlockManagerConfig, FnSink, GeneratorConfig, GeneratorReceiver, ReceiverSupervisor, StorageLevel,
    SupervisorConfig, WalHandlerConfig, WordGenerator, WriteAheadLogBasedBlockHandler, open_receiver_wal,
    read_block_from_wal, receiver_wal_options,
};
use spate_wal::{WalOptions, WriteAheadLog};

const CHILD_ENV: &str = "SPATE_RECEIVER_CRASH_CHILD";
const STREAM: StreamId = StreamId(4);
const SEED: u64 = 5;
const ACKS_BEFORE_KILL: usize = 25;

fn main() {
    match std::env::var(CHILD_ENV) {
        Ok(dir) => child(Path::new(&dir)),
        Err(_) => {
            parent();
            println!("test crash::killed_receiver_loses_no_acknowledged_block ... ok");
        }
    }
}

/// Receives until killed, printing `ACK <segment> <offset> <length> <records>`
/// for every block after it is durable.
fn child(checkpoint: &Path) {
    let clock = Arc::new(SystemClock);
    let blocks =
        Arc::new(BlockManager::<String>::open(BlockManagerConfig::in_memory(512 << 20), clock.clone()).unwrap());
    // As the runtime opens the receiver WAL: direct I/O (on a file system
    // without it, appends are buffered and the test is the same).
    let wal = open_receiver_wal(checkpoint, STREAM, receiver_wal_options()).unwrap();
    let handler = WriteAheadLogBasedBlockHandler::new(
        blocks,
        wal,
        STREAM,
        StorageLevel::MEMORY_AND_DISK_SER_2,
        WalHandlerConfig::default(),
        clock.clone(),
    )
    .unwrap();
    let sink = FnSink(|info: spate_core::ReceivedBlockInfo| {
        let handle = info.wal_handle().ok_or("no WAL handle")?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "ACK {} {} {} {}", handle.segment, handle.offset, handle.length, info.num_records.unwrap_or(0))?;
        out.flush()?;
        Ok(())
    });
    let mut generator = GeneratorConfig::new(SEED);
    generator.records_per_sec = Some(200_000);
    generator.batch_size = 500;
    generator.flush_every = Some(5_000);
    let mut config = SupervisorConfig::new(STREAM);
    config.block_generator.block_interval = spate_core::Duration::from_millis(20);
    let _supervisor =
        ReceiverSupervisor::start(GeneratorReceiver::new(generator), config, Arc::new(handler), Arc::new(sink), clock)
            .unwrap();
    // Until the parent kills this process.
    loop {
        std::thread::park();
    }
}

fn parent() {
    let checkpoint = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(CHILD_ENV, checkpoint.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut acked: Vec<(WalRecordHandle, u64)> = Vec::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while acked.len() < ACKS_BEFORE_KILL {
        let line = lines.next().expect("child ended early").unwrap();
        let fields: Vec<&str> = line.split(' ').collect();
        if let ["ACK", segment, offset, length, records] = fields.as_slice() {
            let handle = WalRecordHandle {
                segment: (*segment).to_string(),
                offset: offset.parse().unwrap(),
                length: length.parse().unwrap(),
            };
            acked.push((handle, records.parse().unwrap()));
        }
    }
    child.kill().unwrap(); // SIGKILL: no destructor, no close, no flush
    child.wait().unwrap();

    let wal = open_receiver_wal(checkpoint.path(), STREAM, WalOptions::default()).unwrap();
    let mut received: Vec<String> = Vec::new();
    for (handle, records) in &acked {
        let block: Vec<String> = read_block_from_wal(wal.as_ref(), STREAM, handle).unwrap();
        assert_eq!(block.len() as u64, *records, "block at {handle}");
        received.extend(block);
    }
    assert!(received.len() >= 5_000, "only {} records acknowledged", received.len());
    assert_eq!(received, WordGenerator::new(SEED).words(0, received.len()), "acknowledged blocks are the sequence");
    // The log as a whole reads cleanly after the crash (a torn tail is cut off).
    let records_in_log = wal.read_all().unwrap().count();
    assert!(records_in_log >= acked.len(), "{records_in_log} records for {} acknowledged", acked.len());
}
