//! The `spate` binary as a user runs it: real processes, real signals,
//! SIGKILL inside batches, panics, two writers on one checkpoint, a damaged
//! checkpoint repaired, and a Spark checkpoint inspected. Where a signal or
//! a kill must land inside a batch, a failpoint (`SPATE_FAILPOINTS`) holds
//! the process there and the test waits for it, never for time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use spate_runtime::demo::{BatchCounts, TopWords, verify_output};

const SPATE: &str = env!("CARGO_BIN_EXE_spate");

fn spate(args: &[&str]) -> Output {
    Command::new(SPATE).args(args).env_remove("RUST_LOG").output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}

const SEED: u64 = 7;

/// Fast demo flags: 20 ms batches, 20 000 words a second.
fn demo_args<'a>(checkpoint: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["demo", "--checkpoint", checkpoint, "--batch-ms", "20", "--rate", "20000", "--seed", "7"];
    args.extend_from_slice(extra);
    args
}

fn spawn_demo(checkpoint: &str, extra: &[&str]) -> Child {
    Command::new(SPATE)
        .args(demo_args(checkpoint, extra))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn inspect_json(checkpoint: &Path) -> Value {
    let output = spate(&["checkpoint", "inspect", path_str(checkpoint), "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The batch output files of a demo run, by batch id.
fn batch_counts(output: &Path) -> BTreeMap<u64, BatchCounts> {
    read_outputs(output, "batch-")
        .into_iter()
        .map(|(id, bytes)| (id, serde_json::from_slice(&bytes).unwrap()))
        .collect()
}

fn read_outputs(output: &Path, prefix: &str) -> BTreeMap<u64, Vec<u8>> {
    std::fs::read_dir(output)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let id = name.strip_prefix(prefix)?.strip_suffix(".json")?.parse().ok()?;
            Some((id, std::fs::read(e.path()).unwrap()))
        })
        .collect()
}

/// Each window's top words equal those recomputed from the batch files of
/// the batches inside it (by batch time: the 30 intervals ending at its time).
fn check_windows(output: &Path, batch_ms: i64) -> usize {
    let batches = batch_counts(output);
    let windows = read_outputs(output, "window-");
    for (id, bytes) in &windows {
        let top: TopWords = serde_json::from_slice(bytes).unwrap();
        let end = top.batch_time.as_millis();
        let mut totals: BTreeMap<String, u64> = BTreeMap::new();
        for batch in batches
            .values()
            .filter(|b| b.batch_time.as_millis() > end - 30 * batch_ms && b.batch_time.as_millis() <= end)
        {
            for (word, n) in &batch.counts {
                *totals.entry(word.clone()).or_default() += n;
            }
        }
        let mut expected: Vec<(String, u64)> = totals.into_iter().collect();
        expected.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        expected.truncate(top.words.len());
        assert_eq!(top.words, expected, "window {id}");
    }
    windows.len()
}

/// The lines of `--window-files` under `root` as a reader takes them (files
/// under `dt=…` whose names start with neither `_` nor `.`): each window's
/// counts by its end, with no word twice in a window.
fn window_file_counts(root: &Path) -> BTreeMap<i64, BTreeMap<String, u64>> {
    let mut windows: BTreeMap<i64, BTreeMap<String, u64>> = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            if name.starts_with('_') || name.starts_with('.') {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let partition = path.parent().unwrap().strip_prefix(root).unwrap().to_str().unwrap().to_string();
            assert!(partition.starts_with("dt=") && partition.contains("/hour="), "{}", path.display());
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let value: Value = serde_json::from_str(line).unwrap();
                let end = value["window_end_ms"].as_i64().unwrap();
                let word = value["word"].as_str().unwrap().to_string();
                let count = value["count"].as_u64().unwrap();
                assert!(windows.entry(end).or_default().insert(word.clone(), count).is_none(), "{word} twice at {end}");
            }
        }
    }
    windows
}

/// The counts of each window (by its end) recomputed from the batch files
/// of the batches inside it, for every window the demo closed.
fn window_counts_from_batches(output: &Path, batch_ms: i64) -> BTreeMap<i64, BTreeMap<String, u64>> {
    let batches = batch_counts(output);
    let mut windows = BTreeMap::new();
    for bytes in read_outputs(output, "window-").values() {
        let top: TopWords = serde_json::from_slice(bytes).unwrap();
        let end = top.batch_time.as_millis();
        let mut totals: BTreeMap<String, u64> = BTreeMap::new();
        for batch in batches
            .values()
            .filter(|b| b.batch_time.as_millis() > end - 30 * batch_ms && b.batch_time.as_millis() <= end)
        {
            for (word, n) in &batch.counts {
                *totals.entry(word.clone()).or_default() += n;
            }
        }
        if !totals.is_empty() {
            windows.insert(end, totals);
        }
    }
    windows
}

