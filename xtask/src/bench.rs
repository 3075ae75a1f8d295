//! `cargo xtask bench`: every headline benchmark of the workspace.
//!
//! Each benchmark prints its own figure and the bound it is measured against
//! as a line `BENCH <name> <value> <unit> bound=<value> ratio=<r>`. This
//! command runs them, passes their output through, and repeats those lines
//! at the end so runs can be compared. It starts the local Kafka broker and
//! S3 server (or uses running ones) for the Kafka and S3 benchmarks.
//!
//! `cargo xtask bench nexmark [ARGS]` runs only the Nexmark benchmark
//! (`spate-nexmark`'s `nexmark` bench: each query's events per CPU-second,
//! checkpoints on and off, beside Flink's published figures), with `ARGS`
//! passed to it (`--events N`, query names). It needs neither server.
//!
//! `cargo xtask bench app [ARGS]` runs only the application benchmark
//! (`spate-cli`'s `app` bench: `spate run --app` on 1, 2 and 3 member
//! processes, the repartition hop's cost, the pause after a member is
//! killed), with `ARGS` passed to it (`--lines N`, `throughput`, `hop`,
//! `rebalance`). It starts the Kafka broker (or uses the running one).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::Result;
use crate::env::cargo;
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
    println!("==> benchmarks (release build; criterion output follows)");
    run_and_summarise(command)
}

/// The Nexmark benchmark alone. Its build is spate-nexmark and the engine
/// without native code, so no system package, broker or S3 server is needed.
fn nexmark(args: &[String]) -> Result {
    let mut command = cargo(&["bench", "--package", "spate-nexmark", "--bench", "nexmark"]);
    // `cargo xtask bench nexmark -- q1` and `cargo xtask bench nexmark q1` mean the same.
    command.arg("--").args(args.strip_prefix(&["--".to_string()]).unwrap_or(args));
    println!("==> nexmark benchmark (release build)");
    run_and_summarise(command)
}

/// The application benchmark alone: member processes of `spate run --app`
/// against the broker, started here unless one is running.
fn app(args: &[String]) -> Result {
    setup::ensure(setup::ALL)?;
    let broker = kafka::Broker::start_for_tests()?;
    let mut command = cargo(&["bench", "--package", "spate-cli", "--bench", "app"]);
    // `cargo xtask bench app -- rebalance` and `cargo xtask bench app rebalance` mean the same.
    command.arg("--").args(args.strip_prefix(&["--".to_string()]).unwrap_or(args));
    broker.export_to(&mut command);
    println!("==> app benchmark (release build)");
    run_and_summarise(command)
}

/// Runs `command`, passing its output through, then repeats its `BENCH` lines.
fn run_and_summarise(mut command: Command) -> Result {
    command.stdout(Stdio::piped());
    let mut child = command.spawn().map_err(|e| format!("could not start cargo bench: {e}"))?;
    let mut summary = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(std::result::Result::ok) {
            println!("{line}");
            if line.starts_with("BENCH ") {
                summary.push(line);
            }
        }
    }
    let status = child.wait().map_err(|e| format!("cargo bench: {e}"))?;
    println!("\n== summary: {} figure(s)", summary.len());
    for line in &summary {
        println!("{line}");
    }
    if status.success() { Ok(()) } else { Err(format!("cargo bench failed ({status})")) }
}
