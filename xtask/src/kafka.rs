//! `cargo xtask kafka start|stop|restart|status`: the local broker for the Kafka tests.
//!
//! A real single-node Apache Kafka broker in KRaft mode (broker and controller
//! in one JVM), listening on 127.0.0.1 only:
//!
//! - Kafka's jars are fetched once with `mvn dependency:copy-dependencies` on
//!   a small generated pom in `<cache>/kafka/dist-<version>/`;
//! - every `start` makes a fresh data folder under the system temp folder (a
//!   copy of one formatted once with `kafka.tools.StorageTool format`) and
//!   runs `kafka.Kafka` with Java, log4j at WARN into `<cache>/kafka/run/broker.log`;
//! - `start` returns once the broker answers a Metadata request listing
//!   itself (bounded wait; on failure the error carries the log tail), and
//!   writes the pid, the bootstrap address and the data folder to
//!   `<cache>/kafka/run/`;
//! - `stop` stops the JVM (SIGTERM, then SIGKILL after a grace period) and
//!   removes the data folder;
//! - `restart` stops the JVM the same way and starts it again on the same
//!   ports and data folder, so topics, offsets and transactions survive:
//!   a broker restart as a job sees it (the fault tests use it);
//!   `--down-seconds S` leaves it stopped that long;
//! - `status` prints the address, pid and resident memory, and fails when no
//!   broker runs.
//!
//! `--instance NAME` after the command runs a second broker of its own
//! (run folder `<cache>/kafka/run-NAME/`, its own ports and data): tests that
//! pause or restart a broker use one, so the broker other tests share is
//! never disturbed. `stop` of an instance removes its run folder too.
//!
//! `cargo xtask test` wraps the tests in a [`Broker`] and exports
//! `SPATE_KAFKA_BROKERS=127.0.0.1:<port>` to them.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Result;
use crate::env::cache_dir;
use crate::process::{Options, free_port, log_tail, nanos, read_trimmed, resident_memory, runs_with, terminate, write};

/// The Apache Kafka release the tests run against (`org.apache.kafka:kafka_2.13`).
const KAFKA_VERSION: &str = "4.1.1";
/// The log4j2 binding for Kafka's slf4j 1.x logging, so its log goes to our file.
const LOG4J_VERSION: &str = "2.24.3";
/// The environment variable the Kafka tests read the bootstrap address from.
pub(crate) const BROKERS_ENV: &str = "SPATE_KAFKA_BROKERS";
/// How long `start` waits for the broker to answer.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How long `stop` waits after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(20);
/// JVM options: a small heap is plenty for tests and keeps the resident set small.
const JVM_OPTS: &[&str] = &["-Xms128m", "-Xmx768m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"];

const USAGE: &str = "usage: cargo xtask kafka start|stop|restart|status [--instance NAME] [--down-seconds S]";

pub(crate) fn run(args: &[String]) -> Result {
    let options = Options::parse(args.get(1..).unwrap_or_default()).map_err(|e| format!("{e}\n{USAGE}"))?;
    let run = match &options.instance {
        None => default_run_dir(),
        Some(name) => instance_run_dir(name),
    };
    match args.first().map(String::as_str) {
        Some("start") => {
            crate::setup::ensure(&[crate::setup::Need::Broker])?;
            let running = start(&run)?;
            println!(
                "kafka: Apache Kafka {KAFKA_VERSION} at {} (pid {}); export {BROKERS_ENV}={}",
                running.bootstrap, running.pid, running.bootstrap
            );
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
            println!("kafka: Apache Kafka {KAFKA_VERSION} at {} (pid {}), data kept", running.bootstrap, running.pid);
            Ok(())
        }
        Some("status") => status(&run),
        _ => Err(USAGE.into()),
    }
}

/// The broker a test run uses; stopped when dropped if this run started it.
pub(crate) struct Broker {
    bootstrap: String,
    owned: bool,
}

impl Broker {
    /// Starts the broker the Kafka tests need, unless `SPATE_KAFKA_BROKERS`
    /// already names one or `cargo xtask kafka start` left one running (then
    /// that one is used and left running).
    pub(crate) fn start_for_tests() -> Result<Broker> {
        if let Ok(bootstrap) = std::env::var(BROKERS_ENV)
            && !bootstrap.trim().is_empty()
        {
            println!("==> kafka: using {BROKERS_ENV}={bootstrap}");
            return Ok(Broker { bootstrap, owned: false });
        }
        if let Some(running) = Running::load(&default_run_dir())? {
            println!("==> kafka: using the running broker at {}", running.bootstrap);
            return Ok(Broker { bootstrap: running.bootstrap, owned: false });
        }
        println!("==> kafka: starting Apache Kafka {KAFKA_VERSION}");
        let running = start(&default_run_dir())?;
        Ok(Broker { bootstrap: running.bootstrap, owned: true })
    }

