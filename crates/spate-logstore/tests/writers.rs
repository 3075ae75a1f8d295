//! One writer per checkpoint, with real processes: a live holder refuses a
//! second writer, a killed holder's lock is taken over with the next epoch,
//! a stale writer can never write, and racing `add`s of one id have exactly
//! one winner.
//!
//! The child processes are this test binary run again with a filter that
//! selects `child_process_helper` and an environment variable saying what
//! to do; without the variable that test does nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Arc, Barrier};

use serde_json::json;
use spate_core::{BatchId, WriterFence};
use spate_logstore::{
    Checkpoint, CheckpointSettings, CommitMetadata, FaultPoint, FaultyFileManager, LocalFileManager, LogStoreError,
    OffsetLog, OffsetSeq, SourceOffset,
};

const CHILD_ENV: &str = "SPATE_LOGSTORE_TEST_CHILD";

fn entry(writer: u64) -> OffsetSeq {
    OffsetSeq { sources: vec![SourceOffset::new("events", Some(json!({"writer": writer})))], ..OffsetSeq::default() }
}

/// Runs in a child process only. `hold <dir>`: take the lock, report the
/// epoch, block until stdin closes. `add <dir> <writer>`: wait for the go
/// line, add batch 0, report whether it won.
#[test]
fn child_process_helper() {
    let Ok(task) = std::env::var(CHILD_ENV) else { return };
    let parts: Vec<&str> = task.split('\t').collect();
    let mut line = String::new();
    match parts.as_slice() {
        ["hold", dir] => {
            let checkpoint = Checkpoint::open_for_write(dir, CheckpointSettings::new()).unwrap();
            report(&format!("LOCKED {}", checkpoint.epoch().unwrap()));
            // Hold the lock until the parent kills this process (or closes stdin).
            std::io::stdin().read_line(&mut line).unwrap();
        }
        ["add", dir, writer] => {
            let log = OffsetLog::open(Arc::new(LocalFileManager), Path::new(dir)).unwrap();
            report("READY");
            std::io::stdin().read_line(&mut line).unwrap();
            let won = log.add(BatchId(0), &entry(writer.parse().unwrap())).unwrap();
            report(&format!("ADDED {won}"));
        }
        other => panic!("unknown child task {other:?}"),
    }
}

/// Writes a line for the parent to the real stdout (the test harness
/// captures `println!`, not direct writes to the handle).
fn report(line: &str) {
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{line}").unwrap();
    stdout.flush().unwrap();
}

fn spawn_child(task: &str) -> (Child, BufReader<ChildStdout>) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["--exact", "child_process_helper", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, task)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    (child, stdout)
}

/// What follows `prefix` on the first line of `stdout` that has it.
fn wait_for(stdout: &mut BufReader<ChildStdout>, prefix: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "child ended before printing {prefix}");
        // The harness may have printed `test child_process_helper ... ` on the same line.
        if let Some(at) = line.find(prefix) {
            return line[at + prefix.len()..].trim().to_string();
        }
    }
}

#[test]
fn live_holder_refuses_a_second_writer_and_a_killed_one_is_taken_over() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ck");
    let (mut child, mut stdout) = spawn_child(&format!("hold\t{}", dir.display()));
    let child_epoch: u64 = wait_for(&mut stdout, "LOCKED ").parse().unwrap();

    let err = Checkpoint::open_for_write(&dir, CheckpointSettings::new()).unwrap_err();
    let message = err.to_string();
    match &err {
        LogStoreError::Locked { holder: Some(holder), .. } => {
            assert_eq!(holder.pid, child.id());
            assert_eq!(holder.epoch, child_epoch);
        }
        other => panic!("expected Locked, got {other:?}"),
    }
    assert!(message.contains(&format!("pid {}", child.id())) && message.contains("since"), "{message}");

    child.kill().unwrap();
    child.wait().unwrap();
    let checkpoint = Checkpoint::open_for_write(&dir, CheckpointSettings::new()).unwrap();
    assert_eq!(checkpoint.epoch(), Some(child_epoch + 1));
    assert_eq!(checkpoint.writer().map(|w| w.pid), Some(std::process::id()));
    assert!(checkpoint.commits().add(BatchId(0), &CommitMetadata::default()).is_ok());
}

