//! What the local test servers (Kafka, S3) share: loopback ports, stopping
//! a process, its memory, the log tail and the small files of a run folder.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::Result;

/// The options after `kafka`/`s3 <command>`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Options {
    /// `--instance NAME`: a server of its own instead of the shared one.
    pub(crate) instance: Option<String>,
    /// `--down-seconds S`: how long `restart` leaves the server stopped.
    pub(crate) down: Duration,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Options> {
        let mut options = Options::default();
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--instance" => {
                    let valid =
                        !value.is_empty() && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
                    if !valid {
                        return Err(format!("bad instance name {value:?}: letters, digits, - and _ only"));
                    }
                    options.instance = Some(value.clone());
                }
                "--down-seconds" => {
                    let seconds: u64 = value.parse().map_err(|e| format!("--down-seconds {value:?}: {e}"))?;
                    options.down = Duration::from_secs(seconds);
                }
                _ => return Err(format!("unknown option {flag}")),
            }
        }
        Ok(options)
    }
}

/// A loopback port free right now (the kernel's choice, from its ephemeral range).
pub(crate) fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free loopback port: {e}"))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| format!("no free loopback port: {e}"))
}

/// Stops `pid`: SIGTERM, then SIGKILL if `alive` still holds after `grace`.
/// `what` names the server in the messages.
pub(crate) fn terminate(pid: u32, alive: impl Fn() -> bool, grace: Duration, what: &str) -> Result {
    signal(pid, "TERM")?;
    let deadline = Instant::now() + grace;
    while alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if alive() {
        eprintln!("{what}: pid {pid} did not stop within {grace:?}; killing it");
        kill(pid, alive)?;
    }
    Ok(())
}

/// Stops `pid` with SIGKILL and waits until `alive` no longer holds.
pub(crate) fn kill(pid: u32, alive: impl Fn() -> bool) -> Result {
    signal(pid, "KILL")?;
    while alive() {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn signal(pid: u32, name: &str) -> Result {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .map_err(|e| format!("could not run kill: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("kill -{name} {pid} failed ({status})")) }
}

/// Whether `pid` runs a command line containing `marker`: a recycled pid
/// running something else, or a zombie (empty command line), does not.
pub(crate) fn runs_with(pid: u32, marker: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(marker))
}

/// Resident memory as text ("123 MiB" or "unknown"), from /proc.
pub(crate) fn resident_memory(pid: u32) -> String {
    rss(pid).map_or_else(|| "unknown".into(), |kib| format!("{} MiB", kib / 1024))
}

/// Resident memory in KiB, from /proc.
fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The last 30 lines of each of the `names` files in `run` that exist.
pub(crate) fn log_tail(run: &Path, names: &[&str]) -> String {
    let mut tail = String::new();
    for name in names {
        if let Ok(text) = std::fs::read_to_string(run.join(name)) {
            let lines: Vec<&str> = text.lines().collect();
            tail.push_str(&format!("[{name}]\n"));
            for line in &lines[lines.len().saturating_sub(30)..] {
                tail.push_str(line);
                tail.push('\n');
            }
        }
    }
    tail
}

pub(crate) fn nanos() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

pub(crate) fn read_trimmed(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).map_err(|e| format!("{}: {e}", path.display()))
}

pub(crate) fn write(path: &Path, text: &str) -> Result {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options> {
        Options::parse(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn options_name_an_instance_and_a_down_time_or_are_refused() {
        assert_eq!(parse(&[]), Ok(Options::default()));
        let both = parse(&["--down-seconds", "20", "--instance", "fault-1"]);
        assert_eq!(both, Ok(Options { instance: Some("fault-1".into()), down: Duration::from_secs(20) }));
        assert!(parse(&["--instance"]).is_err(), "a flag without its value");
        assert!(parse(&["--instance", "../x"]).is_err(), "a name that leaves the cache folder");
        assert!(parse(&["--down-seconds", "soon"]).is_err());
        assert!(parse(&["--port", "1"]).is_err());
    }
}