#[test]
fn window_files_hold_every_window_once_across_kills_after_its_outputs() {
    let root = tempfile::tempdir().unwrap();
    let checkpoint = root.path().join("ck");
    let ck = path_str(&checkpoint);
    let files = root.path().join("windows");
    let extra = ["--quiet", "--window-files", path_str(&files)];
    // Killed twice once a batch's outputs ran (its files published), before its commit:
    // on consecutive batches, so one of them closes a window (every second batch does).
    let mut next = 3;
    for _ in 0..2 {
        let mut held = spawn_with_failpoint(ck, &extra, "hold-in-batch", next);
        let batch = held.wait_held();
        held.child.kill().unwrap();
        held.child.wait().unwrap();
        assert_eq!(logged_and_committed(&checkpoint, batch), (true, false));
        next = batch + 1;
    }
    // Enough batches after the restart for several windows with words in
    // them, however slowly a loaded machine starts the receiver again.
    let until = (next + 40).to_string();
    let finish = spate(&demo_args(ck, &[&extra[..], &["--until-batch", &until]].concat()));
    assert_eq!(finish.status.code(), Some(0), "{}", text(&finish.stderr));
    assert!(
        text(&finish.stdout).contains(&format!("window counts in {}", files.display())),
        "{}",
        text(&finish.stdout)
    );

    let written = window_file_counts(&files);
    let expected = window_counts_from_batches(&checkpoint.join("output"), 20);
    assert!(expected.len() >= 3, "{} windows", expected.len());
    assert_eq!(written, expected);
    assert_eq!(std::fs::read_dir(files.join("_staging")).map_or(0, |d| d.count()), 0);
}

/// A small xorshift generator: the failpoints and batches the kill test
/// stops at vary with the seed, which is printed.
struct Moments(u64);

impl Moments {
    fn below(&mut self, high: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % high
    }
}

/// How long a test waits for something the process must do before it
/// gives up and fails (generous: a loaded machine is slow, never wrong).
const GIVE_UP: Duration = Duration::from_secs(120);

/// A demo process held by a failpoint (`SPATE_FAILPOINTS`, see
/// spate-runtime's failpoints) inside a batch, with its stderr lines.
struct Held {
    child: Child,
    failpoint_dir: tempfile::TempDir,
    stderr: std::sync::mpsc::Receiver<String>,
}

/// Starts the demo with `failpoint` armed for the first batch from `from_batch` on.
fn spawn_with_failpoint(checkpoint: &str, extra: &[&str], failpoint: &str, from_batch: u64) -> Held {
    let failpoint_dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(SPATE)
        .args(demo_args(checkpoint, extra))
        .env_remove("RUST_LOG")
        .env("SPATE_FAILPOINTS", failpoint)
        .env("SPATE_FAILPOINT_DIR", failpoint_dir.path())
        .env("SPATE_FAILPOINT_BATCH", from_batch.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, stderr) = std::sync::mpsc::channel();
    let pipe = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Held { child, failpoint_dir, stderr }
}

impl Held {
    /// Waits until the process holds inside a batch; returns the batch.
    fn wait_held(&mut self) -> u64 {
        let marker = self.failpoint_dir.path().join("held");
        let deadline = Instant::now() + GIVE_UP;
        loop {
            if let Ok(text) = std::fs::read_to_string(&marker)
                && let Ok(batch) = text.trim().parse()
            {
                return batch;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the process ended ({status}) before its failpoint held it");
            }
            assert!(Instant::now() < deadline, "the failpoint never held the process");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until the process wrote a stderr line containing `text`.
    fn wait_stderr(&self, text: &str) {
        let deadline = Instant::now() + GIVE_UP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) if line.contains(text) => return,
                Ok(_) => {}
                Err(e) => panic!("no stderr line with {text:?}: {e}"),
            }
        }
    }

    fn release(&self) {
        std::fs::write(self.failpoint_dir.path().join("release"), b"").unwrap();
    }

    fn signal(&self, name: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args([&format!("-{name}"), &pid]).status().unwrap().success());
    }
}

