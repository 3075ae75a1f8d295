//! `cargo xtask bench`: every headline benchmark of the workspace.
//!
//! Each benchmark prints its own figure and the bound it is measured against
//! as a line `BENCH <name> <value> <unit> bound=<value> ratio=<r>`. This
//! command runs them, passes their output through, and repeats those lines
//! at the end so runs can be compared. It starts the local Kafka broker and
//! S3 server (or uses running ones) for the Kafka and S3 benchmarks.
//!
//! `cargo xtask bench nexmark [ARGS]` runs only the Nexmark benchmarks
//! (`spate-nexmark`'s `nexmark` and `nexmark_system_alloc` benches: each
//! query's events per CPU-second, checkpoints on and off, beside the best
//! published per-core figures, with mimalloc and then with the system's
//! allocator), with `ARGS` passed to both (`--events N`, query names). It
//! needs neither server.
//!
//! `cargo xtask bench app [ARGS]` runs only the application benchmark
//! (xtask's `app-bench` binary: `spate run --app` on 1, 2 and 3 member
//! processes, the repartition hop's cost, the pause after a member is
//! killed), with `ARGS` passed to it (`--lines N`, `throughput`, `hop`,
//! `rebalance`). It starts the Kafka broker (or uses the running one) and
//! builds the release `spate` binary the members run.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Result;
use crate::env::{cargo, run_step, target_dir};
use crate::{kafka, s3, setup};

pub(crate) fn run(args: &[String]) -> Result {
    if args.first().is_some_and(|a| a == "nexmark") {
        return nexmark(&args[1..]);
    }
    if args.first().is_some_and(|a| a == "app") {
        return app(&args[1..]);
    }
    setup::ensure(setup::ALL)?;
    // The Kafka benchmark reads from a real broker, as the Kafka tests do.
    let broker = kafka::Broker::start_for_tests()?;
    // The S3 benchmarks write to a real S3 server, as the S3 tests do.
    let s3 = s3::S3Server::start_for_tests()?;
    let mut command = cargo(&["bench", "--workspace", "--benches"]);
    command.arg("--").args(args);
    broker.export_to(&mut command);
    s3.export_to(&mut command);
    // The application benchmark is a binary of its own (see `app`).
    let app = full_app_bench(&broker)?;
    println!("==> benchmarks (release build; criterion output follows, then the application benchmark)");
    run_and_summarise([command, app])
}

/// The Nexmark benchmarks alone, with mimalloc and with the system's
/// allocator. Their build is spate-nexmark, the file sink and the engine
/// without native code, so no system package, broker or S3 server is needed.
fn nexmark(args: &[String]) -> Result {
    let mut command =
        cargo(&["bench", "--package", "spate-nexmark", "--bench", "nexmark", "--bench", "nexmark_system_alloc"]);
    // `cargo xtask bench nexmark -- q1` and `cargo xtask bench nexmark q1` mean the same.
    command.arg("--").args(args.strip_prefix(&["--".to_string()]).unwrap_or(args));
    println!("==> nexmark benchmark (release build)");
    run_and_summarise([command])
}

/// The application benchmark alone: member processes of `spate run --app`
/// against the broker, started here unless one is running.
fn app(args: &[String]) -> Result {
    setup::ensure(setup::ALL)?;
    let broker = kafka::Broker::start_for_tests()?;
    let mut command = full_app_bench(&broker)?;
    // `cargo xtask bench app -- rebalance` and `cargo xtask bench app rebalance` mean the same.
    command.args(args.strip_prefix(&["--".to_string()]).unwrap_or(args));
    println!("==> app benchmark (release build)");
    run_and_summarise([command])
}

/// The application benchmark for figures: release builds, against `broker`.
fn full_app_bench(broker: &kafka::Broker) -> Result<Command> {
    let spate = build_spate(Profile::Release)?;
    let mut command = app_bench(Profile::Release, &spate);
    command.arg("--full");
    broker.export_to(&mut command);
    Ok(command)
}

/// How the application benchmark and the `spate` binary it runs are built.
#[derive(Clone, Copy)]
pub(crate) enum Profile {
    /// For figures.
    Release,
    /// For the short check `cargo xtask test` runs: the build the tests made.
    Dev,
}

impl Profile {
    fn flags(self) -> &'static [&'static str] {
        match self {
            Profile::Release => &["--release"],
            Profile::Dev => &[],
        }
    }

    fn folder(self) -> &'static str {
        match self {
            Profile::Release => "release",
            Profile::Dev => "debug",
        }
    }
}

/// Builds the `spate` binary (with Kafka) and returns its path.
pub(crate) fn build_spate(profile: Profile) -> Result<PathBuf> {
    let mut command = cargo(&["build", "--quiet", "--package", "spate-cli", "--bin", "spate"]);
    command.args(profile.flags());
    run_step("spate binary", command)?;
    Ok(target_dir().join(profile.folder()).join("spate"))
}

/// The application benchmark's driver, its members running `spate`.
pub(crate) fn app_bench(profile: Profile, spate: &Path) -> Command {
    let mut command = cargo(&["run", "--quiet", "--package", "xtask", "--bin", "app-bench", "--features", "app-bench"]);
    command.args(profile.flags()).arg("--").arg("--spate").arg(spate);
    command
}

/// Runs `commands` one after the other, passing their output through, then
/// repeats their `BENCH` lines.
fn run_and_summarise(commands: impl IntoIterator<Item = Command>) -> Result {
    let mut summary = Vec::new();
    let mut failed = Vec::new();
    for mut command in commands {
        command.stdout(Stdio::piped());
        let program = format!("{:?}", command.get_program());
        let mut child = command.spawn().map_err(|e| format!("could not start {program}: {e}"))?;
        if let Some(out) = child.stdout.take() {
            for line in BufReader::new(out).lines().map_while(std::result::Result::ok) {
                println!("{line}");
                if line.starts_with("BENCH ") {
                    summary.push(line);
                }
            }
        }
        let status = child.wait().map_err(|e| format!("{program}: {e}"))?;
        if !status.success() {
            failed.push(format!("{:?} ({status})", command.get_args().collect::<Vec<_>>()));
        }
    }
    println!("\n== summary: {} figure(s)", summary.len());
    for line in &summary {
        println!("{line}");
    }
    if failed.is_empty() { Ok(()) } else { Err(format!("failed: {}", failed.join("; "))) }
}
