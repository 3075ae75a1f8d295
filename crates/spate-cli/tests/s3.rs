//! The `spate` binary on checkpoints in S3, against a real S3 server
//! (SeaweedFS: `cargo xtask test` starts one; or `cargo xtask s3 start`, then
//! `SPATE_TEST_S3_ENDPOINT=http://127.0.0.1:<port> cargo test -p spate-cli --test s3`).
//! Without a server every test here fails, saying so; none passes vacuously.
//!
//! `inspect`, `repair` and `set-offsets` run one script on a local directory
//! and on `s3://`, and must print the same and exit with the same codes; so
//! must inspect on an application's location (`tasks/` of task checkpoints)
//! and repair and set-offsets refusing it. The
//! demo runs on `s3://` with its receiver's logs in `--wal-dir`, resumes,
//! refuses to start without `--wal-dir`, and a second writer is refused
//! naming the holder; the demo's `--window-files` go to `s3://` with each
//! window once. The child processes get no `AWS_*` variables: the
//! `--s3-*` flags alone must reach the server (one test uses the variables
//! alone instead).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use spate_core::{BatchId, Time};
use spate_logstore::{
    Checkpoint, CheckpointSettings, CommitMetadata, Json, LOCK_FILE, NO_FENCE, ObjectStoreSettings, OffsetSeq,
    SourceOffset, encode_entry, file_manager_for,
};
use spate_runtime::demo::verify_output;

const SPATE: &str = env!("CARGO_BIN_EXE_spate");
const SEED: u64 = 7;
/// How long a test waits for something the process must do before it gives
/// up and fails (generous: a loaded machine is slow, never wrong).
const GIVE_UP: Duration = Duration::from_secs(120);

/// The test server and a file holding its secret (for `--s3-secret-access-key-file`).
struct S3 {
    settings: ObjectStoreSettings,
    bucket: String,
    _secret_dir: tempfile::TempDir,
    flags: Vec<String>,
}

/// The server named by `SPATE_TEST_S3_ENDPOINT`, or a panic saying how to get one.
fn s3() -> S3 {
    let endpoint = std::env::var("SPATE_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "SPATE_TEST_S3_ENDPOINT is not set: this test needs an S3 server. Run it with `cargo xtask test`, \
             or start one with `cargo xtask s3 start` and export what it prints"
        )
    });
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
    let settings = ObjectStoreSettings {
        endpoint: Some(endpoint.clone()),
        region: Some(var("AWS_REGION", "us-east-1")),
        access_key_id: Some(var("AWS_ACCESS_KEY_ID", "spate-test")),
        secret_access_key: Some(var("AWS_SECRET_ACCESS_KEY", "spate-test-secret")),
        allow_http: Some(true),
    };
    let secret_dir = tempfile::tempdir().unwrap();
    let secret_file = secret_dir.path().join("secret");
    // With the newline `echo` leaves: the command must not take it for part of the secret.
    std::fs::write(&secret_file, format!("{}\n", settings.secret_access_key.as_deref().unwrap())).unwrap();
    let flags = vec![
        "--s3-endpoint".to_string(),
        endpoint,
        "--s3-region".to_string(),
        settings.region.clone().unwrap(),
        "--s3-access-key-id".to_string(),
        settings.access_key_id.clone().unwrap(),
        "--s3-secret-access-key-file".to_string(),
        secret_file.to_str().unwrap().to_string(),
        "--s3-allow-http".to_string(),
    ];
    S3 { settings, bucket: var("SPATE_TEST_S3_BUCKET", "spate-test"), _secret_dir: secret_dir, flags }
}

impl S3 {
    /// A location no other test (or earlier run) uses.
    fn fresh_location(&self, name: &str) -> PathBuf {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        PathBuf::from(format!("s3://{}/tests/cli-{name}-{}-{n}-{nanos}", self.bucket, std::process::id()))
    }

    /// Every object under `location` with its content, `LOCK` left out when asked.
    fn snapshot(&self, location: &Path, with_lock: bool) -> BTreeMap<PathBuf, Vec<u8>> {
        let files = file_manager_for(location, &self.settings).unwrap();
        files
            .list_files_recursive(location)
            .unwrap()
            .into_iter()
            .filter(|(path, _)| with_lock || path != Path::new(LOCK_FILE))
            .map(|(path, _)| {
                let bytes = files.read(&location.join(&path), 1 << 30).unwrap().unwrap();
                (path, bytes)
            })
            .collect()
    }
}