    /// Tells the tests where the broker listens.
    pub(crate) fn export_to(&self, command: &mut Command) {
        command.env(BROKERS_ENV, &self.bootstrap);
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if self.owned
            && let Err(e) = stop(&default_run_dir())
        {
            eprintln!("xtask kafka: could not stop the broker: {e}");
        }
    }
}

/// A broker this xtask started, as recorded in the run folder.
struct Running {
    pid: u32,
    bootstrap: String,
    data_dir: PathBuf,
    /// The run folder holding these files, the configuration and the log.
    run: PathBuf,
}

impl Running {
    fn load(run: &Path) -> Result<Option<Running>> {
        let dir = run.to_path_buf();
        let Ok(pid) = std::fs::read_to_string(dir.join("broker.pid")) else { return Ok(None) };
        let pid: u32 = pid.trim().parse().map_err(|e| format!("{}: bad pid {pid:?}: {e}", dir.display()))?;
        let bootstrap = read_trimmed(&dir.join("bootstrap"))?;
        let data_dir = PathBuf::from(read_trimmed(&dir.join("data_dir"))?);
        let running = Running { pid, bootstrap, data_dir, run: dir };
        if running.is_alive() {
            Ok(Some(running))
        } else {
            // A broker that died (or a machine that rebooted) leaves stale files.
            running.clean_up();
            Ok(None)
        }
    }

    fn save(&self) -> Result {
        let dir = &self.run;
        write(&dir.join("bootstrap"), &self.bootstrap)?;
        write(&dir.join("data_dir"), &self.data_dir.display().to_string())?;
        write(&dir.join("broker.pid"), &self.pid.to_string())
    }

    /// Alive and still our broker: its command line names our run folder's
    /// configuration, which neither a recycled pid nor another instance has.
    fn is_alive(&self) -> bool {
        runs_with(self.pid, &self.run.join("server.properties").display().to_string())
    }

    fn clean_up(&self) {
        let _ = std::fs::remove_dir_all(&self.data_dir);
        self.forget();
    }

    /// Removes the files naming the process, keeping its data.
    fn forget(&self) {
        let _ = std::fs::remove_file(self.run.join("broker.pid"));
        let _ = std::fs::remove_file(self.run.join("bootstrap"));
        let _ = std::fs::remove_file(self.run.join("data_dir"));
    }
}

fn kafka_dir() -> PathBuf {
    cache_dir().join("kafka")
}

/// The run folder of the broker `cargo xtask test` and a plain `kafka start` use.
fn default_run_dir() -> PathBuf {
    kafka_dir().join("run")
}

/// The run folder of the instance `name` (checked by [`Options::parse`]).
fn instance_run_dir(name: &str) -> PathBuf {
    kafka_dir().join(format!("run-{name}"))
}

fn start(run: &Path) -> Result<Running> {
    if let Some(running) = Running::load(run)? {
        println!("kafka: already running at {} (pid {})", running.bootstrap, running.pid);
        return Ok(running);
    }
    let classpath = fetch_distribution()?;
    let run = run.to_path_buf();
    std::fs::create_dir_all(&run).map_err(|e| format!("{}: {e}", run.display()))?;
    let (port, controller_port) = (free_port()?, free_port()?);
    let data_dir = std::env::temp_dir().join(format!("spate-kafka-{}-{}", std::process::id(), nanos()));
    std::fs::create_dir_all(&data_dir).map_err(|e| format!("{}: {e}", data_dir.display()))?;
    let properties = run.join("server.properties");
    write(&properties, &server_properties(port, controller_port, &data_dir))?;
    let _ = std::fs::remove_file(run.join("broker.log"));
    let log4j = run.join("log4j2.properties");
    write(&log4j, &log4j_properties(&run.join("broker.log")))?;

    let started = Instant::now();
    let template = formatted_template(&classpath, &log4j)?;
    copy_dir(&template, &data_dir)?;
    let bootstrap = format!("127.0.0.1:{port}");
    let running = launch(&classpath, &run, bootstrap, data_dir, started)?;
    println!(
        "kafka: up in {:.1?} (data folder, JVM start, first Metadata answer), resident memory {}",
        started.elapsed(),
        resident_memory(running.pid)
    );
    Ok(running)
}

