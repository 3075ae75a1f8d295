//! The member processes of a run (`spate run --app`): started, watched
//! through what they print, stopped or killed, and measured from `/proc`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::topics::brokers;
use super::{HEARTBEAT_MS, OUT_OF_ORDERNESS_MS, PARTITIONS, WINDOW_MS};

/// CPU seconds (user and system) a process has used, from `/proc/<pid>/stat`.
pub(super) fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime: fields 14 and 15, in ticks of 1/100 s on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// A process's peak resident memory so far, MB, from `/proc/<pid>/status`.
pub(super) fn peak_rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

/// The CPU seconds the machine's processors have been busy so far (all but
/// idle and I/O wait), from `/proc/stat`.
pub(super) fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = stat.lines().next().unwrap_or_default();
    let values: Vec<f64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    let total: f64 = values.iter().take(8).sum();
    let idle = values.get(3).copied().unwrap_or(0.0) + values.get(4).copied().unwrap_or(0.0);
    // In ticks of 1/100 s.
    (total - idle) / 100.0
}

/// What a member printed, each line with when it was read.
pub(super) type Printed = Arc<Mutex<Vec<(Instant, String)>>>;

/// One `spate run --app` process.
pub(super) struct MemberProcess {
    app: String,
    id: String,
    pub(super) child: Child,
    stdout: Printed,
    stderr: Printed,
}

pub(super) fn collect(stream: impl std::io::Read + Send + 'static, into: Printed) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            into.lock().unwrap().push((Instant::now(), line));
        }
    });
}

/// The settings of a run's members.
pub(super) struct Run<'a> {
    /// The `spate` binary.
    pub(super) spate: &'a Path,
    pub(super) app: String,
    pub(super) input: &'a str,
    pub(super) output: &'a str,
    pub(super) checkpoint: &'a Path,
    pub(super) session_ms: u64,
    pub(super) quiet: bool,
    pub(super) without_repartition: bool,
    pub(super) allowed_lateness_ms: &'a str,
    pub(super) batch_ms: &'a str,
}

impl Run<'_> {
    pub(super) fn start_member(&self, id: &str) -> MemberProcess {
        let brokers = brokers();
        let (session, heartbeat) = (self.session_ms.to_string(), HEARTBEAT_MS.to_string());
        let late_topic = format!("{}-late", self.output);
        let mut args = vec![
            "run",
            "--app",
            &self.app,
            "--member-id",
            id,
            "--kafka",
            &brokers,
            "--topic",
            self.input,
            "--output-topic",
            self.output,
            "--checkpoint",
            self.checkpoint.to_str().unwrap(),
            "--batch-ms",
            self.batch_ms,
            "--session-timeout-ms",
            &session,
            "--heartbeat-interval-ms",
            &heartbeat,
            "--window-ms",
            WINDOW_MS,
            "--slide-ms",
            WINDOW_MS,
            "--out-of-orderness-ms",
            OUT_OF_ORDERNESS_MS,
            "--allowed-lateness-ms",
            self.allowed_lateness_ms,
            "--late-topic",
            &late_topic,
            "--top",
            "3",
        ];
        if self.quiet {
            args.push("--quiet");
        }
        if self.without_repartition {
            args.push("--without-repartition");
        }
        let mut child =
            Command::new(self.spate).args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let (stdout, stderr) = (Printed::default(), Printed::default());
        collect(child.stdout.take().unwrap(), Arc::clone(&stdout));
        collect(child.stderr.take().unwrap(), Arc::clone(&stderr));
        MemberProcess { app: self.app.clone(), id: id.to_string(), child, stdout, stderr }
    }

    /// The partitions of the topics the run's members read: the input and
    /// the internal ones.
    pub(super) fn topics(&self) -> Vec<(String, i32)> {
        let mut topics = vec![(self.input.to_string(), PARTITIONS)];
        if !self.without_repartition {
            topics.push((format!("{}-words", self.app), PARTITIONS));
        }
        topics.push((format!("{}-windows", self.app), 1));
        topics
    }
}

