//! Runs the workspace's test binaries, several at once.
//!
//! `cargo test` runs its test binaries one after the other. Most of a
//! `cargo xtask test` is a few binaries that mostly wait (on a broker's
//! rebalance, a paused server, a session timeout) while both cores idle,
//! so xtask builds the binaries with `cargo test --no-run`, then runs them
//! itself, a few at a time, as cargo would run each: from its package's
//! folder, with the environment given, every binary even after one fails.
//!
//! The longest binaries start first, by the times the last run measured
//! (kept in the target folder), so that they do not end up last on a lane
//! of their own; the server-outage tests run after all others, alone.
//! Each binary's output is printed whole when it ends, so the lines of
//! binaries running together do not mix; a line says when each one starts.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::Result;
use crate::env::{cargo, target_dir};

/// One test binary as `cargo test --no-run` built it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TestBinary {
    /// As cargo names it: the package, then the source (`tests/app.rs`,
    /// `unittests src/lib.rs`).
    name: String,
    executable: PathBuf,
    package: String,
    /// The package's folder, where cargo runs its tests.
    package_dir: PathBuf,
}

/// What one binary did.
struct Outcome {
    binary: TestBinary,
    passed: bool,
    took: Duration,
    output: Vec<u8>,
}

/// An environment variable to set on each binary (`None`: to remove).
pub(crate) type Variable = (OsString, Option<OsString>);

/// Environment variable: how many test binaries run at once.
const LANES_ENV: &str = "SPATE_TEST_LANES";

/// Binaries run after all others, one at a time: they stop a server for a
/// set outage and check that jobs carry on within their timeouts, and
/// beside the other broker-heavy binaries on two cores a restart of the
/// server took longer than a job waits for it.
const RUN_ALONE: &[&str] = &["spate-cli tests/faults.rs"];

/// Builds every test binary of the workspace (`args` added to
/// `cargo test --no-run`), runs them with `env` set (`None`: removed),
/// and fails if any failed, after all have run.
pub(crate) fn run(args: &[&str], env: &[Variable]) -> Result {
    println!("==> tests");
    let started = Instant::now();
    let binaries = build(args)?;
    let durations_file = target_dir().join("xtask-test-durations.tsv");
    let last = read_durations(&durations_file);
    let lanes = lanes()?;
    let (alone, shared): (Vec<_>, Vec<_>) = binaries.into_iter().partition(|b| RUN_ALONE.contains(&b.name.as_str()));
    println!(
        "running {} test binaries, {lanes} at a time, the longest last time first; then {} alone",
        shared.len(),
        alone.len()
    );
    let mut outcomes = run_all(longest_first(shared, &last), lanes, env);
    outcomes.extend(run_all(alone, 1, env));
    write_durations(&durations_file, &last, &outcomes);
    let failed: Vec<&str> = outcomes.iter().filter(|o| !o.passed).map(|o| o.binary.name.as_str()).collect();
    let (passed_tests, failed_tests) = outcomes.iter().fold((0, 0), |(p, f), o| {
        let (more_p, more_f) = count_tests(&String::from_utf8_lossy(&o.output));
        (p + more_p, f + more_f)
    });
    let verdict = if failed.is_empty() { "ok" } else { "FAILED" };
    println!(
        "<== tests: {verdict} in {:.1?}: {passed_tests} passed, {failed_tests} failed, in {} binaries",
        started.elapsed(),
        outcomes.len()
    );
    if failed.is_empty() {
        return Ok(());
    }
    Err(format!("tests failed in {} binaries: {}", failed.len(), failed.join(", ")))
}

/// The number of binaries run at once: `$SPATE_TEST_LANES`, else one more
/// than the cores (the long binaries mostly wait).
fn lanes() -> Result<usize> {
    match std::env::var(LANES_ENV) {
        Ok(value) => match value.parse::<usize>() {
            Ok(lanes) if lanes > 0 => Ok(lanes),
            _ => Err(format!("{LANES_ENV}={value:?}: a number of test binaries to run at once, at least 1")),
        },
        Err(_) => Ok(std::thread::available_parallelism().map_or(2, usize::from) + 1),
    }
}