/// A failing test does not leave a held process behind.
impl Drop for Held {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Whether `offsets/<batch>` and `commits/<batch>` exist.
fn logged_and_committed(checkpoint: &Path, batch: u64) -> (bool, bool) {
    (checkpoint.join(format!("offsets/{batch}")).exists(), checkpoint.join(format!("commits/{batch}")).exists())
}

#[test]
fn sigkill_inside_batches_loses_and_repeats_nothing() {
    kill_inside_batches(&[], 0, |_| {});
}

#[test]
fn sigkill_inside_batches_with_incremental_state_snapshots_loses_and_repeats_nothing() {
    let settings_dir = tempfile::tempdir().unwrap();
    let settings = settings_dir.path().join("settings.json");
    // The state snapshot every other batch, a whole one every third.
    std::fs::write(&settings, r#"{"batch_interval_ms": 20, "checkpoint_interval_ms": 40, "full_snapshot_every": 3}"#)
        .unwrap();
    // Each start commits at least 4 batches before its kill: 2 or 3 snapshots,
    // so the window's snapshot it leaves named is changes after a whole one,
    // and the next start restores that chain.
    kill_inside_batches(&["--settings", path_str(&settings)], 4, |checkpoint| {
        let graph = std::fs::read(checkpoint.join("graph")).unwrap();
        let body = graph.splitn(2, |b| *b == b'\n').nth(1).unwrap();
        let named = serde_json::from_slice::<Value>(body).unwrap()["state_batch"].as_u64().unwrap();
        let file = std::fs::read(checkpoint.join(format!("state/window-counts/{named}"))).unwrap();
        let (link, _) = spate_logstore::split_state_file(&file).unwrap();
        assert!(matches!(link, spate_logstore::StateLink::Changes { .. }), "state/window-counts/{named}: {link:?}");
    });
}

/// Twelve starts of the demo, each killed (SIGKILL) where a failpoint holds
/// it, at least `runs_at_least` batches after the last commit, `after_kill`
/// looking at the checkpoint each time; then a run to the end, whose output
/// must hold every word once.
fn kill_inside_batches(extra: &[&str], runs_at_least: u64, after_kill: impl Fn(&Path)) {
    let root = tempfile::tempdir().unwrap();
    let checkpoint = root.path().join("ck");
    let ck = path_str(&checkpoint);
    let seed = std::env::var("SPATE_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    println!("kill points seed: {seed} (set SPATE_CRASH_SEED to replay)");
    let mut moments = Moments(seed);
    let points = ["hold-before-outputs", "hold-in-batch", "hold-after-commit"];
    let quiet: Vec<&str> = ["--quiet"].iter().chain(extra).copied().collect();
    for round in 0..12 {
        let point = points[moments.below(3) as usize];
        let next = if checkpoint.exists() {
            inspect_json(&checkpoint)["commits"]["last"].as_u64().map_or(0, |last| last + 1)
        } else {
            0
        };
        let from = next + runs_at_least + moments.below(3);
        let mut held = spawn_with_failpoint(ck, &quiet, point, from);
        let batch = held.wait_held();
        held.child.kill().unwrap(); // SIGKILL
        held.child.wait().unwrap();
        // The kill landed where the failpoint held the process.
        let expected = if point == "hold-after-commit" { (true, true) } else { (true, false) };
        assert_eq!(logged_and_committed(&checkpoint, batch), expected, "round {round}: {point} at batch {batch}");
        let verdict = inspect_json(&checkpoint)["verdict"].clone();
        let kind = if point == "hold-after-commit" { "resume" } else { "rerun" };
        assert_eq!(verdict["kind"], kind, "round {round}: {point} at batch {batch}: {verdict}");
        after_kill(&checkpoint);
    }
    let last = inspect_json(&checkpoint)["commits"]["last"].as_u64().unwrap_or(0);
    let until_arg = (last + 4).to_string();
    let finish_args: Vec<&str> = quiet.iter().copied().chain(["--until-batch", &until_arg]).collect();
    let finish = spate(&demo_args(ck, &finish_args));
    assert_eq!(finish.status.code(), Some(0), "{}", text(&finish.stderr));

    // Every batch has its output once, and together they hold exactly the
    // first words of the seed's sequence: nothing lost, nothing repeated.
    let output = checkpoint.join("output");
    let check = verify_output(&output, SEED).unwrap();
    assert!(check.batches > last, "{check:?}");
    assert!(check.records > 0, "{check:?}");
    assert!(check_windows(&output, 20) > 0);
}

#[test]
fn a_second_signal_stops_at_once_with_130_and_the_batch_re_runs() {
    let root = tempfile::tempdir().unwrap();
    let checkpoint = root.path().join("ck");
    let ck = path_str(&checkpoint);
    let mut held = spawn_with_failpoint(ck, &["--quiet"], "hold-in-batch", 3);
    let batch = held.wait_held();
    assert_eq!(logged_and_committed(&checkpoint, batch), (true, false));
    held.signal("INT");
    held.wait_stderr("SIGINT: stopping gracefully");
    held.signal("TERM");
    let status = held.child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status}");
    // Stopped at once: the held batch was not committed, and the lock is free.
    assert_eq!(logged_and_committed(&checkpoint, batch), (true, false));
    let state = inspect_json(&checkpoint);
    assert_eq!(state["lock"]["held"], false, "{state}");
    assert_eq!(state["verdict"]["kind"], "rerun", "{state}");
    assert_eq!(state["verdict"]["batch"], batch, "{state}");

    let until_arg = (batch + 2).to_string();
    let resumed = spate(&demo_args(ck, &["--quiet", "--until-batch", &until_arg]));
    let stdout = text(&resumed.stdout);
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed.stderr));
    assert!(stdout.contains(&format!("re-ran batch {batch} with its logged offsets")), "{stdout}");
    let check = verify_output(&checkpoint.join("output"), SEED).unwrap();
    assert!(check.batches > batch + 2, "{check:?}");
}

#[test]
fn one_signal_during_a_seconds_run_stops_it_gracefully() {
    let root = tempfile::tempdir().unwrap();
    let checkpoint = root.path().join("ck");
    let ck = path_str(&checkpoint);
    let mut held = spawn_with_failpoint(ck, &["--quiet", "--seconds", "1"], "hold-in-batch", 0);
    let batch = held.wait_held();
    // The timer asked for a graceful stop while the batch is held; then one Ctrl-C.
    held.wait_stderr("--seconds 1 elapsed: stopping gracefully");
    held.signal("INT");
    held.wait_stderr("SIGINT: stopping gracefully");
    held.release();
    let status = held.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status}");
    assert_eq!(logged_and_committed(&checkpoint, batch), (true, true));
    let state = inspect_json(&checkpoint);
    assert_eq!(state["lock"]["held"], false, "{state}");
    assert_eq!(state["verdict"]["kind"], "resume", "{state}");
    verify_output(&checkpoint.join("output"), SEED).unwrap();
}