/// The flags that reach `location`: the `--s3-*` flags for `s3://`, none for a directory.
fn flags_for<'a>(s3: &'a S3, location: &Path) -> &'a [String] {
    if location.to_str().unwrap().starts_with("s3://") { &s3.flags } else { &[] }
}

/// A command of the binary without any `AWS_*` variable of this process.
fn command(args: &[String]) -> Command {
    let mut command = Command::new(SPATE);
    command.args(args).env_remove("RUST_LOG");
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with("AWS_")) {
            command.env_remove(name);
        }
    }
    command
}

fn spate(args: &[String]) -> Output {
    command(args).output().unwrap()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn offsets(n: u64) -> OffsetSeq {
    OffsetSeq {
        batch_timestamp: Time::from_millis(1_700_000_000_000 + n as i64 * 1000),
        sources: vec![SourceOffset::new("events", Some(serde_json::json!({"events": {"0": n * 10}})))],
        ..OffsetSeq::default()
    }
}

/// The in-process writer's options: the file manager the location names.
fn options_for(s3: &S3) -> CheckpointSettings {
    CheckpointSettings::new().with_object_store(s3.settings.clone())
}

/// Three committed batches and a commit of a fourth without its offsets:
/// what a crash or a hand edit leaves, the commonest inconsistency.
fn commit_ahead(s3: &S3, location: &Path) {
    let checkpoint = Checkpoint::open_for_write(location, options_for(s3)).unwrap();
    for id in 0..3 {
        assert!(checkpoint.offsets().add(BatchId(id), &offsets(id)).unwrap());
        assert!(checkpoint.commits().add(BatchId(id), &CommitMetadata::default()).unwrap());
    }
    assert!(checkpoint.commits().add(BatchId(3), &CommitMetadata::default()).unwrap());
}

/// `text` with what differs between two checkpoints of the same content
/// masked: the location, the query id and creation time, when a lock was
/// taken, the time in a quarantine directory's name.
fn normalised(text: &str, location: &Path) -> String {
    let text = text.replace(location.to_str().unwrap(), "<checkpoint>");
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            if line.starts_with("Query id: ") {
                return "Query id: <id>".to_string();
            }
            mask_pids(&mask_quarantine(&mask(line, " since ", " (epoch")))
        })
        .collect();
    lines.join("\n")
}

/// Replaces what follows each `start` up to the next `end` with `<…>`.
fn mask(line: &str, start: &str, end: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find(start) {
        let after = &rest[at + start.len()..];
        let Some(stop) = after.find(end) else { break };
        out.push_str(&rest[..at + start.len()]);
        out.push_str("<…>");
        rest = &after[stop..];
    }
    out.push_str(rest);
    out
}

/// Names a process id `<this test>` or `<a command>`: the commands are
/// separate processes, on a directory and on S3 alike.
fn pid_name(pid: u64) -> &'static str {
    if pid == u64::from(std::process::id()) { "<this test>" } else { "<a command>" }
}