/// Runs the broker of the configuration in `run` on `data_dir`, records it
/// and waits until it answers; on failure stops it and returns the log tail.
fn launch(classpath: &str, run: &Path, bootstrap: String, data_dir: PathBuf, started: Instant) -> Result<Running> {
    let (log4j, properties) = (run.join("log4j2.properties"), run.join("server.properties"));
    let mut child = spawn_broker(classpath, &log4j, &properties, &run.join("broker.out"))?;
    let running = Running { pid: child.id(), bootstrap, data_dir, run: run.to_path_buf() };
    running.save()?;
    if let Err(e) = wait_until_ready(&running, &mut child, started) {
        let _ = stop(run);
        return Err(format!("{e}\n--- broker log tail ---\n{}", log_tail(run, &["broker.log", "broker.out"])));
    }
    Ok(running)
}

fn stop(run: &Path) -> Result {
    let Some(running) = Running::load(run)? else {
        println!("kafka: not running");
        return Ok(());
    };
    terminate(running.pid, || running.is_alive(), STOP_GRACE, "kafka")?;
    running.clean_up();
    println!("kafka: stopped (pid {}), data removed", running.pid);
    Ok(())
}

/// Stops the broker (SIGTERM: a clean shutdown, as an operator's restart
/// does) and starts it again with the same configuration, so on the same
/// ports, and the same data folder.
fn restart(run: &Path, down: Duration) -> Result<Running> {
    let Some(running) = Running::load(run)? else {
        return Err("not running (start it with `cargo xtask kafka start`)".into());
    };
    // A paused broker acts on SIGTERM only once it runs again.
    let _ = Command::new("kill").args(["-CONT", &running.pid.to_string()]).status();
    terminate(running.pid, || running.is_alive(), STOP_GRACE, "kafka")?;
    running.forget();
    println!("kafka: stopped (pid {}), data kept in {}", running.pid, running.data_dir.display());
    if !down.is_zero() {
        // An outage of a known length, for the fault tests.
        println!("kafka: staying down for {down:?}");
        std::thread::sleep(down);
    }
    let started = Instant::now();
    let classpath = fetch_distribution()?;
    let again = launch(&classpath, run, running.bootstrap.clone(), running.data_dir.clone(), started)?;
    println!("kafka: up again in {:.1?} (pid {})", started.elapsed(), again.pid);
    Ok(again)
}

fn status(run: &Path) -> Result {
    match Running::load(run)? {
        Some(running) => {
            let rss = resident_memory(running.pid);
            let answers = metadata_lists_a_broker(&running.bootstrap);
            println!(
                "kafka: Apache Kafka {KAFKA_VERSION} at {} (pid {}), resident memory {rss}, {}, data in {}",
                running.bootstrap,
                running.pid,
                if answers { "answering" } else { "NOT answering" },
                running.data_dir.display()
            );
            if answers { Ok(()) } else { Err("the broker process runs but does not answer".into()) }
        }
        None => Err("not running (start it with `cargo xtask kafka start`)".into()),
    }
}

