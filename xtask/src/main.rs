//! `cargo xtask`: the developer's entry point.
//!
//! Every command is declared once, in [`COMMANDS`]. They need nothing but
//! a Rust toolchain and root (or sudo) for the system packages, and each one
//! that builds installs what it needs first ([`setup::ensure`]):
//!
//! - `setup`: installs every system package the build and tests need (idempotent).
//! - `test`: setup, format check, the documentation check, clippy, the
//!   `hello` example, then every test of the workspace (several test
//!   binaries at once, see [`test_run`]), with the local Kafka broker and
//!   S3 server running.
//! - `docs`: the documentation check alone: every relative link of the
//!   Markdown files resolves, and the guide (`docs/`) builds with mdBook.
//! - `bench`: the headline benchmarks, ending with one `BENCH` line a figure.
//! - `fuzz`: every decoder under libFuzzer for a fixed time; failures are
//!   kept as regression inputs that `test` replays.
//! - `kafka`, `s3`: start, stop, restart (keeping the data) or show the
//!   local Kafka broker or S3 server of the tests, for running tests by
//!   hand; `--instance NAME` for a server of its own, as the fault tests use.
//! - `demo`: builds and runs `spate demo` with the given arguments. It builds
//!   the command without its Kafka support and RocksDB spill store (cargo
//!   features), so it needs no system package and no native code: on a
//!   fresh machine it shows its first batch minutes before a full build
//!   would finish.
//!
//! Native code (RocksDB, librdkafka) dominates build time on small machines,
//! so every cargo call here shares one persistent target directory outside
//! the clone and compiles C/C++ through ccache (see [`env::cargo`]).

mod bench;
mod docs;
mod env;
mod fuzz;
mod kafka;
mod process;
mod s3;
mod setup;
mod test_run;

use std::ffi::OsStr;
use std::process::ExitCode;
use std::time::Instant;

use env::{cargo, run_step, workspace_root};

type Result<T = ()> = std::result::Result<T, String>;

struct Command {
    name: &'static str,
    help: &'static str,
    run: fn(&[String]) -> Result,
}

const COMMANDS: &[Command] = &[
    Command {
        name: "setup",
        help: "install the system packages the build and tests need",
        run: |_| setup::ensure(setup::ALL),
    },
    Command {
        name: "test",
        help: "setup, fmt --check, docs, clippy -D warnings, the hello example, every test (starts Kafka and S3)",
        run: test,
    },
    Command {
        name: "docs",
        help: "check every relative link of the Markdown files and build the guide (mdBook)",
        run: docs::run,
    },
    Command { name: "ci", help: "what .ci/run runs: the same as test", run: test },
    Command { name: "bench", help: "run the headline benchmarks and print one BENCH line a figure", run: bench::run },
    Command {
        name: "fuzz",
        help: "[--seconds S] [TARGET..]: every decoder under libFuzzer (60 s a target)",
        run: fuzz::run,
    },
    Command {
        name: "kafka",
        help: "start|stop|restart|status [--instance NAME] the local Apache Kafka broker for tests",
        run: kafka::run,
    },
    Command {
        name: "s3",
        help: "start|stop|restart|status [--instance NAME] the local S3 server (SeaweedFS) for tests",
        run: s3::run,
    },
    Command { name: "demo", help: "run `spate demo` (release build); arguments are passed on", run: demo },
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(name) = args.first() else {
        print_help();
        return ExitCode::FAILURE;
    };
    let Some(command) = COMMANDS.iter().find(|c| c.name == name.as_str()) else {
        if name != "help" && name != "--help" && name != "-h" {
            eprintln!("xtask: unknown command `{name}`");
        }
        print_help();
        return ExitCode::FAILURE;
    };
    match (command.run)(&args[1..]) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask {name}: {message}");
            ExitCode::FAILURE
        }
    }
}

fn print_help() {
    eprintln!("usage: cargo xtask <command> [args]\n\ncommands:");
    for c in COMMANDS {
        eprintln!("  {:<8} {}", c.name, c.help);
    }
}

/// The environment variable naming this binary to the tests (`kafka` and
/// `s3` with `--instance`, for the servers the fault tests pause and stop).
const XTASK_ENV: &str = "SPATE_XTASK";

fn test(_args: &[String]) -> Result {
    let started = Instant::now();
    setup::ensure(setup::ALL)?;
    run_step("format check", cargo(&["fmt", "--all", "--check"]))?;
    // Before the long steps, so a broken link fails in seconds.
    docs::check_links(&workspace_root())?;
    docs::build_guide(&workspace_root())?;
    run_step("clippy", cargo(&["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))?;
    run_step("clippy (app benchmark)", cargo(APP_BENCH_CLIPPY))?;
    run_step("hello example", cargo(HELLO))?;
    let broker = kafka::Broker::start_for_tests()?;
    let s3 = s3::S3Server::start_for_tests()?;
    let tests = {
        // Collects what the servers export, to set it on each test binary.
        let mut env = std::process::Command::new("env");
        broker.export_to(&mut env);
        s3.export_to(&mut env);
        // The fault tests start, pause and restart servers of their own with it.
        if let Ok(xtask) = std::env::current_exe() {
            env.env(XTASK_ENV, xtask);
        }
        let env: Vec<_> = env.get_envs().map(|(k, v)| (k.to_os_string(), v.map(OsStr::to_os_string))).collect();
        test_run::run(&["--workspace", "--all-targets"], &env)
    };
    let doctests = run_step("doc tests", cargo(&["test", "--workspace", "--doc"]));
    let app_bench = app_bench_check(&broker);
    drop(s3);
    drop(broker);
    tests?;
    doctests?;
    app_bench?;
    println!("xtask test: all green in {:.0?}", started.elapsed());
    Ok(())
}

/// The application benchmark's binary is built only with its feature, so
/// the workspace's clippy run does not see it.
const APP_BENCH_CLIPPY: &[&str] =
    &["clippy", "--package", "xtask", "--features", "app-bench", "--all-targets", "--", "-D", "warnings"];

/// The application benchmark's short check: one member on a backlog of
/// 3,000 lines, every closed window exact, and one rebalance pause.
fn app_bench_check(broker: &kafka::Broker) -> Result {
    let spate = bench::build_spate(bench::Profile::Dev)?;
    let mut command = bench::app_bench(bench::Profile::Dev, &spate);
    broker.export_to(&mut command);
    run_step("app benchmark (short check)", command)
}

/// The smallest job (`examples/hello.rs`), which must run and end by
/// itself with exit code 0.
const HELLO: &[&str] = &["run", "--quiet", "--package", "spate", "--example", "hello"];

/// The demo's build: release, and only what `spate demo` runs (no Kafka,
/// no RocksDB), so it needs no system package: neither libclang nor a
/// C++ build.
const DEMO_BUILD: &[&str] =
    &["run", "--release", "--quiet", "--package", "spate-cli", "--no-default-features", "--bin", "spate", "--"];

fn demo(args: &[String]) -> Result {
    let mut c = cargo(DEMO_BUILD);
    c.arg("demo");
    // `cargo xtask demo -- --seconds 5` and `cargo xtask demo --seconds 5` mean the same.
    c.args(args.strip_prefix(&["--".to_string()]).unwrap_or(args));
    run_step("demo", c)
}
