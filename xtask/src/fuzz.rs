//! `cargo xtask fuzz [--seconds S] [TARGET…]`: every decoder under libFuzzer.
//!
//! The targets are the `spate-fuzz` library's (one `cargo fuzz` binary each
//! in `fuzz/targets/`). For each, in turn: the seeds (valid encodings) are
//! written into `fuzz/corpus/<target>/`, then libFuzzer runs for a fixed
//! time, growing that corpus. An input that makes a target fail is copied
//! to `fuzz/regressions/<target>/`, where `cargo xtask test` replays it
//! from then on, and the command fails naming it. Commit both folders.
//!
//! cargo-fuzz is installed on first use. The binaries are built without a
//! sanitizer (spate forbids unsafe code, so AddressSanitizer finds nothing
//! a panic would not) but with debug assertions and overflow checks, so
//! arithmetic on decoded numbers that overflows is a failure too.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Result;
use crate::env::{cargo, run_step, workspace_root};
use crate::setup;

/// Every target; `fuzz/targets/Cargo.toml` has one binary for each.
const TARGETS: &[&str] = &[
    "frame",
    "log_entry",
    "lock_file",
    "kafka_offsets",
    "metadata",
    "tracker_event",
    "block",
    "wal_segment",
    "wal_record",
];

const CARGO_FUZZ_VERSION: &str = "0.13.2";

pub(crate) fn run(args: &[String]) -> Result {
    let (seconds, targets) = parse(args)?;
    setup::ensure(setup::ALL)?;
    install_cargo_fuzz()?;
    let root = workspace_root();
    let corpus = root.join("fuzz").join("corpus");
    let mut seeds = cargo(&["run", "--quiet", "--package", "spate-fuzz", "--bin", "spate-fuzz-seeds", "--"]);
    seeds.arg(&corpus);
    run_step("fuzz seeds", seeds)?;
    let mut failed = Vec::new();
    for target in &targets {
        if let Err(e) = fuzz_one(&root, target, seconds) {
            eprintln!("xtask fuzz: {e}");
            failed.push(target.as_str());
        }
    }
    if failed.is_empty() {
        println!("xtask fuzz: {} target(s), {seconds} s each, no failure", targets.len());
        Ok(())
    } else {
        Err(format!("failing target(s): {}; inputs kept in fuzz/regressions/", failed.join(", ")))
    }
}

fn parse(args: &[String]) -> Result<(u64, Vec<String>)> {
    let mut seconds = 60;
    let mut targets = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                let value = args.next().ok_or("--seconds needs a value")?;
                seconds = value.parse().map_err(|_| format!("--seconds: `{value}` is not a whole number"))?;
            }
            name if TARGETS.contains(&name) => targets.push(name.to_string()),
            other => return Err(format!("unknown fuzz target or flag `{other}`; targets: {}", TARGETS.join(", "))),
        }
    }
    if targets.is_empty() {
        targets = TARGETS.iter().map(|t| (*t).to_string()).collect();
    }
    Ok((seconds, targets))
}

fn install_cargo_fuzz() -> Result {
    let installed = cargo(&["fuzz", "--version"]).output().is_ok_and(|o| o.status.success());
    if installed {
        return Ok(());
    }
    run_step("install cargo-fuzz", cargo(&["install", "--locked", "--version", CARGO_FUZZ_VERSION, "cargo-fuzz"]))
}

fn fuzz_one(root: &Path, target: &str, seconds: u64) -> Result {
    let corpus = root.join("fuzz").join("corpus").join(target);
    let artifacts = std::env::temp_dir().join(format!("spate-fuzz-artifacts-{}", std::process::id())).join(target);
    std::fs::create_dir_all(&artifacts).map_err(|e| format!("cannot create {}: {e}", artifacts.display()))?;
    let mut command = fuzz_command(target);
    command.arg(&corpus).arg("--").args([
        format!("-max_total_time={seconds}"),
        "-rss_limit_mb=2048".to_string(),
        "-timeout=10".to_string(),
        format!("-artifact_prefix={}/", artifacts.display()),
    ]);
    let outcome = run_step(&format!("fuzz {target} for {seconds} s"), command);
    let kept = keep_artifacts(root, target, &artifacts)?;
    match (outcome, kept.is_empty()) {
        (Ok(()), true) => Ok(()),
        (outcome, _) => Err(format!(
            "{target} failed ({}); inputs kept: {}",
            outcome.err().unwrap_or_else(|| "an input was reported".to_string()),
            if kept.is_empty() { "none".to_string() } else { kept.join(", ") }
        )),
    }
}

/// `cargo fuzz run` on the targets package, with the workspace's CPU flags
/// (so the native crates' C/C++ flags, and ccache's keys, stay the same).
fn fuzz_command(target: &str) -> Command {
    let mut command = cargo(&["fuzz", "run", "--fuzz-dir", "fuzz/targets", "--sanitizer", "none", target]);
    command.env("RUSTFLAGS", "-Ctarget-cpu=x86-64-v2");
    // cargo-fuzz passes flags only nightly compilers take by default.
    command.env("RUSTC_BOOTSTRAP", "1");
    command.env("CARGO_TARGET_DIR", crate::env::cache_dir().join("fuzz-target"));
    command
}

/// Copies every input libFuzzer reported into `fuzz/regressions/<target>/`.
fn keep_artifacts(root: &Path, target: &str, artifacts: &Path) -> Result<Vec<String>> {
    let Ok(entries) = std::fs::read_dir(artifacts) else { return Ok(Vec::new()) };
    let regressions = root.join("fuzz").join("regressions").join(target);
    let mut kept = Vec::new();
    for path in entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()) {
        let name = path.file_name().map(PathBuf::from).unwrap_or_default();
        std::fs::create_dir_all(&regressions).map_err(|e| format!("cannot create {}: {e}", regressions.display()))?;
        let to = regressions.join(&name);
        std::fs::copy(&path, &to).map_err(|e| format!("cannot copy {} to {}: {e}", path.display(), to.display()))?;
        kept.push(to.display().to_string());
    }
    Ok(kept)
}