/// `cargo test --no-run --message-format=json` with `args`: the test
/// binaries it built. Its messages and errors go to the terminal.
fn build(args: &[&str]) -> Result<Vec<TestBinary>> {
    let mut command = cargo(&["test", "--no-run", "--message-format=json-render-diagnostics"]);
    command.args(args).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let output = command.output().map_err(|e| format!("could not start cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("building the tests failed ({})", output.status));
    }
    let binaries: Vec<TestBinary> = String::from_utf8_lossy(&output.stdout).lines().filter_map(test_binary).collect();
    if binaries.is_empty() {
        return Err("cargo built no test binary".into());
    }
    Ok(binaries)
}

/// The test binary a line of cargo's JSON messages names, if it names one:
/// an artifact built as a test (`"profile":{.."test":true}`) with an
/// executable.
fn test_binary(line: &str) -> Option<TestBinary> {
    if string_field(line, "reason")? != "compiler-artifact" {
        return None;
    }
    let profile = line.get(line.find("\"profile\":{")?..)?;
    let profile = profile.get(..profile.find('}')?)?;
    if !profile.contains("\"test\":true") {
        return None;
    }
    let executable = PathBuf::from(string_field(line, "executable")?);
    let package_dir = PathBuf::from(string_field(line, "manifest_path")?).parent()?.to_path_buf();
    let source = PathBuf::from(string_field(line, "src_path")?);
    let relative = source.strip_prefix(&package_dir).unwrap_or(&source).display().to_string();
    let package = package_name(&string_field(line, "package_id")?, &package_dir);
    let kind = string_field(line, "kind").unwrap_or_default();
    let unit = if matches!(kind.as_str(), "lib" | "bin" | "example" | "proc-macro") { "unittests " } else { "" };
    Some(TestBinary { name: format!("{package} {unit}{relative}"), executable, package, package_dir })
}

/// The package's name in its id: `path+file:///w/crates/spate-cli#0.1.0`
/// (named as its folder) or `path+file:///w#spate@0.1.0`.
fn package_name(package_id: &str, package_dir: &Path) -> String {
    match package_id.rsplit_once('#').and_then(|(_, tail)| tail.split_once('@')) {
        Some((name, _)) => name.to_string(),
        None => package_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
    }
}

/// The first string value of `key` in a line of JSON (the first element
/// when the value is an array of strings); `None` when absent or not a
/// string. Enough for cargo's messages, whose paths and names carry no
/// escaped quote.
fn string_field(line: &str, key: &str) -> Option<String> {
    let pattern = format!("\"{key}\":");
    let rest = line.get(line.find(&pattern)? + pattern.len()..)?;
    let rest = rest.strip_prefix('[').unwrap_or(rest);
    let rest = rest.strip_prefix('"')?;
    let mut value = String::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(value),
            '\\' => match chars.next()? {
                'n' => value.push('\n'),
                't' => value.push('\t'),
                other => value.push(other),
            },
            c => value.push(c),
        }
    }
    None
}

/// `binaries`, the longest by `last` first; those `last` does not know
/// (new ones) before all.
fn longest_first(mut binaries: Vec<TestBinary>, last: &BTreeMap<String, f64>) -> Vec<TestBinary> {
    binaries.sort_by(|a, b| {
        let took = |binary: &TestBinary| last.get(&binary.name).copied().unwrap_or(f64::INFINITY);
        took(b).total_cmp(&took(a)).then_with(|| a.name.cmp(&b.name))
    });
    binaries
}

