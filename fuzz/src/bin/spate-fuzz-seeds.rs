//! Writes every target's seeds into `<dir>/<target>/` (default
//! `fuzz/corpus`), each file named by a hash of its content, so a fuzzing
//! run starts from valid encodings. `cargo xtask fuzz` runs it first.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let dir = std::env::args_os().nth(1).map_or_else(|| PathBuf::from("fuzz/corpus"), PathBuf::from);
    let mut written = 0;
    for target in spate_fuzz::TARGETS {
        let folder = dir.join(target.name);
        if let Err(e) = std::fs::create_dir_all(&folder) {
            eprintln!("cannot create {}: {e}", folder.display());
            return ExitCode::FAILURE;
        }
        for seed in (target.seeds)() {
            let path = folder.join(format!("seed-{:016x}", fnv1a(&seed)));
            if let Err(e) = std::fs::write(&path, &seed) {
                eprintln!("cannot write {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            written += 1;
        }
    }
    println!("wrote {written} seeds under {}", dir.display());
    ExitCode::SUCCESS
}

/// FNV-1a: a name that stays the same for the same seed on every build.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}