#[test]
fn racing_processes_add_the_same_id_and_exactly_one_wins() {
    let root = tempfile::tempdir().unwrap();
    let mut children: Vec<_> =
        (0..4).map(|writer| spawn_child(&format!("add\t{}\t{writer}", root.path().display()))).collect();
    for (_, stdout) in &mut children {
        wait_for(stdout, "READY");
    }
    for (child, _) in &mut children {
        child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    }
    let results: Vec<bool> = children
        .iter_mut()
        .map(|(child, stdout)| {
            let won = wait_for(stdout, "ADDED ") == "true";
            assert!(child.wait().unwrap().success());
            won
        })
        .collect();
    assert_eq!(results.iter().filter(|won| **won).count(), 1, "{results:?}");
    let winner = results.iter().position(|won| *won).unwrap() as u64;
    let log = OffsetLog::open(Arc::new(LocalFileManager), root.path()).unwrap();
    assert_eq!(log.get(BatchId(0)).unwrap(), Some(entry(winner)));
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 1, "losers leave no temp file");
}

#[test]
fn racing_threads_add_the_same_id_and_exactly_one_wins() {
    for round in 0..20u64 {
        let root = tempfile::tempdir().unwrap();
        let log = OffsetLog::open(Arc::new(LocalFileManager), root.path()).unwrap();
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8u64)
            .map(|writer| {
                let (log, barrier) = (log.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    log.add(BatchId(round), &entry(writer)).unwrap()
                })
            })
            .collect();
        let results: Vec<bool> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|won| **won).count(), 1, "round {round}: {results:?}");
        let winner = results.iter().position(|won| *won).unwrap() as u64;
        assert_eq!(log.get(BatchId(round)).unwrap(), Some(entry(winner)));
    }
}

#[test]
fn a_stale_writer_cannot_append() {
    let root = tempfile::tempdir().unwrap();
    let old = Checkpoint::open_for_write(root.path(), CheckpointSettings::new()).unwrap();
    old.offsets().add(BatchId(0), &entry(0)).unwrap();
    // The old writer loses its lock without noticing (the lock file is removed,
    // as a careless clean-up or a shared file system without locks would do),
    // and a second writer takes the checkpoint.
    std::fs::remove_file(root.path().join("LOCK")).unwrap();
    let new = Checkpoint::open_for_write(root.path(), CheckpointSettings::new()).unwrap();
    let (old_epoch, new_epoch) = (old.epoch().unwrap(), new.epoch().unwrap());
    assert_ne!(old_epoch, new_epoch);

    for attempt in [old.offsets().add(BatchId(1), &entry(1)), old.commits().add(BatchId(0), &CommitMetadata::default())]
    {
        let err = attempt.unwrap_err();
        assert!(matches!(err, LogStoreError::StaleEpoch { ours, .. } if ours == old_epoch), "{err:?}");
        let message = err.to_string();
        assert!(message.contains(&format!("our epoch is {old_epoch}")), "{message}");
        assert!(message.contains(&format!("epoch {new_epoch}")), "{message}");
    }
    assert!(old.replace_file("graph", b"old").is_err());
    assert!(old.purge_old_batches().is_err());
    assert_eq!(new.offsets().ids().unwrap(), vec![BatchId(0)], "the stale writer wrote nothing");
    assert!(new.offsets().add(BatchId(1), &entry(1)).unwrap());
}