impl MemberProcess {
    /// The tasks it said it owns last (`member <id> given …; owns a, b`).
    pub(super) fn owned(&self) -> Vec<String> {
        let prefix = format!("member {} ", self.id);
        let stdout = self.stdout.lock().unwrap();
        let last = stdout.iter().rev().find_map(|(_, l)| l.strip_prefix(&prefix)?.split_once("; owns ").map(|x| x.1));
        match last {
            None | Some("nothing") => Vec::new(),
            Some(list) => list.split(", ").map(str::to_string).collect(),
        }
    }

    /// The last lines it wrote to stderr and stdout.
    pub(super) fn last_words(&self) -> String {
        let tail = |printed: &Printed| {
            let printed = printed.lock().unwrap();
            let lines: Vec<&str> = printed.iter().map(|(_, l)| l.as_str()).collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        format!("member {}: stderr:\n{}\nstdout:\n{}", self.id, tail(&self.stderr), tail(&self.stdout))
    }

    /// Fails the benchmark, with what the member said, if it has exited.
    pub(super) fn check_alive(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("member {} exited ({status}); {}", self.id, self.last_words());
        }
    }

    /// With `APP_BENCH_LOGS=DIR`, writes what it printed to
    /// `DIR/<app>-<member>.out` and `.err`.
    pub(super) fn keep_logs(&self) {
        let Some(dir) = std::env::var_os("APP_BENCH_LOGS") else { return };
        for (printed, ext) in [(&self.stdout, "out"), (&self.stderr, "err")] {
            let lines: Vec<String> = printed.lock().unwrap().iter().map(|(_, l)| l.clone()).collect();
            let path = Path::new(&dir).join(format!("{}-{}.{ext}", self.app, self.id));
            std::fs::write(&path, lines.join("\n")).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }

    pub(super) fn stop(mut self) {
        if self.child.try_wait().unwrap().is_some() {
            self.keep_logs();
            return;
        }
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                eprintln!("member {} did not leave in 60 s; killing it", self.id);
                self.child.kill().unwrap();
                self.child.wait().unwrap();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Its last lines are read before they are kept.
        std::thread::sleep(Duration::from_millis(100));
        self.keep_logs();
    }
}

impl Drop for MemberProcess {
    /// A benchmark that fails leaves no member running.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits until every member owns some of the `tasks` tasks and they own
/// all of them together.
pub(super) fn settled(members: &mut [MemberProcess], tasks: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let owned: Vec<usize> = members.iter().map(|m| m.owned().len()).collect();
        if owned.iter().all(|n| *n > 0) && owned.iter().sum::<usize>() == tasks {
            return;
        }
        for member in members.iter_mut() {
            member.check_alive();
        }
        assert!(Instant::now() < deadline, "the group did not settle in {limit:?}: members own {owned:?} of {tasks}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// When a member first printed a committed batch of `task` after `since`.
pub(super) fn first_batch_after(members: &[MemberProcess], task: &str, since: Instant) -> Option<Instant> {
    let prefix = format!("[{task}] batch ");
    members
        .iter()
        .filter_map(|m| {
            let stdout = m.stdout.lock().unwrap();
            stdout.iter().find(|(at, line)| *at > since && line.starts_with(&prefix)).map(|(at, _)| *at)
        })
        .min()
}

/// When a member first said it was given `task` after `since`
/// (`member <id> given a, b; owns …`).
pub(super) fn given_after(members: &[MemberProcess], task: &str, since: Instant) -> Option<Instant> {
    let names = |line: &str| -> bool {
        let Some((_, rest)) = line.split_once(" given ") else { return false };
        rest.split_once("; owns").is_some_and(|(given, _)| given.split(", ").any(|t| t == task))
    };
    members
        .iter()
        .filter_map(|m| {
            let stdout = m.stdout.lock().unwrap();
            stdout
                .iter()
                .find(|(at, line)| *at > since && line.starts_with("member ") && names(line))
                .map(|(at, _)| *at)
        })
        .min()
}
