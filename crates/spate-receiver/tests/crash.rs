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
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use spate_core::{StreamId, SystemClock, WalRecordHandle};
use spate_receiver::{
    BlockManager, BlockManagerSettings, FnSink, GeneratorReceiver, GeneratorSettings, ReceiverSupervisor, StorageLevel,
    SupervisorSettings, WalHandlerSettings, WordGenerator, WriteAheadLogBasedBlockHandler, open_receiver_wal,
    read_block_from_wal, receiver_wal_options,
};
use spate_wal::{WalSettings, WriteAheadLog};

const CHILD_ENV: &str = "SPATE_RECEIVER_CRASH_CHILD";
const STREAM: StreamId = StreamId(4);
const SEED: u64 = 5;
const ACKS_BEFORE_KILL: usize = 25;

/// Set for a parent that fails (panics) while its child runs.
const FAILING_PARENT_ENV: &str = "SPATE_RECEIVER_CRASH_FAILING_PARENT";

fn main() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(Path::new(&dir));
    } else if std::env::var_os(FAILING_PARENT_ENV).is_some() {
        failing_parent();
    } else {
        parent();
        println!("test crash::killed_receiver_loses_no_acknowledged_block ... ok");
        a_failed_parent_leaves_no_child_running();
        println!("test crash::a_failed_parent_leaves_no_child_running ... ok");
    }
}

/// Starts the child receiving into `checkpoint`, its output piped.
fn spawn_child(checkpoint: &Path) -> ChildGuard {
    ChildGuard(
        Command::new(std::env::current_exe().unwrap())
            .env(CHILD_ENV, checkpoint)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// Receives until killed, printing `ACK <segment> <offset> <length> <records>`
/// for every block after it is durable.
fn child(checkpoint: &Path) {
    let clock = Arc::new(SystemClock);
    let blocks =
        Arc::new(BlockManager::<String>::open(BlockManagerSettings::in_memory(512 << 20), clock.clone()).unwrap());
    // As the runtime opens the receiver WAL: direct I/O (on a file system
    // without it, appends are buffered and the test is the same).
    let wal = open_receiver_wal(checkpoint, STREAM, receiver_wal_options()).unwrap();
    let handler = WriteAheadLogBasedBlockHandler::new(
        blocks,
        wal,
        STREAM,
        StorageLevel::MEMORY_AND_DISK_SER_2,
        WalHandlerSettings::default(),
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
    let mut generator = GeneratorSettings::new(SEED);
    generator.records_per_sec = Some(200_000);
    generator.batch_size = 500;
    generator.flush_every = Some(5_000);
    let mut config = SupervisorSettings::new(STREAM);
    config.block_generator.block_interval = spate_core::Duration::from_millis(20);
    let _supervisor =
        ReceiverSupervisor::start(GeneratorReceiver::new(generator), config, Arc::new(handler), Arc::new(sink), clock)
            .unwrap();
    // Until the parent kills this process.
    loop {
        std::thread::park();
    }
}

/// The child process, killed and reaped when dropped: also when the parent
/// fails (panics) before it killed the child itself, so no receiver is left
/// running behind a failed test.
struct ChildGuard(Child);

impl ChildGuard {
    /// Kills the child (SIGKILL) and waits for it.
    fn kill(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.0.kill()?;
        self.0.wait()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // Already reaped when the parent killed it: nothing left to do then.
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn parent() {
    let checkpoint = tempfile::tempdir().unwrap();
    let mut child = spawn_child(checkpoint.path());
    let mut acked: Vec<(WalRecordHandle, u64)> = Vec::new();
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
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

    let wal = open_receiver_wal(checkpoint.path(), STREAM, WalSettings::default()).unwrap();
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

/// A parent that fails while its child receives: prints the child's pid
/// once the child acknowledged a block, then panics.
fn failing_parent() {
    let checkpoint = tempfile::tempdir().unwrap();
    let mut child = spawn_child(checkpoint.path());
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let first = lines.next().expect("the child acknowledged nothing").unwrap();
    assert!(first.starts_with("ACK "), "{first}");
    println!("CHILD {}", child.0.id());
    std::io::stdout().flush().unwrap();
    panic!("the parent fails while its child runs");
}

/// Runs a failing parent and checks that its child did not outlive it.
fn a_failed_parent_leaves_no_child_running() {
    let out = Command::new(std::env::current_exe().unwrap())
        .env(FAILING_PARENT_ENV, "1")
        .stdout(Stdio::piped())
        // The child would inherit a piped stderr and hold it open.
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "the failing parent succeeded");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let pid: u32 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("CHILD "))
        .unwrap_or_else(|| panic!("no child pid in {stdout:?}"))
        .parse()
        .unwrap();
    // Reaped by the failed parent's guard, the child has no /proc entry left
    // (not even a zombie's).
    let alive = Path::new(&format!("/proc/{pid}")).exists();
    if alive {
        // End the leaked receiver before failing.
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    }
    assert!(!alive, "the child {pid} of a failed parent is still running");
}