#[test]
fn a_panic_in_a_batch_exits_1_and_the_next_start_re_runs_it() {
    for failpoint in ["panic-in-output", "panic-in-batch"] {
        let root = tempfile::tempdir().unwrap();
        let checkpoint = root.path().join("ck");
        let ck = path_str(&checkpoint);
        let failing = Command::new(SPATE)
            .args(demo_args(ck, &["--quiet"]))
            .env_remove("RUST_LOG")
            .env("SPATE_FAILPOINTS", failpoint)
            .env("SPATE_FAILPOINT_BATCH", "2")
            .output()
            .unwrap();
        let stderr = text(&failing.stderr);
        assert_eq!(failing.status.code(), Some(1), "{failpoint}: {stderr}");
        assert!(stderr.contains(&format!("failpoint {failpoint} fired in batch 2")), "{failpoint}: {stderr}");
        assert_eq!(logged_and_committed(&checkpoint, 2), (true, false), "{failpoint}");
        let state = inspect_json(&checkpoint);
        assert_eq!(state["lock"]["held"], false, "{failpoint}: {state}");
        assert_eq!(state["verdict"]["batch"], 2, "{failpoint}: {state}");

        let resumed = spate(&demo_args(ck, &["--quiet", "--until-batch", "4"]));
        let stdout = text(&resumed.stdout);
        assert_eq!(resumed.status.code(), Some(0), "{failpoint}: {}", text(&resumed.stderr));
        assert!(stdout.contains("re-ran batch 2 with its logged offsets"), "{failpoint}: {stdout}");
        let check = verify_output(&checkpoint.join("output"), SEED).unwrap();
        assert!(check.batches > 4, "{failpoint}: {check:?}");
    }
}

#[test]
fn a_second_writer_exits_at_once_naming_the_holder_and_writes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let checkpoint = root.path().join("ck");
    let ck = path_str(&checkpoint);
    let first = spawn_demo(ck, &["--quiet"]);
    let pid = first.id();
    // Wait (bounded) until the first process holds the lock and committed a batch.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(checkpoint.join("commits/0").exists() && inspect_json(&checkpoint)["lock"]["holder"]["pid"] == pid) {
        assert!(Instant::now() < deadline, "the first writer never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Freeze it so the directory does not change under the comparison.
    assert!(Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap().success());
    wait_until_stopped(pid);
    let before = snapshot(&checkpoint);

    let second = spate(&demo_args(ck, &[]));
    let stderr = text(&second.stderr);
    assert_eq!(second.status.code(), Some(4), "{stderr}");
    assert!(stderr.starts_with("Error: cannot run the demo on checkpoint"), "{stderr}");
    assert!(stderr.contains(&format!("pid {pid}")), "{stderr}");
    assert!(text(&second.stdout).is_empty());
    assert_eq!(snapshot(&checkpoint), before, "the second process changed the checkpoint");

    let set = spate(&["checkpoint", "set-offsets", ck, "--source", "words", "--json", r#"{"position":0}"#]);
    assert_eq!(set.status.code(), Some(4), "{}", text(&set.stderr));
    assert_eq!(snapshot(&checkpoint), before);

    // A graceful stop of the first: exit 0, lock released.
    assert!(Command::new("kill").args(["-CONT", &pid.to_string()]).status().unwrap().success());
    assert!(Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap().success());
    let output = first.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("stopped gracefully"), "{}", text(&output.stdout));
    assert_eq!(inspect_json(&checkpoint)["lock"]["held"], false);
    assert_eq!(inspect_json(&checkpoint)["verdict"]["kind"], "resume");
}

/// Every file under `dir` with its content.
/// `kill -STOP` returns once the signal is queued, not once every thread has
/// stopped: a write already under way may still land. Wait (bounded) until
/// every thread of `pid` reports the stopped state `T` (a thread in a system
/// call reaches it only when the call is done).
fn wait_until_stopped(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let tasks = PathBuf::from(format!("/proc/{pid}/task"));
    let all_stopped = || {
        std::fs::read_dir(&tasks).unwrap().all(|task| {
            let stat = std::fs::read_to_string(task.unwrap().path().join("stat")).unwrap_or_default();
            // The state follows the parenthesised command name.
            stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
        })
    };
    while !all_stopped() {
        assert!(Instant::now() < deadline, "process {pid} did not stop");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

#[test]
fn a_commit_ahead_of_the_offsets_is_refused_then_repaired_and_resumed() {
    let root = tempfile::tempdir().unwrap();
    let checkpoint = root.path().join("ck");
    let ck = path_str(&checkpoint);
    let first = spate(&demo_args(ck, &["--quiet", "--until-batch", "5"]));
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    // What Spark users meet after a crash or a hand edit: a commit without its offsets.
    let last = inspect_json(&checkpoint)["commits"]["last"].as_u64().unwrap();
    let ahead = format!("commits/{}", last + 1);
    std::fs::copy(checkpoint.join(format!("commits/{last}")), checkpoint.join(&ahead)).unwrap();
    let until_arg = (last + 3).to_string();

    let refused = spate(&demo_args(ck, &["--until-batch", &until_arg]));
    let stderr = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains(&ahead) && stderr.contains(&format!("spate checkpoint repair {ck} --apply")), "{stderr}");
    assert!(
        stderr.starts_with("Error: cannot run the demo on checkpoint") && stderr.contains("\n  caused by: "),
        "{stderr}"
    );
    assert!(!checkpoint.join(format!("offsets/{}", last + 1)).exists());

    let plan = spate(&["checkpoint", "repair", ck]);
    assert_eq!(plan.status.code(), Some(0));
    assert!(text(&plan.stdout).contains(&format!("{ahead} -> _quarantine/")), "{}", text(&plan.stdout));
    assert!(checkpoint.join(&ahead).exists(), "a plan changes nothing");

    let applied = spate(&["checkpoint", "repair", ck, "--apply"]);
    assert_eq!(applied.status.code(), Some(0), "{}", text(&applied.stderr));
    assert!(!checkpoint.join(&ahead).exists());
    let quarantined: Vec<_> = std::fs::read_dir(checkpoint.join("_quarantine")).unwrap().collect();
    assert_eq!(quarantined.len(), 1);
    assert!(quarantined[0].as_ref().unwrap().path().join(&ahead).exists());

    let resumed = spate(&demo_args(ck, &["--until-batch", &until_arg]));
    let stdout = text(&resumed.stdout);
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed.stderr));
    let expected =
        format!("resumed from checkpoint {ck}: batch {last} was committed, continuing at batch {}", last + 1);
    assert!(stdout.contains(&expected), "{stdout}");
    // One progress line a batch: id, input records, rate, processing time, scheduling delay.
    let progress: Vec<u64> = stdout
        .lines()
        .filter(|l| {
            l.contains(" records | ") && l.contains(" rec/s | processing ") && l.contains(" ms | scheduling delay ")
        })
        .map(|l| l.trim_start_matches("batch").split('|').next().unwrap().trim().parse().unwrap())
        .collect();
    assert_eq!(progress.first(), Some(&(last + 1)), "{stdout}");
    assert!(progress.windows(2).all(|w| w[1] == w[0] + 1), "{stdout}");
    assert!(inspect_json(&checkpoint)["commits"]["last"].as_u64().unwrap() >= last + 3);
    verify_output(&checkpoint.join("output"), SEED).unwrap();
}