/// A second writer that takes `dir` over while the first one is in the
/// middle of a write (the first one's lock file is deleted under it).
fn take_over(dir: &Path, slot: &Arc<std::sync::Mutex<Option<Checkpoint>>>) -> impl FnOnce() + Send + 'static {
    let (dir, slot) = (dir.to_path_buf(), slot.clone());
    move || {
        std::fs::remove_file(dir.join("LOCK")).unwrap();
        let new = Checkpoint::open_for_write(&dir, CheckpointSettings::new()).unwrap();
        *slot.lock().unwrap() = Some(new);
    }
}

fn faulty_checkpoint(dir: &Path) -> (Checkpoint, Arc<FaultyFileManager>) {
    let faulty = Arc::new(FaultyFileManager::new());
    let ck = Checkpoint::open_for_write(dir, CheckpointSettings::new().with_file_manager(faulty.clone())).unwrap();
    (ck, faulty)
}

#[test]
fn the_epoch_fence_is_a_writer_fence_for_the_layers_below() {
    let root = tempfile::tempdir().unwrap();
    let old = Checkpoint::open_for_write(root.path(), CheckpointSettings::new()).unwrap();
    let fence: Arc<dyn WriterFence> = old.fence().unwrap();
    assert_eq!(fence.epoch(), old.epoch().unwrap());
    fence.check().unwrap();
    std::fs::remove_file(root.path().join("LOCK")).unwrap();
    let new = Checkpoint::open_for_write(root.path(), CheckpointSettings::new()).unwrap();
    let reason = fence.check().unwrap_err();
    assert!(reason.contains(&format!("our epoch is {}", old.epoch().unwrap())), "{reason}");
    assert!(reason.contains(&format!("epoch {}", new.epoch().unwrap())), "{reason}");
    let read_only = Checkpoint::open_read_only(root.path(), CheckpointSettings::new()).unwrap();
    assert!(read_only.fence().is_none());
}

/// One kind of write a checkpoint makes.
type CheckpointWrite = fn(&Checkpoint) -> spate_logstore::Result<()>;

#[test]
fn a_takeover_during_a_write_stops_it_before_its_name_appears() {
    // The takeover lands after the write's first fence check, while its temp file is written.
    let writes: [(&str, CheckpointWrite); 4] = [
        ("offsets/1", |ck| ck.offsets().add(BatchId(1), &entry(1)).map(drop)),
        ("commits/0", |ck| ck.commits().add(BatchId(0), &CommitMetadata::default()).map(drop)),
        ("state/op/0", |ck| ck.write_file("state/op/0", b"old")),
        ("graph", |ck| ck.replace_file("graph", b"old")),
    ];
    for (file, write) in writes {
        let root = tempfile::tempdir().unwrap();
        let (old, faulty) = faulty_checkpoint(root.path());
        old.offsets().add(BatchId(0), &entry(0)).unwrap();
        let new = Arc::new(std::sync::Mutex::new(None));
        faulty.on(FaultPoint::AfterTempWrite, take_over(root.path(), &new));
        let err = write(&old).unwrap_err();
        assert!(matches!(err, LogStoreError::StaleEpoch { .. }), "{file}: {err:?}");
        assert!(new.lock().unwrap().is_some(), "{file}: the takeover ran");
        assert!(!root.path().join(file).exists(), "{file}: the stale writer's file appeared");
        let temp_left = std::fs::read_dir(root.path().join(file).parent().unwrap())
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".tmp"));
        assert!(!temp_left, "{file}: the stopped write left its temp file");
    }
}

