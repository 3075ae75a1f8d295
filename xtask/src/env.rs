//! The build environment every cargo call of xtask shares, and running steps.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use crate::Result;

/// The workspace root (xtask lives one folder below it).
pub(crate) fn workspace_root() -> PathBuf {
    // `cargo run` sets the manifest folder at run time too. Prefer it: every
    // clone shares one target folder, so the binary may have been built (and
    // not rebuilt since) in another clone, whose path is the one compiled in.
    let manifest =
        std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// The per-user cache folder for build output, ccache and downloads.
pub(crate) fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SPATE_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
    home.join(".cache").join("spate")
}

/// The target directory every cargo call of xtask builds into:
/// `$CARGO_TARGET_DIR` (against the workspace root when relative), else
/// `<cache>/target`.
pub(crate) fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from) {
        Some(dir) if dir.is_relative() => workspace_root().join(dir),
        Some(dir) => dir,
        None => cache_dir().join("target"),
    }
}

/// A `cargo` command with the shared build environment:
///
/// - `CARGO_TARGET_DIR` outside the clone (unless the caller set one), so a
///   fresh clone, as CI makes, reuses the compiled native crates;
/// - ccache in front of the C/C++ compilers with a fixed cache folder and
///   `CCACHE_BASEDIR` at the home folder (where cargo unpacks the native
///   sources), so the cache hits whatever folder the clone is in;
/// - RocksDB from the system (Debian's `librocksdb-dev`, which setup
///   installs) instead of compiling its C++: that build was two thirds of a
///   cold `cargo xtask test`. The bindings are generated from the system's
///   headers, so they match the library linked. Only xtask's builds, which
///   have their own target directory, do this, so a plain `cargo build`
///   (which compiles the bundled RocksDB) never rebuilds for it.
pub(crate) fn cargo(args: &[&str]) -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut c = Command::new(cargo);
    c.args(args).current_dir(workspace_root());
    let cache = cache_dir();
    if std::env::var_os("CARGO_TARGET_DIR").is_none() {
        c.env("CARGO_TARGET_DIR", target_dir());
    }
    if let Some(lib_dir) = system_rocksdb()
        && std::env::var_os("ROCKSDB_LIB_DIR").is_none()
    {
        c.env("ROCKSDB_LIB_DIR", lib_dir);
        c.env("ROCKSDB_INCLUDE_DIR", "/usr/include");
    }
    if std::path::Path::new("/usr/lib/ccache").is_dir() {
        let path = std::env::var("PATH").unwrap_or_default();
        c.env("PATH", format!("/usr/lib/ccache:{path}"));
        c.env("CCACHE_DIR", cache.join("ccache"));
        if let Some(home) = std::env::var_os("HOME") {
            c.env("CCACHE_BASEDIR", home);
        }
    }
    c
}

/// Runs `command` as a named step, printing how long it took.
pub(crate) fn run_step(name: &str, mut command: Command) -> Result {
    println!("==> {name}");
    let started = Instant::now();
    let status = command.status().map_err(|e| format!("{name}: could not start {:?}: {e}", command.get_program()))?;
    println!("<== {name}: {} in {:.1?}", if status.success() { "ok" } else { "FAILED" }, started.elapsed());
    if status.success() { Ok(()) } else { Err(format!("{name} failed ({status})")) }
}

/// The directory of the system's `librocksdb.so` when its headers are
/// installed too (Debian's `librocksdb-dev`).
fn system_rocksdb() -> Option<PathBuf> {
    if !std::path::Path::new("/usr/include/rocksdb/c.h").exists() {
        return None;
    }
    ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"]
        .into_iter()
        .map(PathBuf::from)
        .find(|dir| dir.join("librocksdb.so").exists())
}