/// The batch of the state snapshot the `graph` manifest names, if any.
fn state_batch(checkpoint: &Path) -> Option<u64> {
    let bytes = std::fs::read(checkpoint.join("graph")).unwrap();
    // After the writer's epoch line.
    let body = bytes.splitn(2, |b| *b == b'\n').nth(1).unwrap();
    let graph: Value = serde_json::from_slice(body).unwrap();
    graph["state_batch"].as_u64()
}

/// The damages a repair handles, each applied to a checkpoint whose last batch `last` has its state snapshot.
const REPAIR_SHAPES: &[&str] =
    &["commit ahead", "offsets gap", "commits gap", "unreadable commit", "gap between", "id out of range"];

fn damage(checkpoint: &Path, shape: &str, last: u64) {
    let file = |log: &str, id: u64| checkpoint.join(log).join(id.to_string());
    match shape {
        // The seed's own scenario: offsets/N removed after a graceful stop.
        "commit ahead" => std::fs::remove_file(file("offsets", last)).unwrap(),
        "offsets gap" => std::fs::remove_file(file("offsets", last - 2)).unwrap(),
        "commits gap" => std::fs::remove_file(file("commits", last - 2)).unwrap(),
        "unreadable commit" => std::fs::write(file("commits", last), b"v1\n{garbage").unwrap(),
        // Two batches planned and not committed: the last two commits lost.
        "gap between" => {
            std::fs::remove_file(file("commits", last)).unwrap();
            std::fs::remove_file(file("commits", last - 1)).unwrap();
        }
        "id out of range" => {
            std::fs::copy(file("commits", last), file("commits", u64::MAX)).unwrap();
        }
        other => panic!("no such shape {other}"),
    }
}