/// Fetches Kafka's jars once; returns the classpath (`<lib>/*`).
fn fetch_distribution() -> Result<String> {
    let dist = kafka_dir().join(format!("dist-{KAFKA_VERSION}"));
    let lib = dist.join("lib");
    let done = dist.join("fetched");
    if !done.exists() {
        std::fs::create_dir_all(&dist).map_err(|e| format!("{}: {e}", dist.display()))?;
        write(&dist.join("pom.xml"), &pom())?;
        println!("kafka: fetching Apache Kafka {KAFKA_VERSION} with mvn into {}", lib.display());
        let output = Command::new("mvn")
            .args(["-B", "-q", "dependency:copy-dependencies", "-DincludeScope=runtime"])
            .arg(format!("-DoutputDirectory={}", lib.display()))
            .current_dir(&dist)
            .output()
            .map_err(|e| format!("could not run mvn ({e}); `cargo xtask setup` installs maven"))?;
        if !output.status.success() {
            return Err(format!(
                "mvn could not fetch Apache Kafka {KAFKA_VERSION} ({}):\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        write(&done, KAFKA_VERSION)?;
    }
    Ok(format!("{}/*", lib.display()))
}

fn pom() -> String {
    format!(
        r#"<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>spate.local</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{KAFKA_VERSION}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{LOG4J_VERSION}</version>
    </dependency>
  </dependencies>
</project>
"#
    )
}

fn server_properties(port: u16, controller_port: u16, data_dir: &Path) -> String {
    format!(
        "process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={}
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.check.interval.ms=1000
# A dead member's open transaction is aborted within a second of its
# timeout (the default checks every 10 s), so its partitions' new owner
# waits for it about as long as the group takes to move them.
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
",
        data_dir.display()
    )
}

fn log4j_properties(log: &Path) -> String {
    format!(
        "status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
",
        log.display()
    )
}

fn java(classpath: &str, log4j: &Path) -> Command {
    let mut c = Command::new("java");
    c.args(JVM_OPTS).arg(format!("-Dlog4j2.configurationFile={}", log4j.display())).arg("-cp").arg(classpath);
    c
}

/// A data folder formatted once (`kafka-storage format`), copied into each
/// fresh data folder: a start saves the formatting JVM's second or two.
fn formatted_template(classpath: &str, log4j: &Path) -> Result<PathBuf> {
    let template = kafka_dir().join(format!("formatted-{KAFKA_VERSION}"));
    if template.join("meta.properties").exists() {
        return Ok(template);
    }
    let staging = kafka_dir().join(format!("formatting-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| format!("{}: {e}", staging.display()))?;
    let properties = staging.join("format.properties");
    // The ports are not written to the formatted folder; only the node and cluster ids are.
    write(&properties, &server_properties(1, 2, &staging.join("data")))?;
    format_storage(classpath, log4j, &properties)?;
    let _ = std::fs::remove_dir_all(&template);
    std::fs::rename(staging.join("data"), &template).map_err(|e| format!("{}: {e}", template.display()))?;
    let _ = std::fs::remove_dir_all(&staging);
    Ok(template)
}

fn copy_dir(from: &Path, to: &Path) -> Result {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    let entries = std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", from.display()))?;
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target).map_err(|e| format!("{}: {e}", target.display()))?;
        }
    }
    Ok(())
}

fn format_storage(classpath: &str, log4j: &Path, properties: &Path) -> Result {
    let output = java(classpath, log4j)
        .args(["kafka.tools.StorageTool", "format", "--ignore-formatted", "-t", &cluster_id(), "-c"])
        .arg(properties)
        .output()
        .map_err(|e| format!("could not run java ({e}); `cargo xtask setup` installs openjdk-17-jre-headless"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "kafka-storage format failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

fn spawn_broker(classpath: &str, log4j: &Path, properties: &Path, out: &Path) -> Result<Child> {
    use std::os::unix::process::CommandExt;
    let out_file = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let err_file = out_file.try_clone().map_err(|e| format!("{}: {e}", out.display()))?;
    let child = java(classpath, log4j)
        .arg("kafka.Kafka")
        .arg(properties)
        .stdin(Stdio::null())
        .stdout(out_file)
        .stderr(err_file)
        // Its own process group: a Ctrl-C meant for cargo does not kill it half-way.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("could not start java: {e}"))?;
    Ok(child)
}

fn wait_until_ready(running: &Running, child: &mut Child, started: Instant) -> Result {
    while started.elapsed() < START_TIMEOUT {
        // The child itself, not /proc/<pid>/cmdline: right after the fork
        // that still shows this process's command line.
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the broker (pid {}) exited during start ({status})", running.pid));
        }
        if metadata_lists_a_broker(&running.bootstrap) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("the broker at {} did not answer within {START_TIMEOUT:?}", running.bootstrap))
}

/// Sends a Metadata v0 request and checks the answer lists at least one broker:
/// the listener is up and the broker has registered with its controller.
fn metadata_lists_a_broker(bootstrap: &str) -> bool {
    let Ok(addr) = bootstrap.parse() else { return false };
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let client_id = b"xtask";
    let mut body = Vec::new();
    body.extend_from_slice(&3i16.to_be_bytes()); // api key: Metadata
    body.extend_from_slice(&0i16.to_be_bytes()); // version 0
    body.extend_from_slice(&7i32.to_be_bytes()); // correlation id
    body.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    body.extend_from_slice(client_id);
    body.extend_from_slice(&0i32.to_be_bytes()); // no topics
    let mut request = (body.len() as i32).to_be_bytes().to_vec();
    request.extend_from_slice(&body);
    if stream.write_all(&request).is_err() {
        return false;
    }
    let mut header = [0u8; 12]; // size, correlation id, broker count
    if stream.read_exact(&mut header).is_err() {
        return false;
    }
    let correlation = i32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    let brokers = i32::from_be_bytes([header[8], header[9], header[10], header[11]]);
    correlation == 7 && brokers > 0
}

/// A random-enough cluster id in Kafka's shape: 16 bytes, base64url, no padding.
fn cluster_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut seed = nanos() ^ (u128::from(std::process::id()) << 64);
    let mut id = String::new();
    for i in 0..22 {
        // The last character holds only 2 bits of the 128.
        let digit = if i == 21 { (seed & 0x3) << 4 } else { seed & 0x3f };
        id.push(ALPHABET[digit as usize] as char);
        seed = seed.rotate_right(6).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835) ^ 0x5bd1_e995;
    }
    id
}