#[test]
fn a_graph_replaced_in_the_window_the_fence_cannot_close_is_detected() {
    // In a subdirectory: a new writer's start removes the temp files at the top
    // of the checkpoint, which would make the stale rename fail instead.
    const GRAPH: &str = "meta/graph";
    let root = tempfile::tempdir().unwrap();
    let (old, faulty) = faulty_checkpoint(root.path());
    old.replace_file(GRAPH, b"old 1").unwrap();
    let new_slot = Arc::new(std::sync::Mutex::new(None));
    // The takeover, and the new writer's own graph, land after the old writer's
    // last check and before its rename: the rename then puts the stale bytes in place.
    let (dir, slot) = (root.path().to_path_buf(), new_slot.clone());
    faulty.on(FaultPoint::Rename, move || {
        take_over(&dir, &slot)();
        slot.lock().unwrap().as_ref().unwrap().replace_file(GRAPH, b"new").unwrap();
    });
    let err = old.replace_file(GRAPH, b"old 2").unwrap_err();
    assert!(matches!(err, LogStoreError::StaleEpoch { .. }), "the stale writer is told after its rename: {err:?}");
    let new = new_slot.lock().unwrap().take().unwrap();
    let err = new.read_file(GRAPH).unwrap_err();
    assert!(
        matches!(err, LogStoreError::Overwritten { ours, found, .. } if ours == new.epoch().unwrap() && found == old.epoch().unwrap()),
        "the new writer must not take the stale bytes for its own: {err:?}"
    );
    assert!(err.to_string().contains("graph"), "{err}");
    // Writing its graph again puts it back.
    new.replace_file(GRAPH, b"new again").unwrap();
    assert_eq!(new.read_file(GRAPH).unwrap(), Some(b"new again".to_vec()));
}

#[test]
fn a_file_replaced_by_a_newer_writer_is_never_replaced_by_an_older_one() {
    let root = tempfile::tempdir().unwrap();
    let old = Checkpoint::open_for_write(root.path(), CheckpointSettings::new()).unwrap();
    old.replace_file("graph", b"old").unwrap();
    std::fs::remove_file(root.path().join("LOCK")).unwrap();
    let new = Checkpoint::open_for_write(root.path(), CheckpointSettings::new()).unwrap();
    new.replace_file("graph", b"new").unwrap();
    // Even if the lock file said otherwise (a shared file system serving an old copy),
    // the graph itself says a newer writer wrote it.
    let lock = root.path().join("LOCK");
    let newer_lock = std::fs::read(&lock).unwrap();
    let holder = spate_logstore::read_lock_holder(root.path()).unwrap();
    let old_lock = spate_logstore::LockHolder { epoch: old.epoch().unwrap(), ..holder };
    std::fs::write(&lock, serde_json::to_vec(&old_lock).unwrap()).unwrap();
    let err = old.replace_file("graph", b"stale").unwrap_err();
    assert!(matches!(err, LogStoreError::StaleEpoch { .. }), "{err:?}");
    assert!(err.to_string().contains("graph was written by epoch"), "{err}");
    assert!(matches!(old.read_file("graph"), Err(LogStoreError::StaleEpoch { .. })));
    assert!(matches!(old.open_file("graph"), Err(LogStoreError::StaleEpoch { .. })));
    std::fs::write(&lock, newer_lock).unwrap();
    assert_eq!(new.read_file("graph").unwrap(), Some(b"new".to_vec()));
}

#[test]
fn a_stale_writer_stops_purging_and_deleting() {
    let root = tempfile::tempdir().unwrap();
    let old = Checkpoint::open_for_write(root.path(), CheckpointSettings::new()).unwrap();
    for id in 0..3 {
        old.offsets().add(BatchId(id), &entry(id)).unwrap();
    }
    old.write_file("state/op/0", b"s").unwrap();
    std::fs::remove_file(root.path().join("LOCK")).unwrap();
    let _new = Checkpoint::open_for_write(root.path(), CheckpointSettings::new()).unwrap();
    assert!(matches!(old.offsets().purge(BatchId(3)), Err(LogStoreError::StaleEpoch { .. })));
    assert!(matches!(old.delete_file("state/op/0"), Err(LogStoreError::StaleEpoch { .. })));
    assert_eq!(old.offsets().ids().unwrap().len(), 3);
    assert!(root.path().join("state/op/0").exists());
}