#[test]
fn repair_with_a_state_snapshot_at_the_last_batch_leaves_what_it_promises_in_every_shape() {
    for shape in REPAIR_SHAPES {
        let root = tempfile::tempdir().unwrap();
        let checkpoint = root.path().join("ck");
        let ck = path_str(&checkpoint);
        // A graceful stop snapshots the state of its last batch.
        let first = spate(&demo_args(ck, &["--quiet", "--until-batch", "5"]));
        assert_eq!(first.status.code(), Some(0), "{shape}: {}", text(&first.stderr));
        let last = inspect_json(&checkpoint)["commits"]["last"].as_u64().unwrap();
        assert_eq!(state_batch(&checkpoint), Some(last), "{shape}: the stop took no snapshot at the last batch");
        damage(&checkpoint, shape, last);

        let refused = spate(&demo_args(ck, &["--quiet", "--until-batch", "3"]));
        assert_eq!(refused.status.code(), Some(3), "{shape}: {}", text(&refused.stderr));
        let applied = spate(&["checkpoint", "repair", ck, "--apply"]);
        let stdout = text(&applied.stdout);
        assert_eq!(applied.status.code(), Some(0), "{shape}: {}", text(&applied.stderr));
        let promised = stdout.lines().find_map(|l| l.strip_prefix("The checkpoint is now: ")).unwrap().to_string();
        // Every shape but a stray entry loses the last commit, and the state taken after it goes too.
        let loses_last_commit = *shape != "id out of range";
        assert_eq!(stdout.contains("Rewrite graph"), loses_last_commit, "{shape}: {stdout}");
        assert_eq!(stdout.contains(", graph rewritten (its original kept there too)"), loses_last_commit, "{stdout}");
        assert_eq!(state_batch(&checkpoint).is_some_and(|batch| batch >= last), !loses_last_commit, "{shape}");
        let inspected = inspect_json(&checkpoint);
        assert!(["resume", "rerun"].contains(&inspected["verdict"]["kind"].as_str().unwrap()), "{shape}: {inspected}");

        // What the repair promised is what the next start does.
        let until = (last + 3).to_string();
        let resumed = spate(&demo_args(ck, &["--until-batch", &until]));
        let out = text(&resumed.stdout);
        assert_eq!(resumed.status.code(), Some(0), "{shape}: promised {promised:?}, then: {}", text(&resumed.stderr));
        let point = promised.trim_end_matches('.');
        let started = match point.split_once(" batch ") {
            Some(("resume at", rest)) => format!("continuing at batch {}", rest.split(' ').next().unwrap()),
            Some(("re-run", rest)) => {
                format!("batch {} was logged but not committed; re-running it first", rest.split(' ').next().unwrap())
            }
            _ => panic!("{shape}: unexpected promise {promised:?}"),
        };
        assert!(out.contains(&started), "{shape}: promised {promised:?}, but: {out}");
        // Where every batch runs again with its logged offsets the output is exact; a batch
        // planned anew may cover other records than its first output, which is written once.
        if ["unreadable commit", "id out of range"].contains(shape) {
            verify_output(&checkpoint.join("output"), SEED).unwrap_or_else(|e| panic!("{shape}: {e}"));
        }
    }
}

#[test]
fn a_killed_job_says_which_batch_it_re_ran() {
    let root = tempfile::tempdir().unwrap();
    let checkpoint = root.path().join("ck");
    let ck = path_str(&checkpoint);
    let mut held = spawn_with_failpoint(ck, &["--quiet"], "hold-before-outputs", 2);
    let rerun = held.wait_held();
    held.child.kill().unwrap(); // SIGKILL, inside the batch for sure
    held.child.wait().unwrap();
    assert_eq!(logged_and_committed(&checkpoint, rerun), (true, false));
    let verdict = inspect_json(&checkpoint)["verdict"].clone();
    assert_eq!((verdict["kind"].as_str(), verdict["batch"].as_u64()), (Some("rerun"), Some(rerun)), "{verdict}");
    let until_arg = (rerun + 2).to_string();
    let resumed = spate(&demo_args(ck, &["--until-batch", &until_arg]));
    let stdout = text(&resumed.stdout);
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed.stderr));
    let expected = format!(
        "resumed from checkpoint {ck}: re-ran batch {rerun} with its logged offsets, continuing at batch {}",
        rerun + 1
    );
    assert!(stdout.contains(&expected), "{stdout}");
    verify_output(&checkpoint.join("output"), SEED).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