/// Runs `binaries` in their order on `lanes` threads, printing each one's
/// output as it ends; the outcomes in the order they ended.
fn run_all(binaries: Vec<TestBinary>, lanes: usize, env: &[Variable]) -> Vec<Outcome> {
    let queue = Mutex::new(VecDeque::from(binaries));
    let (done, outcomes) = std::sync::mpsc::channel::<Outcome>();
    std::thread::scope(|scope| {
        for _ in 0..lanes {
            let (queue, done) = (&queue, done.clone());
            scope.spawn(move || {
                loop {
                    // Its own statement: the lock is released before the binary runs.
                    let next = queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop_front();
                    let Some(binary) = next else { return };
                    if done.send(run_one(binary, env)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(done);
        outcomes.iter().inspect(print_outcome).collect()
    })
}

/// Runs one binary as cargo would: from its package's folder, with the
/// package's folder and name in the environment, its output captured.
fn run_one(binary: TestBinary, env: &[Variable]) -> Outcome {
    // Its output comes when it ends: this line shows what runs meanwhile
    // (and, if one hangs, which).
    println!("     Started {}", binary.name);
    let started = Instant::now();
    let mut command = Command::new(&binary.executable);
    command
        .current_dir(&binary.package_dir)
        .env("CARGO_MANIFEST_DIR", &binary.package_dir)
        .env("CARGO_PKG_NAME", &binary.package)
        .stdin(Stdio::null());
    for (name, value) in env {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    let result = command.output();
    let (passed, output) = match result {
        Ok(output) => {
            let mut text = output.stdout;
            text.extend_from_slice(&output.stderr);
            if !output.status.success() {
                text.extend_from_slice(format!("{} ended with {}\n", binary.name, output.status).as_bytes());
            }
            (output.status.success(), text)
        }
        Err(e) => (false, format!("could not start {}: {e}\n", binary.executable.display()).into_bytes()),
    };
    Outcome { binary, passed, took: started.elapsed(), output }
}

fn print_outcome(outcome: &Outcome) {
    let name = &outcome.binary.name;
    println!("     Running {name} ({})", outcome.binary.executable.display());
    print!("{}", String::from_utf8_lossy(&outcome.output));
    let verdict = if outcome.passed { "ok" } else { "FAILED" };
    println!("     {verdict}: {name} in {:.1?}", outcome.took);
}

/// The tests passed and failed that a binary's `test result:` lines count.
fn count_tests(output: &str) -> (u64, u64) {
    let number_before = |line: &str, word: &str| -> u64 {
        line.split(';')
            .find_map(|part| part.trim().strip_suffix(word).and_then(|n| n.trim().rsplit(' ').next()?.parse().ok()))
            .unwrap_or(0)
    };
    output
        .lines()
        .filter(|line| line.starts_with("test result:"))
        .fold((0, 0), |(p, f), line| (p + number_before(line, "passed"), f + number_before(line, "failed")))
}

/// Seconds each binary took last time, by name.
fn read_durations(path: &Path) -> BTreeMap<String, f64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (seconds, name) = line.split_once('\t')?;
            Some((name.to_string(), seconds.parse().ok()?))
        })
        .collect()
}

/// Keeps `outcomes`' times (and those of binaries this run did not run)
/// for the next run's order. A failure to write only costs the order.
fn write_durations(path: &Path, last: &BTreeMap<String, f64>, outcomes: &[Outcome]) {
    let mut durations = last.clone();
    durations.extend(outcomes.iter().map(|o| (o.binary.name.clone(), o.took.as_secs_f64())));
    let text: String = durations.iter().map(|(name, seconds)| format!("{seconds:.1}\t{name}\n")).collect();
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("xtask test: could not keep the test times in {}: {e}", path.display());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A line as cargo 1.95 writes it (shortened), for an integration test.
    const ARTIFACT: &str = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/spate-cli#0.1.0","manifest_path":"/w/crates/spate-cli/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"app","src_path":"/w/crates/spate-cli/tests/app.rs","edition":"2024","doctest":false,"test":true},"profile":{"opt_level":"0","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":true},"features":[],"filenames":["/t/debug/deps/app-03"],"executable":"/t/debug/deps/app-03","fresh":true}"#;

    #[test]
    fn a_test_artifact_is_a_binary_named_as_cargo_names_it_and_others_are_not() {
        let binary = test_binary(ARTIFACT).unwrap();
        assert_eq!(binary.name, "spate-cli tests/app.rs");
        assert_eq!(binary.executable, PathBuf::from("/t/debug/deps/app-03"));
        assert_eq!(binary.package_dir, PathBuf::from("/w/crates/spate-cli"));
        let library = ARTIFACT.replace(r#""kind":["test"]"#, r#""kind":["lib"]"#).replace("tests/app.rs", "src/lib.rs");
        assert_eq!(test_binary(&library).unwrap().name, "spate-cli unittests src/lib.rs");
        // The root package's id names it: its folder is the clone's.
        let root = ARTIFACT
            .replace("path+file:///w/crates/spate-cli#0.1.0", "path+file:///w#spate@0.1.0")
            .replace("/w/crates/spate-cli/", "/w/");
        let root = test_binary(&root).unwrap();
        assert_eq!((root.name.as_str(), root.package.as_str()), ("spate tests/app.rs", "spate"));
        // The plain binary (for `CARGO_BIN_EXE_*`) is not a test; nor is a build script's run.
        let plain =
            ARTIFACT.replace(r#""overflow_checks":true,"test":true}"#, r#""overflow_checks":true,"test":false}"#);
        assert_eq!(test_binary(&plain), None);
        let no_executable = ARTIFACT.replace(r#""executable":"/t/debug/deps/app-03""#, r#""executable":null"#);
        assert_eq!(test_binary(&no_executable), None);
        assert_eq!(test_binary(r#"{"reason":"build-finished","success":true}"#), None);
    }

    #[test]
    fn the_longest_last_time_go_first_and_new_ones_before_them() {
        let binary = |name: &str| TestBinary {
            name: name.into(),
            executable: name.into(),
            package: "p".into(),
            package_dir: "/".into(),
        };
        let last: BTreeMap<String, f64> = [("short".to_string(), 1.0), ("long".to_string(), 100.0)].into();
        let order: Vec<String> = longest_first(vec![binary("short"), binary("long"), binary("new")], &last)
            .into_iter()
            .map(|b| b.name)
            .collect();
        assert_eq!(order, ["new", "long", "short"]);
    }

    /// Two binaries that each wait for the other to have started finish
    /// only when they run at once (each gives up after two minutes, so a
    /// runner that runs them one after the other fails rather than hangs),
    /// each with the environment it is given.
    #[test]
    fn binaries_run_at_once_on_their_lanes_and_each_outcome_is_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("xtask-lanes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = |name: &str, mine: &str, theirs: &str| {
            let path = dir.join(name);
            let text = format!(
                "#!/bin/sh\ntouch {mine}\ni=0\nwhile [ ! -e {theirs} ]; do\n  sleep 0.1; i=$((i+1))\n  \
                 [ $i -gt 1200 ] && echo \"{theirs} never came\" && exit 1\ndone\necho \"var=$SPATE_LANE_TEST home=${{HOME:-none}}\"\n\
                 echo \"test result: ok. 1 passed; 0 failed;\"\n"
            );
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            TestBinary { name: name.into(), executable: path, package: "p".into(), package_dir: dir.clone() }
        };
        let binaries = vec![script("first", "a", "b"), script("second", "b", "a")];
        let env = [("SPATE_LANE_TEST".into(), Some("set".into())), ("HOME".into(), None)];
        let outcomes = run_all(binaries, 2, &env);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(outcomes.len(), 2);
        for outcome in &outcomes {
            let output = String::from_utf8_lossy(&outcome.output);
            assert!(outcome.passed, "{}: {output}", outcome.binary.name);
            assert_eq!(count_tests(&output), (1, 0));
            assert!(output.contains("var=set home=none"), "the environment given, set and removed: {output}");
        }
    }

    #[test]
    fn the_tests_of_every_result_line_are_counted() {
        let output = "test a ... ok\n\
                      test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.5s\n\
                      test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s\n";
        assert_eq!(count_tests(output), (15, 2));
    }

    #[test]
    fn times_are_kept_and_read_back_by_name() {
        let dir = std::env::temp_dir().join(format!("xtask-durations-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("durations.tsv");
        let last: BTreeMap<String, f64> = [("gone".to_string(), 7.0)].into();
        let binary = TestBinary {
            name: "spate-cli tests/app.rs".into(),
            executable: "/x".into(),
            package: "spate-cli".into(),
            package_dir: "/".into(),
        };
        let outcome = Outcome { binary, passed: true, took: Duration::from_millis(2500), output: Vec::new() };
        write_durations(&path, &last, &[outcome]);
        let read = read_durations(&path);
        assert_eq!(read.get("spate-cli tests/app.rs"), Some(&2.5));
        assert_eq!(read.get("gone"), Some(&7.0));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