/// Replaces each `pid N` with its [`pid_name`].
fn mask_pids(line: &str) -> String {
    const START: &str = "pid ";
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find(START) {
        let after = &rest[at + START.len()..];
        let len = after.find(|c: char| !c.is_ascii_digit()).unwrap_or(after.len());
        out.push_str(&rest[..at + START.len()]);
        match after[..len].parse() {
            Ok(pid) => out.push_str(pid_name(pid)),
            Err(_) => out.push_str(&after[..len]),
        }
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// Replaces the time naming each quarantine directory (`_quarantine/<time>`) with `<…>`.
fn mask_quarantine(line: &str) -> String {
    const START: &str = "_quarantine/";
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find(START) {
        let after = &rest[at + START.len()..];
        let len = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-')).unwrap_or(after.len());
        out.push_str(&rest[..at + START.len()]);
        out.push_str("<…>");
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// One step of the script: what was run, its exit code, stdout and stderr, normalised.
#[derive(Debug, PartialEq, Eq)]
struct Step {
    what: String,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn step(s3: &S3, location: &Path, what: &str, args: &[&str]) -> Step {
    let mut argv = strings(args);
    argv.extend_from_slice(flags_for(s3, location));
    let output = spate(&argv);
    let stdout = match serde_json::from_slice::<Value>(&output.stdout) {
        Ok(json) if args.contains(&"--json") => serde_json::to_string_pretty(&masked_json(json)).unwrap(),
        _ => text(&output.stdout),
    };
    Step {
        what: what.to_string(),
        code: output.status.code(),
        stdout: normalised(&stdout, location),
        stderr: normalised(&text(&output.stderr), location),
    }
}

/// `inspect --json` with the query id, creation time, lock times and the
/// batch time set-offsets takes from the clock left out.
fn masked_json(mut json: Value) -> Value {
    json["id"] = Value::Null;
    json["createdAtMs"] = Value::Null;
    if json["lastBatch"]["id"].as_u64() > Some(2) {
        json["lastBatch"]["batchTimestampMs"] = Value::Null;
    }
    for who in ["holder", "lastWriter"] {
        if json["lock"][who].is_object() {
            json["lock"][who]["sinceMs"] = Value::Null;
            let pid = json["lock"][who]["pid"].as_u64().unwrap_or_default();
            json["lock"][who]["pid"] = Value::from(pid_name(pid));
        }
    }
    json
}

/// The layout under `location`: every file's path, the quarantine's time masked.
fn layout(s3: &S3, location: &Path) -> Vec<String> {
    let files = file_manager_for(location, &s3.settings).unwrap();
    let mut paths: Vec<String> = files
        .list_files_recursive(location)
        .unwrap()
        .into_iter()
        .map(|(path, _)| mask_quarantine(path.to_str().unwrap()))
        .collect();
    paths.sort();
    paths
}

/// Inspect, repair and set-offsets on a commit-ahead checkpoint at
/// `location`: every step's exit code and output, and the layout at the end.
fn script(s3: &S3, location: &Path) -> (Vec<Step>, Vec<String>) {
    commit_ahead(s3, location);
    let ck = location.to_str().unwrap();
    let set = |json: &'static str| ["checkpoint", "set-offsets", ck, "--source", "events", "--json", json];
    let mut steps = vec![
        step(s3, location, "inspect", &["checkpoint", "inspect", ck]),
        step(s3, location, "inspect --json", &["checkpoint", "inspect", ck, "--json"]),
        step(s3, location, "set-offsets on an inconsistent checkpoint", &set(r#"{"events":{"0":99}}"#)),
    ];
    {
        let _writer = Checkpoint::open_for_write(location, options_for(s3)).unwrap();
        steps.push(step(
            s3,
            location,
            "repair --apply while a writer holds it",
            &["checkpoint", "repair", ck, "--apply"],
        ));
        steps.push(step(s3, location, "set-offsets while a writer holds it", &set(r#"{"events":{"0":99}}"#)));
        steps.push(step(s3, location, "inspect while a writer holds it", &["checkpoint", "inspect", ck]));
    }
    steps.extend([
        step(s3, location, "repair (plan)", &["checkpoint", "repair", ck]),
        step(s3, location, "repair --apply", &["checkpoint", "repair", ck, "--apply"]),
        step(s3, location, "inspect after the repair", &["checkpoint", "inspect", ck]),
        step(s3, location, "repair of a consistent checkpoint", &["checkpoint", "repair", ck]),
        step(
            s3,
            location,
            "set-offsets of an unknown source",
            &["checkpoint", "set-offsets", ck, "--source", "nope", "--json", "1"],
        ),
        step(s3, location, "set-offsets", &set(r#"{"events":{"0":99}}"#)),
        step(s3, location, "set-offsets with a batch pending", &set(r#"{"events":{"0":120}}"#)),
        step(
            s3,
            location,
            "set-offsets --commit is refused too",
            &["checkpoint", "set-offsets", ck, "--source", "events", "--json", "7", "--commit"],
        ),
        step(s3, location, "inspect --json at the end", &["checkpoint", "inspect", ck, "--json"]),
    ]);
    let missing = format!("{ck}-missing");
    steps.push(step(s3, location, "inspect of a missing checkpoint", &["checkpoint", "inspect", &missing]));
    steps.push(step(
        s3,
        location,
        "repair --apply of a missing checkpoint",
        &["checkpoint", "repair", &missing, "--apply"],
    ));
    (steps, layout(s3, location))
}

#[test]
fn inspect_repair_and_set_offsets_on_s3_print_and_exit_as_on_a_directory() {
    let s3 = s3();
    let root = tempfile::tempdir().unwrap();
    let (local_steps, local_layout) = script(&s3, &root.path().join("ck"));
    let location = s3.fresh_location("script");
    let (s3_steps, s3_layout) = script(&s3, &location);

    // The script does what it should (on the directory; then the same on S3).
    let codes: Vec<Option<i32>> = local_steps.iter().map(|s| s.code).collect();
    let expected = [0, 0, 3, 4, 4, 0, 0, 0, 0, 0, 2, 0, 3, 3, 0, 1, 1].map(Some);
    assert_eq!(codes, expected, "{local_steps:#?}");
    let first = &local_steps[0].stdout;
    assert!(first.contains("Commits: last id 3 (4 entries, 0..=3)"), "{first}");
    assert!(first.contains("Verdict: ") && first.contains("commits/3"), "{first}");
    assert!(local_steps[2].stderr.contains("spate checkpoint repair <checkpoint> --apply"), "{:?}", local_steps[2]);
    assert!(local_steps[3].stderr.contains("in use by another writer: pid <this test>"), "{:?}", local_steps[3]);
    assert!(
        local_steps[7]
            .stdout
            .contains("Applied: 1 file(s) moved to <checkpoint>/_quarantine/<…> (see REPAIR.txt there)"),
        "{:?}",
        local_steps[7]
    );
    assert!(
        local_steps[11].stdout.starts_with("Wrote offsets/3: source events at {\"events\":{\"0\":99}}"),
        "{:?}",
        local_steps[11]
    );
    assert!(local_layout.contains(&"_quarantine/<…>/commits/3".to_string()), "{local_layout:?}");
    assert!(!local_layout.contains(&"commits/3".to_string()), "{local_layout:?}");

    for (local, remote) in local_steps.iter().zip(&s3_steps) {
        assert_eq!(local, remote, "step {:?} differs between a directory and S3", local.what);
    }
    assert_eq!(local_steps.len(), s3_steps.len());
    assert_eq!(local_layout, s3_layout, "the repaired checkpoints differ");
}

#[test]
fn the_aws_environment_variables_reach_s3_without_flags() {
    let s3 = s3();
    let location = s3.fresh_location("env");
    commit_ahead(&s3, &location);
    let settings = &s3.settings;
    let output = command(&strings(&["checkpoint", "inspect", location.to_str().unwrap(), "--json"]))
        .env("AWS_ENDPOINT_URL", settings.endpoint.as_deref().unwrap())
        .env("AWS_REGION", settings.region.as_deref().unwrap())
        .env("AWS_ACCESS_KEY_ID", settings.access_key_id.as_deref().unwrap())
        .env("AWS_SECRET_ACCESS_KEY", settings.secret_access_key.as_deref().unwrap())
        .env("AWS_ALLOW_HTTP", "true")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["verdict"]["kind"], "inconsistent", "{json}");
    assert_eq!(json["commits"]["last"], 3, "{json}");

    // A wrong secret from the flags wins over a right one in the environment.
    let wrong = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(wrong.path(), "not-the-secret").unwrap();
    let output = command(&strings(&[
        "checkpoint",
        "inspect",
        location.to_str().unwrap(),
        "--s3-secret-access-key-file",
        wrong.path().to_str().unwrap(),
    ]))
    .env("AWS_ENDPOINT_URL", settings.endpoint.as_deref().unwrap())
    .env("AWS_REGION", settings.region.as_deref().unwrap())
    .env("AWS_ACCESS_KEY_ID", settings.access_key_id.as_deref().unwrap())
    .env("AWS_SECRET_ACCESS_KEY", settings.secret_access_key.as_deref().unwrap())
    .env("AWS_ALLOW_HTTP", "true")
    .output()
    .unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with(&format!("Error: cannot inspect checkpoint {}", location.display())), "{stderr}");
}

/// Demo flags for `location` with its receiver logs in `wal_dir`: 20 ms
/// batches, 20 000 words a second.
fn demo_args(s3: &S3, location: &Path, wal_dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = strings(&["demo", "--checkpoint", location.to_str().unwrap(), "--wal-dir"]);
    args.push(wal_dir.to_str().unwrap().to_string());
    args.extend(strings(&["--batch-ms", "20", "--rate", "20000", "--seed", "7"]));
    args.extend(strings(extra));
    args.extend_from_slice(&s3.flags);
    args
}

fn inspect_json(s3: &S3, location: &Path) -> Value {
    let mut args = strings(&["checkpoint", "inspect", location.to_str().unwrap(), "--json"]);
    args.extend_from_slice(&s3.flags);
    let output = spate(&args);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The batch ids of the progress lines in `stdout`.
fn progress_batches(stdout: &str) -> Vec<u64> {
    stdout
        .lines()
        .filter(|l| l.contains(" records | ") && l.contains(" ms | scheduling delay "))
        .map(|l| l.trim_start_matches("batch").split('|').next().unwrap().trim().parse().unwrap())
        .collect()
}

#[test]
fn the_demo_runs_on_s3_with_its_logs_in_the_wal_dir_and_resumes() {
    let s3 = s3();
    let location = s3.fresh_location("demo");
    let ck = location.to_str().unwrap();
    let wal = tempfile::tempdir().unwrap();
    let output_dir = wal.path().join("output");

    let first = spate(&demo_args(&s3, &location, wal.path(), &["--quiet", "--until-batch", "3"]));
    let stdout = text(&first.stdout);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    assert!(stdout.starts_with(&format!("new checkpoint {ck}: starting at batch 0")), "{stdout}");
    let closing = format!("checkpoint {ck} released, output in {}", output_dir.display());
    assert!(stdout.trim_end().ends_with(&closing), "{stdout}");
    let state = inspect_json(&s3, &location);
    assert_eq!(state["lock"]["held"], false, "{state}");
    assert_eq!(state["verdict"]["kind"], "resume", "{state}");
    let last = state["commits"]["last"].as_u64().unwrap();
    assert!(last >= 3, "{state}");

    // The receiver's logs went to the local directory, not to S3.
    let objects = s3.snapshot(&location, true);
    assert!(
        objects.contains_key(Path::new("offsets/0")) && objects.contains_key(Path::new("commits/0")),
        "{:?}",
        objects.keys()
    );
    let in_s3_wal: Vec<_> =
        objects.keys().filter(|p| p.starts_with("receivedData") || p.starts_with("receivedBlockMetadata")).collect();
    assert!(in_s3_wal.is_empty(), "receiver logs in S3: {in_s3_wal:?}");
    let local_files = std::fs::read_dir(wal.path()).unwrap().count();
    assert!(local_files > 1, "nothing but the output in the wal dir");

    let until = (last + 3).to_string();
    let second = spate(&demo_args(&s3, &location, wal.path(), &["--until-batch", &until]));
    let stdout = text(&second.stdout);
    assert_eq!(second.status.code(), Some(0), "{}", text(&second.stderr));
    let expected =
        format!("resumed from checkpoint {ck}: batch {last} was committed, continuing at batch {}", last + 1);
    assert!(stdout.contains(&expected), "{stdout}");
    let progress = progress_batches(&stdout);
    assert_eq!(progress.first(), Some(&(last + 1)), "{stdout}");
    assert!(progress.windows(2).all(|w| w[1] == w[0] + 1), "{stdout}");

    // Every batch has its output once, together exactly the seed's first words.
    let check = verify_output(&output_dir, SEED).unwrap();
    assert!(check.batches > last + 3, "{check:?}");
    assert!(check.records > 0, "{check:?}");
}

#[test]
fn the_demos_window_files_go_to_s3_with_the_s3_flags_each_window_once() {
    let s3 = s3();
    let files = s3.fresh_location("window-files");
    let checkpoint = tempfile::tempdir().unwrap();
    let mut args = strings(&["demo", "--checkpoint", checkpoint.path().to_str().unwrap(), "--batch-ms", "20"]);
    args.extend(strings(&["--rate", "20000", "--seed", "7", "--quiet", "--until-batch", "24", "--window-files"]));
    args.push(files.to_str().unwrap().to_string());
    args.extend_from_slice(&s3.flags);
    let run = spate(&args);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));

    let objects = s3.snapshot(&files, true);
    assert!(!objects.keys().any(|p| p.starts_with("_staging")), "{:?}", objects.keys());
    let mut seen: BTreeMap<(i64, String), u64> = BTreeMap::new();
    for (path, bytes) in objects.iter().filter(|(p, _)| p.to_str().unwrap().starts_with("dt=")) {
        let partition = path.parent().unwrap().to_str().unwrap();
        for line in text(bytes).lines() {
            let value: Value = serde_json::from_str(line).unwrap();
            let end = value["window_end_ms"].as_i64().unwrap();
            let expected_partition = spate_files::Partitioning::Hour.directory(Time::from_millis(end));
            assert_eq!(partition, expected_partition, "{line}");
            let word = value["word"].as_str().unwrap().to_string();
            let count = value["count"].as_u64().unwrap();
            assert!(seen.insert((end, word), count).is_none(), "{line} twice");
        }
    }
    // One manifest a window, and the windows are those the demo closed with words in them.
    let manifests = objects.keys().filter(|p| p.starts_with("_manifests")).count();
    let ends: std::collections::BTreeSet<i64> = seen.keys().map(|(end, _)| *end).collect();
    assert_eq!(manifests, ends.len());
    let mut closed = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(checkpoint.path().join("output")).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap().to_str().unwrap().starts_with("window-") {
            let top: spate_runtime::demo::TopWords = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            if !top.words.is_empty() {
                closed.insert(top.batch_time.as_millis());
            }
        }
    }
    // How many of the run's windows get words depends on how soon the
    // receiver runs on the wall clock; the property holds for any number
    // but none.
    assert!(!closed.is_empty(), "no window closed with words");
    assert_eq!(ends, closed);
}

#[test]
fn the_demo_on_s3_without_a_wal_dir_is_a_usage_error_and_creates_nothing() {
    let s3 = s3();
    let location = s3.fresh_location("no-wal");
    let cwd = tempfile::tempdir().unwrap();
    let mut args = strings(&["demo", "--checkpoint", location.to_str().unwrap(), "--until-batch", "1"]);
    args.extend_from_slice(&s3.flags);
    let output = command(&args).current_dir(cwd.path()).output().unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with("Error: --wal-dir DIR is required with the s3:// checkpoint"), "{stderr}");
    assert!(text(&output.stdout).is_empty());
    assert!(s3.snapshot(&location, true).is_empty(), "the refused demo wrote into S3");
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 0, "the refused demo created local files");
}

/// A demo process held by a failpoint inside a batch; its stderr goes to a file.
struct Held {
    child: Child,
    failpoint_dir: tempfile::TempDir,
}

impl Held {
    /// Starts the demo with `hold-in-batch` armed for the first batch from `from_batch` on.
    fn spawn(args: &[String], from_batch: u64) -> Held {
        let failpoint_dir = tempfile::tempdir().unwrap();
        let stderr = std::fs::File::create(failpoint_dir.path().join("stderr")).unwrap();
        let child = command(args)
            .env("SPATE_FAILPOINTS", "hold-in-batch")
            .env("SPATE_FAILPOINT_DIR", failpoint_dir.path())
            .env("SPATE_FAILPOINT_BATCH", from_batch.to_string())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        Held { child, failpoint_dir }
    }

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
                panic!("the process ended ({status}) before its failpoint held it: {}", self.stderr());
            }
            assert!(Instant::now() < deadline, "the failpoint never held the process");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.failpoint_dir.path().join("stderr")).unwrap_or_default()
    }

    fn release(&self) {
        std::fs::write(self.failpoint_dir.path().join("release"), b"").unwrap();
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

#[test]
fn a_second_writer_on_s3_exits_4_naming_the_holder_and_writes_nothing() {
    let s3 = s3();
    let location = s3.fresh_location("second-writer");
    let ck = location.to_str().unwrap();
    let (wal, other_wal) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut held = Held::spawn(&demo_args(&s3, &location, wal.path(), &["--quiet"]), 2);
    let batch = held.wait_held();
    let pid = held.child.id();
    // Held before commits/N: nothing but the lease renewal changes the checkpoint now.
    let before = s3.snapshot(&location, false);
    assert!(before.contains_key(&PathBuf::from(format!("offsets/{batch}"))), "{:?}", before.keys());
    assert!(!before.contains_key(&PathBuf::from(format!("commits/{batch}"))), "{:?}", before.keys());
    let state = inspect_json(&s3, &location);
    assert_eq!(
        (state["lock"]["held"].clone(), state["lock"]["holder"]["pid"].clone()),
        (Value::from(true), Value::from(pid)),
        "{state}"
    );

    let second = spate(&demo_args(&s3, &location, other_wal.path(), &[]));
    let stderr = text(&second.stderr);
    assert_eq!(second.status.code(), Some(4), "{stderr}");
    assert!(stderr.starts_with(&format!("Error: cannot run the demo on checkpoint {ck}")), "{stderr}");
    assert!(stderr.contains(&format!("pid {pid}")), "{stderr}");
    assert!(text(&second.stdout).is_empty(), "{}", text(&second.stdout));
    let in_other_wal: Vec<_> = std::fs::read_dir(other_wal.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(in_other_wal.is_empty(), "the refused writer wrote into its WAL directory: {in_other_wal:?}");

    let mut set = strings(&["checkpoint", "set-offsets", ck, "--source", "words", "--json", r#"{"position":0}"#]);
    set.extend_from_slice(&s3.flags);
    let refused = spate(&set);
    let stderr = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains(&format!("pid {pid}")), "{stderr}");
    assert_eq!(s3.snapshot(&location, false), before, "a refused writer changed the checkpoint");

    // The first carries on: released, it commits the held batch and stops gracefully on SIGTERM.
    held.release();
    assert!(Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap().success());
    let status = held.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status}: {}", held.stderr());
    let state = inspect_json(&s3, &location);
    assert_eq!(state["lock"]["held"], false, "{state}");
    assert_eq!(state["verdict"]["kind"], "resume", "{state}");
    assert!(state["commits"]["last"].as_u64().unwrap() >= batch, "{state}");
    verify_output(&wal.path().join("output"), SEED).unwrap();
}

#[test]
fn a_demo_killed_with_kill_9_on_s3_restarts_at_once_taking_its_dead_lease_over() {
    let s3 = s3();
    let location = s3.fresh_location("kill-9");
    let wal = tempfile::tempdir().unwrap();
    let mut held = Held::spawn(&demo_args(&s3, &location, wal.path(), &["--quiet"]), 2);
    let batch = held.wait_held();
    held.child.kill().unwrap(); // SIGKILL: the lease is neither renewed nor released
    held.child.wait().unwrap();
    let state = inspect_json(&s3, &location);
    assert_eq!(state["lock"]["held"], true, "the dead process's lease still runs: {state}");

    // Its process is gone from this host: the restart takes the lease over at once.
    let until = (batch + 2).to_string();
    let restarted = spate(&demo_args(&s3, &location, wal.path(), &["--quiet", "--until-batch", &until]));
    let stderr = text(&restarted.stderr);
    assert_eq!(restarted.status.code(), Some(0), "{stderr}");
    assert!(
        !stderr.contains("for its lease to run out"),
        "the restart waited for a lease whose holder is gone: {stderr}"
    );
    let state = inspect_json(&s3, &location);
    assert_eq!(state["lock"]["held"], false, "{state}");
    assert!(state["commits"]["last"].as_u64().unwrap() >= batch + 2, "{state}");
    verify_output(&wal.path().join("output"), SEED).unwrap();
}

#[test]
fn a_writer_waits_for_the_lease_of_a_holder_on_another_host_to_run_out_saying_how_long() {
    let s3 = s3();
    let location = s3.fresh_location("elsewhere");
    let wal = tempfile::tempdir().unwrap();
    // A writer on another machine, whose lease runs for another 8 s: longer
    // than a start takes, so the run finds it held.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let lease = serde_json::json!({
        "pid": 4242, "host": "another-machine", "sinceMs": now - 60_000, "epoch": 7, "leaseExpiresMs": now + 8_000
    });
    let files = file_manager_for(&location, &s3.settings).unwrap();
    files.create_atomic(&location.join(LOCK_FILE), &encode_entry(&Json(lease)).unwrap(), NO_FENCE).unwrap();

    let run = spate(&demo_args(&s3, &location, wal.path(), &["--quiet", "--until-batch", "2"]));
    let stderr = text(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("the checkpoint is held by pid 4242 on host another-machine")
            && stderr.contains(" s for its lease to run out"),
        "{stderr}"
    );
    let state = inspect_json(&s3, &location);
    assert_eq!(state["lock"]["lastWriter"]["epoch"], 8, "taken over with the next epoch: {state}");
    verify_output(&wal.path().join("output"), SEED).unwrap();
}

/// An application's location as `spate run --app` leaves it: `lines-0`
/// held by this process with batch 2 in flight, `lines-1` let go after
/// batch 3 committed. Returns the writer that holds `lines-0`.
fn application(s3: &S3, location: &Path) -> Checkpoint {
    let task = |name: &str, planned: u64, committed: u64| {
        let writer = Checkpoint::open_for_write(location.join("tasks").join(name), options_for(s3)).unwrap();
        for id in 0..planned {
            assert!(writer.offsets().add(BatchId(id), &offsets(id)).unwrap());
        }
        for id in 0..committed {
            assert!(writer.commits().add(BatchId(id), &CommitMetadata::default()).unwrap());
        }
        writer
    };
    drop(task("lines-1", 4, 4));
    task("lines-0", 3, 2)
}

/// `--json` of an application with the times its lock files record left out.
fn masked_application(mut json: Value) -> Value {
    for task in json["application"]["tasks"].as_array_mut().unwrap() {
        for who in ["holder", "lastWriter"] {
            if task["lock"][who].is_object() {
                task["lock"][who]["sinceMs"] = Value::Null;
            }
        }
    }
    json
}

#[test]
fn an_application_on_s3_is_inspected_and_refused_by_repair_as_in_a_directory() {
    let s3 = s3();
    let root = tempfile::tempdir().unwrap();
    let run_on = |location: &Path| {
        let _held = application(&s3, location);
        let at = location.to_str().unwrap();
        let mut runs = Vec::new();
        for args in [
            &["checkpoint", "inspect", at][..],
            &["checkpoint", "inspect", at, "--json"],
            &["checkpoint", "repair", at, "--apply"],
            &["checkpoint", "set-offsets", at, "--source", "events", "--json", "1"],
        ] {
            let mut argv = strings(args);
            argv.extend_from_slice(flags_for(&s3, location));
            let output = spate(&argv);
            let stdout = match serde_json::from_slice::<Value>(&output.stdout) {
                Ok(json) => serde_json::to_string_pretty(&masked_application(json)).unwrap(),
                Err(_) => text(&output.stdout),
            };
            let clean = |s: &str| s.replace(at, "<location>");
            runs.push((output.status.code(), clean(&stdout), clean(&text(&output.stderr))));
        }
        (runs, layout(&s3, location))
    };
    let (local, local_layout) = run_on(&root.path().join("app"));
    let location = s3.fresh_location("application");
    let (remote, remote_layout) = run_on(&location);

    let codes: Vec<Option<i32>> = local.iter().map(|r| r.0).collect();
    assert_eq!(codes, [Some(0), Some(0), Some(2), Some(2)], "{local:#?}");
    let (inspected, json) = (&local[0].1, &local[1].1);
    let pid = std::process::id();
    assert!(inspected.starts_with("Application <location> (2 task(s) under tasks/"), "{inspected}");
    let row = |name: &str| {
        let line = inspected.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap();
        line.split_whitespace().collect::<Vec<_>>().join(" ")
    };
    assert!(row("lines-0").starts_with(&format!("lines-0 1 2 - 0 re-run 2 held by {pid}@")), "{inspected}");
    assert!(row("lines-1").starts_with(&format!("lines-1 3 3 - 0 resume at 4 free, last {pid}@")), "{inspected}");
    let json: Value = serde_json::from_str(json).unwrap();
    let host = json["application"]["members"][0]["host"].as_str().unwrap();
    let member = format!("  {pid}@{host}: holds lines-0 (epoch 1); last held lines-1 (epoch 1)");
    assert!(inspected.contains(&member), "{inspected}");
    assert_eq!(json["application"]["tasks"][0]["lock"]["held"], true, "{json}");
    assert_eq!(json["application"]["tasks"][1]["committedBatch"]["id"], 3, "{json}");
    assert_eq!(json["application"]["members"][0]["pid"], pid, "{json}");
    assert!(local[2].2.contains("is the location of an application"), "{:?}", local[2]);
    assert!(local[3].2.contains("e.g. <location>/tasks/lines-0"), "{:?}", local[3]);

    for (what, (l, r)) in
        ["inspect", "inspect --json", "repair --apply", "set-offsets"].iter().zip(local.iter().zip(&remote))
    {
        assert_eq!(l, r, "{what} differs between a directory and S3");
    }
    // Nothing was written at the location itself: only the tasks' files are there.
    assert!(local_layout.iter().all(|p| p.starts_with("tasks/")), "{local_layout:?}");
    assert_eq!(local_layout, remote_layout, "the layouts differ");
}

/// A state file on S3 is read back as a stream a range at a time (a
/// snapshot larger than memory is restored so), and a file replaced while
/// it is read fails the read rather than mixing two versions: the server
/// honours a ranged GET's `If-Match`.
#[test]
fn a_large_file_on_s3_is_read_a_range_at_a_time_and_a_replaced_one_fails_the_read() {
    use std::io::{Read, Seek, SeekFrom};
    let s3 = s3();
    let location = s3.fresh_location("ranges");
    let checkpoint = Checkpoint::open_for_write(&location, options_for(&s3)).unwrap();
    let bytes: Vec<u8> = (0..(20u32 << 20)).map(|i| (i % 251) as u8).collect();
    checkpoint.write_file("state/op/1", &bytes).unwrap();
    let mut streamed = Vec::new();
    checkpoint.open_file("state/op/1").unwrap().unwrap().read_to_end(&mut streamed).unwrap();
    assert!(streamed == bytes, "the file read a range at a time differs");

    checkpoint.replace_file("graph", &vec![1u8; 10 << 20]).unwrap();
    let mut reader = checkpoint.open_file("graph").unwrap().unwrap();
    let mut one = [0u8; 1];
    reader.read_exact(&mut one).unwrap();
    checkpoint.replace_file("graph", &vec![2u8; 10 << 20]).unwrap();
    reader.seek(SeekFrom::Start(9 << 20)).unwrap();
    assert!(reader.read_exact(&mut one).is_err(), "a range of the new version was read: {one:?}");
}