#[test]
fn a_spark_checkpoint_is_inspected_and_its_offsets_printed() {
    let root = tempfile::tempdir().unwrap();
    let checkpoint = root.path().join("spark");
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/spark-checkpoint"), &checkpoint);
    let before = snapshot(&checkpoint);

    let output = spate(&["checkpoint", "inspect", path_str(&checkpoint)]);
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(stdout.contains("Spark Structured Streaming"), "{stdout}");
    assert!(stdout.contains("Query id: 5f2b9c1e-7d3a-4e8b-9f60-1a2b3c4d5e6f"), "{stdout}");
    assert!(stdout.contains("Verdict: re-run batch 2 with its logged offsets"), "{stdout}");
    assert!(stdout.contains(r#"source 0: {"events":{"0":41,"1":52,"2":15}}"#), "{stdout}");
    assert!(stdout.contains(r#"source 1: {"logOffset":3}"#), "{stdout}");
    let migration = stdout.split("To continue in spate").nth(1).unwrap_or_default();
    assert!(migration.contains("last committed batch 1 (batch 2 was planned but not committed"), "{stdout}");
    assert!(migration.contains(r#"source 0: {"events":{"0":36,"1":40,"2":12}}"#), "{stdout}");
    assert!(stdout.contains("Lock: none (never opened by a spate writer)"), "{stdout}");

    let json = inspect_json(&checkpoint);
    assert_eq!(json["format"], "spark");
    assert_eq!(json["lastBatch"]["id"], 2);
    assert_eq!(json["lastBatch"]["batchTimestampMs"], 1_700_000_020_000_i64);
    assert_eq!(json["lastBatch"]["sources"][0]["offset"]["events"]["1"], 52);
    assert_eq!(json["commits"]["last"], 1);
    assert_eq!(json["committedBatch"]["id"], 1);
    assert_eq!(json["committedBatch"]["sources"][1]["offset"]["logOffset"], 2);
    assert_eq!(snapshot(&checkpoint), before, "inspect changed the Spark checkpoint");
}

#[test]
fn usage_errors_help_and_version() {
    let bad = spate(&["demo", "--rate", "zero"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("--rate"), "{}", text(&bad.stderr));

    for args in [&["--help"][..], &["demo", "--help"], &["checkpoint", "repair", "--help"]] {
        let help = spate(args);
        assert_eq!(help.status.code(), Some(0), "{args:?}");
        assert!(text(&help.stdout).contains("Usage: spate"), "{args:?}: {}", text(&help.stdout));
    }
    assert!(text(&spate(&["--help"]).stdout).contains("4    the checkpoint is locked by another live writer"));
    let version = spate(&["--version"]);
    assert_eq!(text(&version.stdout).trim(), format!("spate {}", env!("CARGO_PKG_VERSION")));

    let missing = spate(&["checkpoint", "inspect", "/nonexistent/spate-checkpoint"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        text(&missing.stderr)
            .starts_with("Error: cannot inspect checkpoint /nonexistent/spate-checkpoint\n  caused by: ")
    );
    let bad_json = spate(&["checkpoint", "set-offsets", "/tmp", "--source", "s", "--json", "{"]);
    assert_eq!(bad_json.status.code(), Some(2), "{}", text(&bad_json.stderr));
}

#[test]
fn seconds_stops_the_demo_gracefully_and_releases_the_lock() {
    let root = tempfile::tempdir().unwrap();
    let checkpoint = root.path().join("ck");
    // A test rate: the default (millions a second) is for release builds.
    let args = ["--seconds", "1", "--batch-ms", "100", "--top", "3", "--rate", "20000"];
    let run = spate(&[&["demo", "--checkpoint", path_str(&checkpoint)][..], &args].concat());
    let stdout = text(&run.stdout);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    assert!(stdout.starts_with(&format!("new checkpoint {}: starting at batch 0", checkpoint.display())), "{stdout}");
    assert!(stdout.contains("top words of the 3 s window ending at batch"), "{stdout}");
    assert!(
        stdout.trim_end().lines().last().unwrap().starts_with("stopped gracefully: last committed batch"),
        "{stdout}"
    );
    let state = inspect_json(&checkpoint);
    assert_eq!(state["lock"]["held"], false);
    assert_eq!(state["verdict"]["kind"], "resume");
}

/// Every path under `dir` (itself included) with its permission bits.
fn modes_under(dir: &Path) -> Vec<(PathBuf, u32, bool)> {
    use std::os::unix::fs::PermissionsExt;
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() {
            todo.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
        found.push((path, meta.permissions().mode() & 0o777, meta.is_dir()));
    }
    found
}

#[test]
fn everything_the_demo_writes_under_its_checkpoint_is_owner_only() {
    let root = tempfile::tempdir().unwrap();
    let checkpoint = root.path().join("ck");
    let ck = path_str(&checkpoint);
    // Under the usual umask a file made without a mode of its own is world-readable.
    let run = Command::new("sh")
        .args(["-c", "umask 022 && exec \"$0\" \"$@\"", SPATE])
        .args(demo_args(ck, &["--quiet", "--until-batch", "3"]))
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let output = checkpoint.join("output");
    assert!(batch_counts(&output).len() >= 3, "the demo wrote its output under the checkpoint");
    for (path, mode, is_dir) in modes_under(&checkpoint) {
        assert_eq!(mode & 0o077, 0, "{} is open to others: {mode:o}", path.display());
        if path.starts_with(&output) {
            assert_eq!(mode, if is_dir { 0o700 } else { 0o600 }, "{}", path.display());
        }
    }
}

/// A task checkpoint of an application under `<app>/tasks/<name>`: batches
/// `0..planned` logged (the one source read up to `(id + 1) * 100`), those
/// in `committed` committed; returned open, holding its lock.
fn app_task(app: &Path, name: &str, planned: u64, committed: &[u64]) -> spate_logstore::Checkpoint {
    use spate_logstore::{Checkpoint, CheckpointSettings, CommitMetadata, OffsetSeq, SourceOffset};
    let writer = Checkpoint::open_for_write(app.join("tasks").join(name), CheckpointSettings::new()).unwrap();
    for id in 0..planned {
        let range = serde_json::json!({"lines": {"0": {"from": id * 100, "until": (id + 1) * 100}}});
        let seq = OffsetSeq {
            batch_timestamp: spate_core::Time::from_millis(1_700_000_000_000 + 1000 * id as i64),
            sources: vec![SourceOffset::new("kafka", Some(range))],
            ..OffsetSeq::default()
        };
        writer.offsets().add(spate_core::BatchId(id), &seq).unwrap();
    }
    for &id in committed {
        writer.commits().add(spate_core::BatchId(id), &CommitMetadata::default()).unwrap();
    }
    writer
}

#[test]
fn an_applications_location_is_inspected_as_its_tasks_and_members_and_not_repaired() {
    let root = tempfile::tempdir().unwrap();
    let app = root.path().join("wordcount");
    // lines-0 is held by this process (batch 2 in flight); lines-1 was let go by another member.
    let _held = app_task(&app, "lines-0", 3, &[0, 1]);
    drop(app_task(&app, "lines-1", 5, &[0, 1, 2, 3, 4]));
    let lock = app.join("tasks/lines-1/LOCK");
    let other = spate_logstore::LockHolder {
        pid: 4242,
        host: "host-b".to_string(),
        since: spate_core::Time::from_millis(1_700_000_000_000),
        epoch: 2,
    };
    std::fs::write(&lock, spate_logstore::encode_lock_file(&lock, &other).unwrap()).unwrap();
    let before = snapshot(&app);

    let output = spate(&["checkpoint", "inspect", path_str(&app)]);
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(stdout.starts_with(&format!("Application {} (2 task(s) under tasks/", app.display())), "{stdout}");
    let row = |name: &str| {
        let line = stdout.lines().find(|l| l.split_whitespace().next() == Some(name));
        line.unwrap_or_else(|| panic!("no row for {name}: {stdout}")).split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let pid = std::process::id();
    assert!(row("lines-0").starts_with("lines-0 1 2 200 0 re-run 2 held by "), "{stdout}");
    assert!(row("lines-0").contains(&format!("held by {pid}@")), "{stdout}");
    assert_eq!(row("lines-1"), "lines-1 4 4 500 0 resume at 5 free, last 4242@host-b (epoch 2)", "{stdout}");
    assert!(stdout.contains("  4242@host-b: holds none; last held lines-1 (epoch 2)"), "{stdout}");
    assert!(stdout.contains(&format!("  {pid}@")) && stdout.contains(": holds lines-0 (epoch 1)\n"), "{stdout}");

    let json = inspect_json(&app);
    let tasks = json["application"]["tasks"].as_array().unwrap();
    let names: Vec<&str> = tasks.iter().map(|t| t["task"].as_str().unwrap()).collect();
    assert_eq!(names, ["lines-0", "lines-1"]);
    assert_eq!(tasks[0]["verdict"]["kind"], "rerun");
    assert_eq!(tasks[0]["lastCommit"], 1);
    assert_eq!(tasks[0]["lock"]["held"], true);
    assert_eq!(tasks[0]["owner"]["pid"], pid);
    assert_eq!(tasks[1]["verdict"]["next"], 5);
    assert_eq!(tasks[1]["committedBatch"]["sources"][0]["offset"]["lines"]["0"]["until"], 500);
    let members = json["application"]["members"].as_array().unwrap();
    assert_eq!(members.len(), 2, "{members:?}");
    let b = members.iter().find(|m| m["host"] == "host-b").unwrap();
    assert_eq!((b["pid"].as_u64(), b["holding"].as_bool()), (Some(4242), Some(false)));
    assert_eq!(b["lastHeld"], serde_json::json!([{"task": "lines-1", "epoch": 2}]));

    // Repair and set-offsets are for one task's checkpoint: they name one and change nothing.
    let location = path_str(&app);
    for args in [
        &["checkpoint", "repair", location, "--apply"][..],
        &["checkpoint", "set-offsets", location, "--source", "kafka", "--json", "1", "--commit"],
    ] {
        let refused = spate(args);
        let stderr = text(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("is the location of an application"), "{stderr}");
        assert!(stderr.contains(&format!("e.g. {}", app.join("tasks/lines-0").display())), "{stderr}");
    }
    assert_eq!(snapshot(&app), before, "inspect, repair or set-offsets changed the application's location");
}

#[test]
fn a_demo_resumes_with_its_keys_and_zipf_and_refuses_others() {
    let root = tempfile::tempdir().unwrap();
    let checkpoint = root.path().join("ck");
    let ck = path_str(&checkpoint);
    let first = spate(&demo_args(ck, &["--keys", "500", "--zipf", "0.7", "--until-batch", "3", "--quiet"]));
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    // Other settings would make the output the words of two generators.
    let other = spate(&demo_args(ck, &["--keys", "600", "--zipf", "0.7", "--until-batch", "6", "--quiet"]));
    assert_eq!(other.status.code(), Some(2), "{}", text(&other.stderr));
    let stderr = text(&other.stderr);
    assert!(stderr.contains("made with seed 7, 500 keys and Zipf exponent 0.7"), "{stderr}");
    assert!(stderr.contains("asks for seed 7, 600 keys and Zipf exponent 0.7"), "{stderr}");
    // The default vocabulary is not the recorded one either.
    let default = spate(&demo_args(ck, &["--until-batch", "6", "--quiet"]));
    assert_eq!(default.status.code(), Some(2), "{}", text(&default.stderr));
    let same = spate(&demo_args(ck, &["--keys", "500", "--zipf", "0.7", "--until-batch", "6", "--quiet"]));
    assert_eq!(same.status.code(), Some(0), "{}", text(&same.stderr));
    let output = checkpoint.join("output");
    let check = verify_output(&output, SEED).unwrap();
    assert!(check.batches >= 7, "{check:?}");
    let words: std::collections::BTreeSet<String> =
        batch_counts(&output).into_values().flat_map(|b| b.counts.into_keys()).collect();
    assert!(words.len() <= 500 && words.len() > 100, "{} distinct words", words.len());
}

#[test]
fn demo_keys_and_zipf_out_of_range_are_usage_errors() {
    for (args, says) in [
        (&["--keys", "0"][..], "--keys"),
        (&["--zipf", "-0.5"], "-0.5 is not a finite number of at least 0"),
        (&["--keys", "10000001"], "above 10000000 with a Zipf exponent"),
    ] {
        let run = spate(&[&["demo", "--checkpoint", "/nonexistent/spate-demo"][..], args].concat());
        assert_eq!(run.status.code(), Some(2), "{args:?}: {}", text(&run.stderr));
        assert!(text(&run.stderr).contains(says), "{args:?}: {}", text(&run.stderr));
    }
}
