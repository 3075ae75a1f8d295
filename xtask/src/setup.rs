//! `cargo xtask setup`: the system packages the build and the tests need.
//!
//! Idempotent and quiet when everything is there; `apt-get update` runs only
//! when something is missing.

use std::process::{Command, Stdio};

use crate::Result;

/// Debian packages, a command whose success shows the tool is already there
/// by other means (empty: ask dpkg only), and why each is needed.
const PACKAGES: &[(&str, &[&str], &str)] = &[
    ("libclang-dev", &[], "bindgen for RocksDB's C API"),
    ("ccache", &[], "keeps the C/C++ of RocksDB and librdkafka compiled across clones"),
    ("g++", &["g++", "--version"], "RocksDB's C++"),
    ("make", &["make", "--version"], "librdkafka's build"),
    ("maven", &["mvn", "-v"], "fetches Apache Kafka for the broker the Kafka tests use"),
    ("openjdk-17-jre-headless", &["java", "-version"], "runs the Kafka broker"),
];

pub(crate) fn run() -> Result {
    let missing: Vec<_> = PACKAGES.iter().filter(|(p, probe, _)| !installed(p) && !runs(probe)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("==> setup: installing {} system package(s)", missing.len());
    for (package, _, why) in &missing {
        println!("    {package}: {why}");
    }
    let sudo = if is_root() { vec![] } else { vec!["sudo", "-n"] };
    apt(&sudo, &["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(missing.iter().map(|(p, _, _)| *p));
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
