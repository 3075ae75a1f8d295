//! Whether the process that wrote a lease still runs on this host.
//!
//! A pid alone cannot say it: pids are reused, and a pid means another
//! process in another pid namespace or after a reboot. So a lease records
//! its writer's [`ProcessIdentity`] (the boot, the pid namespace and the
//! process's start time in clock ticks since boot, field 22 of
//! `/proc/<pid>/stat`), and a later writer on the same host compares it
//! with what `/proc` shows now ([`liveness`]). Only a match of boot and
//! namespace lets it conclude anything; everything else is
//! [`Liveness::Unknown`], and the caller waits for the lease to run out.

// Reached only through the lease of an object store (the `s3` feature).
#![cfg_attr(not(feature = "s3"), allow(dead_code))]

use std::io::ErrorKind;

use serde::{Deserialize, Serialize};

/// What tells one process apart from every other on a host, over time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ProcessIdentity {
    /// The kernel's id of the current boot (`/proc/sys/kernel/random/boot_id`).
    #[serde(rename = "bootId")]
    pub(crate) boot: String,
    /// The pid namespace the pid is counted in (`/proc/self/ns/pid`).
    #[serde(rename = "pidNamespace")]
    pub(crate) pid_namespace: String,
    /// When the process started, in clock ticks since boot.
    #[serde(rename = "startTicks")]
    pub(crate) start_ticks: u64,
}

impl ProcessIdentity {
    /// This process's identity; `None` where `/proc` does not tell.
    pub(crate) fn current() -> Option<ProcessIdentity> {
        Some(ProcessIdentity {
            boot: boot_id()?,
            pid_namespace: pid_namespace()?,
            start_ticks: start_ticks(std::process::id()).ok()??,
        })
    }
}

/// Whether a recorded process still runs, as this process can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// The process runs: same pid and the same start time.
    Alive,
    /// The pid is free, or taken by a process that started at another time.
    Gone,
    /// Nothing can be concluded: another boot or namespace, nothing recorded, no `/proc`.
    Unknown,
}

/// Whether process `pid`, recorded with `recorded` by a writer on this host, still runs.
pub(crate) fn liveness(pid: u32, recorded: Option<&ProcessIdentity>) -> Liveness {
    let (Some(recorded), Some(ours)) = (recorded, ProcessIdentity::current()) else { return Liveness::Unknown };
    if recorded.boot != ours.boot || recorded.pid_namespace != ours.pid_namespace {
        return Liveness::Unknown;
    }
    match start_ticks(pid) {
        Ok(None) => Liveness::Gone,
        Ok(Some(ticks)) if ticks != recorded.start_ticks => Liveness::Gone,
        Ok(Some(_)) => Liveness::Alive,
        Err(_) => Liveness::Unknown,
    }
}

fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_string()).filter(|id| !id.is_empty())
}

fn pid_namespace() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid").ok().map(|link| link.to_string_lossy().into_owned())
}

/// The start time of process `pid` in clock ticks since boot; `None` when
/// there is no such process or it has ended (a zombie waiting to be reaped).
fn start_ticks(pid: u32) -> std::io::Result<Option<u64>> {
    let stat = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    parse_start_ticks(&stat)
        .ok_or_else(|| std::io::Error::new(ErrorKind::InvalidData, format!("/proc/{pid}/stat: {stat}")))
}

/// The start time in a `/proc/<pid>/stat` line; `Some(None)` for a process that has ended.
fn parse_start_ticks(stat: &str) -> Option<Option<u64>> {
    // The command name (field 2) is in parentheses and may hold spaces and ')'.
    let (_, after_name) = stat.rsplit_once(')')?;
    let mut fields = after_name.split_whitespace();
    // Field 3 is the state, field 22 the start time.
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return Some(None);
    }
    fields.nth(22 - 4)?.parse().ok().map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reaped_one_or_a_reused_pid_is_gone() {
        let ours = ProcessIdentity::current().expect("/proc tells this process's identity");
        assert_eq!(liveness(std::process::id(), Some(&ours)), Liveness::Alive);
        // Our pid, but a process that started at another time: the pid was reused.
        let earlier = ProcessIdentity { start_ticks: ours.start_ticks.wrapping_sub(1), ..ours.clone() };
        assert_eq!(liveness(std::process::id(), Some(&earlier)), Liveness::Gone);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(liveness(pid, Some(&ours)), Liveness::Gone);
        // Another boot or namespace, or nothing recorded: cannot tell.
        let rebooted = ProcessIdentity { boot: "another boot".into(), ..ours.clone() };
        assert_eq!(liveness(pid, Some(&rebooted)), Liveness::Unknown);
        let elsewhere = ProcessIdentity { pid_namespace: "pid:[1]".into(), ..ours };
        assert_eq!(liveness(pid, Some(&elsewhere)), Liveness::Unknown);
        assert_eq!(liveness(pid, None), Liveness::Unknown);
    }

    #[test]
    fn the_start_time_is_field_22_even_when_the_command_name_has_spaces_and_parentheses() {
        let fields: Vec<String> = (4..=30).map(|n| n.to_string()).collect();
        let stat = format!("77 (a (b) c) S {}\n", fields.join(" "));
        assert_eq!(parse_start_ticks(&stat), Some(Some(22)));
        assert_eq!(parse_start_ticks(&stat.replace(") S ", ") Z ")), Some(None), "a zombie has ended");
        assert_eq!(parse_start_ticks("77 (cut"), None);
    }
}
