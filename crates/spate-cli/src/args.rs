//! The command line, declared once with clap's derive: every command, flag,
//! default and help text of `spate`.

// The doc comments here are the command's help text, where `<checkpoint>`
// names a value as usage lines do, not an HTML tag.
#![allow(rustdoc::invalid_html_tags)]

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// The exit codes, shown at the end of `spate --help`.
pub(crate) const EXIT_CODES_HELP: &str = "\
Exit codes:
  0    ok (a job stopped by Ctrl-C or SIGTERM stopped gracefully)
  1    runtime error (I/O, a failed batch, a broken source or sink)
  2    usage error (unknown flag, bad value, malformed --json)
  3    checkpoint inconsistent, or the change was refused to keep it consistent
  4    the checkpoint is locked by another live writer (its pid is in the message),
       or another writer took it over while this one ran
  130  stopped at once by a second signal

Logging: RUST_LOG (e.g. RUST_LOG=spate_runtime=debug) or -v/-vv/-vvv; logs go to stderr, progress to stdout.";

/// spate: a fault-tolerant stream-processing engine. Nothing lost, nothing repeated.
#[derive(Debug, Parser)]
#[command(name = "spate", version, after_help = EXIT_CODES_HELP, propagate_version = true)]
pub struct Cli {
    /// More logging on stderr (-v: info, -vv: debug, -vvv: trace; default: warnings); RUST_LOG overrides it.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands of `spate`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the demo job without a broker: generated words, windowed word count, top words per window.
    ///
    /// Stop it with Ctrl-C and run it again: it resumes from its checkpoint,
    /// re-running the batch that was in flight with exactly its logged offsets.
    #[command(after_help = EXIT_CODES_HELP)]
    Demo(Box<DemoArgs>),
    /// Run the word-count pipeline on a Kafka topic, writing to a Kafka topic.
    #[command(after_help = EXIT_CODES_HELP)]
    Run(Box<RunArgs>),
    /// Look at, repair or change a checkpoint (a directory or s3://bucket/prefix).
    #[command(subcommand, after_help = EXIT_CODES_HELP)]
    Checkpoint(CheckpointCommand),
}

/// The demo's default rate: enough to show the engine at work, little
/// enough to leave a 2-core machine responsive.
pub(crate) const DEFAULT_DEMO_RATE: u64 = 2_000_000;

/// `spate demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// The checkpoint: a directory or s3://bucket/prefix (created on first
    /// run, resumed afterwards). With s3:// the demo also needs --wal-dir.
    #[arg(long, value_name = "LOCATION", default_value = "./spate-demo-checkpoint")]
    pub checkpoint: PathBuf,
    /// A local directory for the receiver's write-ahead log and the block
    /// tracker's event log (default: inside the checkpoint). Required with an
    /// s3:// checkpoint: these logs are appended to many times a second.
    /// A lost machine loses what they hold: blocks received but not yet in a
    /// committed batch.
    #[arg(long, value_name = "DIR")]
    pub wal_dir: Option<PathBuf>,
    /// Generated records per second. The default, 2 million a second with
    /// the write-ahead log on, keeps under a quarter of one core busy and
    /// under 100 MB resident on a small machine. A rate higher than the
    /// engine keeps up with is held back by --max-memory: the generator
    /// waits for each batch to make room.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DEMO_RATE, value_parser = clap::value_parser!(u64).range(1..))]
    pub rate: u64,
    /// Stop gracefully after this many seconds (default: run until Ctrl-C or SIGTERM).
    #[arg(long, value_name = "S")]
    pub seconds: Option<u64>,
    /// The generator's seed: the same seed generates the same words, so runs can be compared.
    #[arg(long, value_name = "N", default_value_t = 42)]
    pub seed: u64,
    /// How many distinct words the generator draws from (1 to 100 million;
    /// 10 million at most with a --zipf above 0). The default, 10,000, is
    /// a realistic vocabulary: the window holds thousands of keys, as a real
    /// word count does. --keys 32 is the demo's old toy vocabulary size.
    /// A resumed demo must keep the settings its output was made with.
    #[arg(long, value_name = "N", default_value_t = spate_runtime::demo::DEFAULT_DEMO_KEYS,
        value_parser = clap::value_parser!(u64).range(1..=spate_runtime::demo::MAX_DEMO_KEYS))]
    pub keys: u64,
    /// The Zipf exponent S of the draw: the r-th most frequent word comes
    /// 1/r^S as often as the first (0: every word equally often). The
    /// default, 1, is how word frequencies fall in natural language.
    #[arg(long, value_name = "S", default_value_t = spate_runtime::demo::DEFAULT_DEMO_ZIPF, value_parser = parse_zipf,
        allow_negative_numbers = true)]
    pub zipf: f64,
    /// How many top words to show per window.
    #[arg(long, value_name = "K", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub top: u64,
    /// Exactly-once file output: `batch-<N>.json` (a batch's word counts) and
    /// `window-<N>.json` (a window's top words), each written once, to a
    /// local directory. Default: <checkpoint>/output, or <wal-dir>/output
    /// with an s3:// checkpoint.
    #[arg(long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Also write every word count of each window as JSON lines, exactly
    /// once, partitioned by the window's end (UTC):
    /// LOCATION/dt=YYYY-MM-DD/hour=HH/part-*.jsonl, one line a word
    /// (`{"window_start_ms":…,"window_end_ms":…,"word":…,"count":…}`).
    /// LOCATION is a directory or s3://bucket/prefix (reached with the
    /// --s3-* flags, as an s3:// checkpoint). Readers skip names starting
    /// with `_` or `.`.
    #[arg(long, value_name = "LOCATION")]
    pub window_files: Option<PathBuf>,
    /// Stop gracefully once this batch id has committed (for tests and reproducible runs).
    #[arg(long, value_name = "ID", hide = true)]
    pub until_batch: Option<u64>,
    /// The batch interval in milliseconds (the demo's is 1000; the window stays 30 batches, the slide 2).
    #[arg(long, value_name = "MS", hide = true, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub batch_ms: Option<u64>,
    /// Print no progress lines (errors and the recovery line still go to stdout/stderr).
    #[arg(long, short)]
    pub quiet: bool,
    /// Serve metrics or the web page while the job runs.
    #[command(flatten)]
    pub watch: WatchArgs,
    /// The memory the received records may take.
    #[command(flatten)]
    pub memory: MemoryArgs,
    /// How to reach an s3:// checkpoint.
    #[command(flatten)]
    pub s3: S3Args,
}

/// A Zipf exponent: a finite number of at least 0.
fn parse_zipf(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(exponent) if exponent.is_finite() && exponent >= 0.0 => Ok(exponent),
        Ok(_) => Err(format!("{text} is not a finite number of at least 0")),
        Err(e) => Err(format!("{text} is not a number: {e}")),
    }
}

/// `spate run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Kafka bootstrap servers, e.g. `localhost:9092`.
    #[arg(long, value_name = "BROKERS")]
    pub kafka: String,
    /// The input topic.
    #[arg(long, value_name = "T")]
    pub topic: String,
    /// The output topic for the top words of each window.
    #[arg(long, value_name = "T2")]
    pub output_topic: String,
    /// The consumer group. Offsets are kept in the checkpoint; with --exactly-once the consumed
    /// offsets also commit to this group inside each output transaction, otherwise after each batch
    /// (for lag monitoring).
    #[arg(long, value_name = "G", default_value = "spate")]
    pub group: String,
    /// Write the output with Kafka transactions, committed with the batch: exactly once.
    #[arg(long)]
    pub exactly_once: bool,
    /// The checkpoint: a directory or s3://bucket/prefix.
    #[arg(long, value_name = "LOCATION", default_value = "./spate-checkpoint")]
    pub checkpoint: PathBuf,
    /// Most records read per partition per second (backpressure still applies below it).
    #[arg(long, value_name = "N")]
    pub max_rate_per_partition: Option<u64>,
    /// Most records one batch reads, all partitions together, shared by lag
    /// (default 500000). A backlog is read over several batches.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_records_per_batch: Option<u64>,
    /// Most bytes one batch reads: keys, values and about 100 bytes a record
    /// (default 67108864, 64 MiB, or a quarter of --max-memory when that is
    /// less; at most --max-memory). A partition always reads at least one
    /// record, so a larger record still goes through.
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_bytes_per_batch: Option<u64>,
    /// Where a new checkpoint starts reading: `earliest`, `latest`, or Spark's
    /// JSON spec `{"topic":{"0":36,"1":-2}}` (-2 earliest, -1 latest), e.g. the
    /// offsets `spate checkpoint inspect` shows for a Spark checkpoint.
    /// Ignored when the checkpoint has offsets.
    #[arg(long, value_name = "WHERE", default_value = "earliest")]
    pub starting_offsets: String,
    /// How many top words each window's output record holds.
    #[arg(long, value_name = "K", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub top: u64,
    /// Stop gracefully after this many seconds (default: run until Ctrl-C or SIGTERM).
    #[arg(long, value_name = "S")]
    pub seconds: Option<u64>,
    /// Stop gracefully once this batch id has committed.
    #[arg(long, value_name = "ID", hide = true)]
    pub until_batch: Option<u64>,
    /// The batch interval in milliseconds (the window is 30 batches, the slide 2) [default: 1000].
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub batch_ms: Option<u64>,
    /// Print no progress lines.
    #[arg(long, short)]
    pub quiet: bool,
    /// Serve metrics or the web page while the job runs.
    #[command(flatten)]
    pub watch: WatchArgs,
    /// The memory the records read may take.
    #[command(flatten)]
    pub memory: MemoryArgs,
    /// How to reach an s3:// checkpoint.
    #[command(flatten)]
    pub s3: S3Args,
    /// Running one application on several processes.
    #[command(flatten)]
    pub app: AppArgs,
}

/// The flags of `spate run --app`: one member of an application whose
/// members share the topic's partitions through a Kafka consumer group.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "One application on several processes or machines (--app)")]
pub struct AppArgs {
    /// Run as a member of application NAME: every process started with the same NAME, --kafka and
    /// --checkpoint (a directory on one machine, s3://bucket/prefix across machines) shares the
    /// topic's partitions through the consumer group NAME, exactly once (--exactly-once and --group
    /// do not apply). Counts go to --output-topic per event-time window, each window's top words to
    /// --top-topic.
    #[arg(long, value_name = "NAME")]
    pub app: Option<String>,
    /// This member's name, unique in the application and the same when it is restarted (default:
    /// HOST-PID). A second live member under a name in use is refused at start.
    #[arg(long, value_name = "ID")]
    pub member_id: Option<String>,
    /// The group drops a member without a heartbeat for this long and moves its partitions.
    #[arg(long, value_name = "MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1000..=3_600_000))]
    pub session_timeout_ms: u64,
    /// How often a member sends its heartbeat (less than a third of the session timeout).
    #[arg(long, value_name = "MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub heartbeat_interval_ms: u64,
    /// The group protocol: `classic` (cooperative-sticky assignment, KIP-429) or `consumer` (the
    /// broker-side protocol of KIP-848; session and heartbeat are then the broker's settings).
    #[arg(long, value_name = "P", default_value = "classic", value_parser = ["classic", "consumer"])]
    pub group_protocol: String,
    /// The broker aborts an open transaction of a member that died after this long; until then the
    /// partitions it wrote offsets of wait for it under their new owner (default: the session
    /// timeout, so the wait ends about when the group moves them).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1000..=900_000))]
    pub transaction_timeout_ms: Option<u64>,
    /// The event-time window of the counts, on the records' timestamps.
    #[arg(long, value_name = "MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub window_ms: u64,
    /// How often a window starts.
    #[arg(long, value_name = "MS", default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub slide_ms: u64,
    /// How far behind the latest record of its partition a record may arrive.
    #[arg(long, value_name = "MS", default_value_t = 5_000)]
    pub out_of_orderness_ms: u64,
    /// How long after its end a window still takes late records (and is written again).
    #[arg(long, value_name = "MS", default_value_t = 60_000)]
    pub allowed_lateness_ms: u64,
    /// A record stamped more than this ahead of the processing clock is not believed: it never
    /// moves the watermark and goes to the late records (--late-topic) instead of a window.
    #[arg(long, value_name = "MS", default_value_t = 3_600_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_future_ms: u64,
    /// Let an upstream task whose input stays empty this long stop holding the count stage's
    /// watermark, so the others' windows close (default: it holds it at its last record; its
    /// records are late if they come back behind the watermark after the timeout).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_ms: Option<u64>,
    /// Where the words counted late go: behind the watermark when every window they belong to is
    /// gone, or stamped more than --max-future-ms ahead (default: only counted, in
    /// spate_late_records_total and `spate checkpoint inspect`).
    #[arg(long, value_name = "T4")]
    pub late_topic: Option<String>,
    /// Where each window's top words go (default: OUTPUT_TOPIC-top).
    #[arg(long, value_name = "T3")]
    pub top_topic: Option<String>,
    /// A benchmark knob, hidden: count each input partition's words in the
    /// split stage itself, with no repartition through NAME-words. The
    /// counts are then per input partition, not per word across them; the
    /// app benchmark compares the two to measure what the hop costs.
    #[arg(long, hide = true)]
    pub without_repartition: bool,
}

#[cfg(feature = "kafka")]
impl AppArgs {
    /// The transaction timeout in force: the flag, or the session timeout.
    pub(crate) fn transaction_timeout_ms(&self) -> u64 {
        self.transaction_timeout_ms.unwrap_or(self.session_timeout_ms)
    }

    /// The topic of the windows' top words.
    pub(crate) fn top_topic(&self, output_topic: &str) -> String {
        self.top_topic.clone().unwrap_or_else(|| format!("{output_topic}-top"))
    }

    /// Refuses values that do not fit together, naming the flags.
    pub(crate) fn validate(&self) -> Result<(), crate::error::CliError> {
        if self.heartbeat_interval_ms.saturating_mul(3) > self.session_timeout_ms {
            return Err(crate::error::CliError::usage(format!(
                "--heartbeat-interval-ms {} must be at most a third of --session-timeout-ms {}",
                self.heartbeat_interval_ms, self.session_timeout_ms
            )));
        }
        let windows = self.window_ms.div_ceil(self.slide_ms.max(1));
        if windows > spate_dstream::MAX_WINDOWS_PER_RECORD {
            return Err(crate::error::CliError::usage(format!(
                "--window-ms {} sliding by --slide-ms {} puts every word in {windows} windows; at most {} are \
                 allowed (a slide of at least {} ms)",
                self.window_ms,
                self.slide_ms,
                spate_dstream::MAX_WINDOWS_PER_RECORD,
                self.window_ms.div_ceil(spate_dstream::MAX_WINDOWS_PER_RECORD)
            )));
        }
        if self.slide_ms > self.window_ms {
            return Err(crate::error::CliError::usage(format!(
                "--slide-ms {} is longer than --window-ms {}: records between windows would not be counted",
                self.slide_ms, self.window_ms
            )));
        }
        Ok(())
    }
}

/// The flags that serve what a running job shows: `/metrics` and the web
/// page, each off unless given, each printed as a URL on stderr at start.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Watching the job (both off by default; 127.0.0.1 keeps them on this machine)")]
pub struct WatchArgs {
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (HOST an IP address, e.g. 0.0.0.0:9464;
    /// a bare PORT binds 127.0.0.1; port 0: any free port).
    #[arg(long, value_name = "[HOST:]PORT", value_parser = listen_addr)]
    pub metrics_addr: Option<SocketAddr>,
    /// Serve the job's web page at http://HOST:PORT/ (batches, live charts, inputs, checkpoint, recovery;
    /// a bare PORT binds 127.0.0.1); the same address as --metrics-addr serves both.
    #[arg(long, value_name = "[HOST:]PORT", value_parser = listen_addr)]
    pub ui: Option<SocketAddr>,
}

/// The memory budget of a job's inputs.
#[derive(Debug, Clone, Args)]
pub struct MemoryArgs {
    /// Bytes the records received or read but not yet processed may take (e.g. 256M, 1G; K, M and
    /// G are powers of 1024). A receiver that would pass it waits until a batch has read its
    /// blocks (backpressure); a Kafka batch reads at most a quarter of it unless
    /// --max-bytes-per-batch says otherwise [default: 256M].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_memory: Option<u64>,

    /// A JSON file of the job's settings (batch_interval_ms, max_memory_bytes,
    /// max_records_per_batch, max_bytes_per_batch, wal_dir, metrics_addr, …; see the guide's
    /// settings page); an unknown field is refused. The flags given on the command line override it.
    #[arg(long, value_name = "FILE")]
    pub settings: Option<std::path::PathBuf>,

    /// Where the received blocks of an input read by a whole-batch operator spill beyond
    /// --max-memory (a folder per input, removed when it stops) [default: the system's temporary
    /// folder].
    #[arg(long, value_name = "DIR")]
    pub spill_dir: Option<std::path::PathBuf>,

    /// Bytes the spilled blocks of every input may take on disk together (e.g. 4G); when they
    /// are full, a receiver waits until a batch has read blocks out, and the log says so
    /// [default: 16 times --max-memory].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_spill: Option<u64>,
}

impl MemoryArgs {
    /// `settings` with the memory budget given.
    pub(crate) fn apply(&self, mut settings: spate_runtime::StreamingSettings) -> spate_runtime::StreamingSettings {
        if let Some(bytes) = self.max_memory {
            settings.max_memory_bytes = bytes;
        }
        if let Some(dir) = &self.spill_dir {
            settings.spill_dir = Some(dir.clone());
        }
        if let Some(bytes) = self.max_spill {
            settings.max_spill_bytes = Some(bytes);
        }
        settings
    }
}

/// `268435456`, `256M`, `256MiB`, `1G`: bytes, with K, M and G powers of 1024.
fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits);
    let number: u64 = number.parse().map_err(|_| format!("{text:?} is not a size: expected e.g. 256M or 1G"))?;
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        other => return Err(format!("unknown unit {other:?} in {text:?}: use K, M or G")),
    };
    let bytes = number.checked_mul(1 << shift).ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes == 0 {
        return Err("a size must be positive".into());
    }
    Ok(bytes)
}

/// `HOST:PORT` as given, or a bare `PORT` on 127.0.0.1: the job's pages
/// stay on this machine unless the user names another address.
fn listen_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse().map_err(|e| format!("{e}: expected PORT or HOST:PORT with HOST an IP address (e.g. 127.0.0.1:9464)"))
}

impl WatchArgs {
    /// `settings` with the addresses given.
    pub(crate) fn apply(&self, settings: spate_runtime::StreamingSettings) -> spate_runtime::StreamingSettings {
        let settings = match self.metrics_addr {
            Some(addr) => settings.with_metrics_addr(addr),
            None => settings,
        };
        match self.ui {
            Some(addr) => settings.with_ui_addr(addr),
            None => settings,
        }
    }
}

/// The flags that say how to reach an `s3://bucket/prefix` checkpoint,
/// shared by every command that takes a checkpoint. A flag left out comes
/// from the usual AWS environment variable; all are ignored for a local
/// directory.
#[derive(Clone, Default, Args)]
#[command(next_help_heading = "Checkpoints in S3 (each flag left out comes from its AWS_* environment variable)")]
pub struct S3Args {
    /// The S3 endpoint, e.g. http://127.0.0.1:8333 (default: AWS_ENDPOINT_URL, else AWS itself).
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// The region (default: AWS_REGION).
    #[arg(long, value_name = "REGION")]
    pub s3_region: Option<String>,
    /// The access key id (default: AWS_ACCESS_KEY_ID).
    #[arg(long, value_name = "ID")]
    pub s3_access_key_id: Option<String>,
    /// A file holding the secret access key, so it never shows in the
    /// process list; a trailing newline is ignored (default: AWS_SECRET_ACCESS_KEY).
    #[arg(long, value_name = "PATH")]
    pub s3_secret_access_key_file: Option<PathBuf>,
    /// Allow a plain http:// endpoint (default: AWS_ALLOW_HTTP).
    #[arg(long)]
    pub s3_allow_http: bool,
}

impl std::fmt::Debug for S3Args {
    // Never print a credential: the access key id shows only as set or not.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Args")
            .field("s3_endpoint", &self.s3_endpoint)
            .field("s3_region", &self.s3_region)
            .field("s3_access_key_id", &spate_logstore::redacted(&self.s3_access_key_id))
            .field("s3_secret_access_key_file", &self.s3_secret_access_key_file)
            .field("s3_allow_http", &self.s3_allow_http)
            .finish()
    }
}

/// `spate checkpoint …`.
#[derive(Debug, Subcommand)]
pub enum CheckpointCommand {
    /// Show a checkpoint: last offsets and commit ids, the recovery verdict, the
    /// offsets of the last batch, the lock holder and the size of each part.
    ///
    /// It also reads a Spark Structured Streaming checkpoint and prints its
    /// offsets, so a Spark job can move to spate without losing or repeating data.
    ///
    /// On an application's location (`spate run --app`: it holds tasks/ and no
    /// metadata of its own) it shows the application: a row per task (last
    /// committed batch, last offsets batch, verdict, lock holder) and the members
    /// (pid@host, from the task locks) with the tasks each holds or last held.
    #[command(after_help = EXIT_CODES_HELP)]
    Inspect {
        /// The checkpoint: a directory or s3://bucket/prefix.
        #[arg(value_name = "LOCATION")]
        dir: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// How to reach an s3:// checkpoint.
        #[command(flatten)]
        s3: S3Args,
    },
    /// Print the repair plan of an inconsistent checkpoint; --apply carries it out.
    ///
    /// Files are moved to <LOCATION>/_quarantine/<time>/, never deleted (in
    /// S3: copied there, then deleted from where they were). The writer lock
    /// is taken while applying, so a running job refuses it.
    #[command(after_help = EXIT_CODES_HELP)]
    Repair {
        /// The checkpoint: a directory or s3://bucket/prefix.
        #[arg(value_name = "LOCATION")]
        dir: PathBuf,
        /// Carry the plan out (without it nothing changes).
        #[arg(long)]
        apply: bool,
        /// How to reach an s3:// checkpoint.
        #[command(flatten)]
        s3: S3Args,
    },
    /// Write the offsets of one source for the next batch, through the log
    /// store and under the writer lock (refused while a job runs).
    ///
    /// The next run's first batch reads the source up to these offsets. With
    /// --commit the entry is also committed, so the next run starts *at* these
    /// offsets without reading the records before them (skip ahead or rewind).
    #[command(after_help = EXIT_CODES_HELP)]
    SetOffsets {
        /// The checkpoint: a directory or s3://bucket/prefix.
        #[arg(value_name = "LOCATION")]
        dir: PathBuf,
        /// The source's name (as `spate checkpoint inspect` lists it).
        #[arg(long, value_name = "S")]
        source: String,
        /// The source's offsets as JSON, e.g. '{"t":{"0":36}}'.
        #[arg(long, value_name = "JSON")]
        json: String,
        /// Also commit the entry: the next run starts at these offsets.
        #[arg(long)]
        commit: bool,
        /// How to reach an s3:// checkpoint.
        #[command(flatten)]
        s3: S3Args,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn set_offsets_parses() {
        let cli = Cli::try_parse_from([
            "spate",
            "checkpoint",
            "set-offsets",
            "/ck",
            "--source",
            "events",
            "--json",
            r#"{"t":{"0":36}}"#,
        ])
        .unwrap();
        let Command::Checkpoint(CheckpointCommand::SetOffsets { source, json, commit, .. }) = cli.command else {
            panic!("wrong command: {cli:?}");
        };
        assert_eq!((source.as_str(), json.as_str(), commit), ("events", r#"{"t":{"0":36}}"#, false));
    }

    #[test]
    fn every_command_with_a_checkpoint_takes_an_s3_location_and_the_s3_flags() {
        let s3 = ["--s3-endpoint", "http://h:1", "--s3-region", "r", "--s3-access-key-id", "id", "--s3-allow-http"];
        let commands: [&[&str]; 5] = [
            &["demo", "--checkpoint", "s3://b/p", "--wal-dir", "/w"],
            &["run", "--kafka", "k:9092", "--topic", "t", "--output-topic", "o", "--checkpoint", "s3://b/p"],
            &["checkpoint", "inspect", "s3://b/p"],
            &["checkpoint", "repair", "s3://b/p"],
            &["checkpoint", "set-offsets", "s3://b/p", "--source", "s", "--json", "1"],
        ];
        for command in commands {
            let argv = [&["spate"][..], command, &s3].concat();
            let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            let (location, flags) = match cli.command {
                Command::Demo(a) => (a.checkpoint, a.s3),
                Command::Run(a) => (a.checkpoint, a.s3),
                Command::Checkpoint(
                    CheckpointCommand::Inspect { dir, s3, .. }
                    | CheckpointCommand::Repair { dir, s3, .. }
                    | CheckpointCommand::SetOffsets { dir, s3, .. },
                ) => (dir, s3),
            };
            assert_eq!(location, PathBuf::from("s3://b/p"), "{argv:?}");
            assert_eq!(flags.s3_endpoint.as_deref(), Some("http://h:1"), "{argv:?}");
            assert_eq!((flags.s3_region.as_deref(), flags.s3_access_key_id.as_deref()), (Some("r"), Some("id")));
            assert!(flags.s3_allow_http && flags.s3_secret_access_key_file.is_none(), "{argv:?}");
            // The help names the location form.
            let mut help_argv = argv[..argv.len() - s3.len()].to_vec();
            help_argv.truncate(if command[0] == "checkpoint" { 3 } else { 2 });
            help_argv.push("--help");
            let help = Cli::try_parse_from(&help_argv).unwrap_err().to_string();
            assert!(help.contains("s3://bucket/prefix") && help.contains("--s3-secret-access-key-file"), "{help}");
        }
    }

    #[test]
    fn demo_and_run_take_the_watch_flags_both_off_by_default() {
        let cli =
            Cli::try_parse_from(["spate", "demo", "--metrics-addr", "127.0.0.1:0", "--ui", "[::1]:8080"]).unwrap();
        let Command::Demo(demo) = cli.command else { panic!("wrong command") };
        assert_eq!(demo.watch.metrics_addr, Some("127.0.0.1:0".parse().unwrap()));
        assert_eq!(demo.watch.ui, Some("[::1]:8080".parse().unwrap()));
        let settings = demo.watch.apply(spate_runtime::StreamingSettings::new(spate_core::Duration::from_secs(1)));
        assert_eq!((settings.metrics_addr, settings.ui_addr), (demo.watch.metrics_addr, demo.watch.ui));
        let run = ["spate", "run", "--kafka", "k:9092", "--topic", "t", "--output-topic", "o", "--ui", "127.0.0.1:1"];
        let Command::Run(run) = Cli::try_parse_from(run).unwrap().command else { panic!("wrong command") };
        assert_eq!((run.watch.metrics_addr, run.watch.ui), (None, Some("127.0.0.1:1".parse().unwrap())));
        let Command::Demo(plain) = Cli::try_parse_from(["spate", "demo"]).unwrap().command else { panic!() };
        assert_eq!((plain.watch.metrics_addr, plain.watch.ui), (None, None));
        // A bare port stays on this machine.
        let local = Cli::try_parse_from(["spate", "demo", "--ui", "8080"]).unwrap();
        let Command::Demo(local) = local.command else { panic!("demo") };
        assert_eq!(local.watch.ui, Some("127.0.0.1:8080".parse().unwrap()));
        assert!(Cli::try_parse_from(["spate", "demo", "--ui", "localhost:8080"]).is_err());
        let error = Cli::try_parse_from(["spate", "demo", "--metrics-addr", "localhost"]).unwrap_err().to_string();
        assert!(error.contains("--metrics-addr"), "{error}");
    }

    #[test]
    fn demo_defaults_and_bounds() {
        let cli = Cli::try_parse_from(["spate", "demo"]).unwrap();
        let Command::Demo(demo) = cli.command else { panic!("wrong command") };
        assert_eq!(demo.checkpoint, PathBuf::from("./spate-demo-checkpoint"));
        assert_eq!((demo.rate, demo.batch_ms, demo.seconds), (DEFAULT_DEMO_RATE, None, None));
        assert!(Cli::try_parse_from(["spate", "demo", "--rate", "0"]).is_err());
        assert!(Cli::try_parse_from(["spate", "run", "--topic", "t"]).is_err());
        // Any rate the machine can do: the memory budget holds back what it cannot.
        let fast = Cli::try_parse_from(["spate", "demo", "--rate", "50000000"]).unwrap();
        let Command::Demo(fast) = fast.command else { panic!("wrong command") };
        assert_eq!(fast.rate, 50_000_000);
    }

    #[test]
    fn demo_keys_and_zipf_default_to_a_realistic_vocabulary_and_are_checked() {
        let Command::Demo(demo) = Cli::try_parse_from(["spate", "demo"]).unwrap().command else { panic!() };
        assert_eq!((demo.keys, demo.zipf), (10_000, 1.0));
        let cli = Cli::try_parse_from(["spate", "demo", "--keys", "32", "--zipf", "0"]).unwrap();
        let Command::Demo(toy) = cli.command else { panic!() };
        assert_eq!((toy.keys, toy.zipf), (32, 0.0));
        for (flag, bad, says) in [
            ("--keys", "0", "0 is not in 1..=100000000"),
            ("--keys", "100000001", "not in 1..=100000000"),
            ("--keys", "many", "invalid digit"),
            ("--zipf", "-1", "-1 is not a finite number of at least 0"),
            ("--zipf", "NaN", "NaN is not a finite number"),
            ("--zipf", "inf", "inf is not a finite number"),
            ("--zipf", "steep", "steep is not a number"),
        ] {
            let error = Cli::try_parse_from(["spate", "demo", flag, bad]).unwrap_err().to_string();
            assert!(error.contains(flag) && error.contains(says), "{flag} {bad}: {error}");
        }
    }

    #[test]
    fn the_memory_budget_takes_sizes_in_binary_units() {
        let Command::Demo(demo) = Cli::try_parse_from(["spate", "demo"]).unwrap().command else { panic!() };
        let second = spate_core::Duration::from_secs(1);
        assert_eq!(
            demo.memory.apply(spate_runtime::StreamingSettings::new(second)).max_memory_bytes,
            spate_runtime::DEFAULT_MAX_MEMORY_BYTES
        );
        for (text, bytes) in [("1G", 1u64 << 30), ("64MiB", 64 << 20), ("512k", 512 << 10), ("1000", 1000)] {
            let cli = Cli::try_parse_from(["spate", "demo", "--max-memory", text]).unwrap();
            let Command::Demo(demo) = cli.command else { panic!() };
            assert_eq!(demo.memory.max_memory, Some(bytes), "{text}");
            let settings = demo.memory.apply(spate_runtime::StreamingSettings::new(spate_core::Duration::from_secs(1)));
            assert_eq!(settings.max_memory_bytes, bytes);
        }
        for bad in ["0", "12X", "M", "99999999999G"] {
            let error = Cli::try_parse_from(["spate", "demo", "--max-memory", bad]).unwrap_err().to_string();
            assert!(error.contains("--max-memory"), "{bad}: {error}");
        }
    }

    #[test]
    fn the_spill_limit_is_a_size_and_by_default_a_multiple_of_the_memory_budget() {
        let second = spate_core::Duration::from_secs(1);
        let Command::Demo(demo) = Cli::try_parse_from(["spate", "demo", "--max-memory", "64M"]).unwrap().command else {
            panic!()
        };
        assert_eq!(demo.memory.apply(spate_runtime::StreamingSettings::new(second)).spill_limit(), 1 << 30);
        let cli = Cli::try_parse_from(["spate", "demo", "--max-spill", "2G"]).unwrap();
        let Command::Demo(demo) = cli.command else { panic!() };
        assert_eq!(demo.memory.apply(spate_runtime::StreamingSettings::new(second)).spill_limit(), 2 << 30);
        let error = Cli::try_parse_from(["spate", "demo", "--max-spill", "0"]).unwrap_err().to_string();
        assert!(error.contains("--max-spill"), "{error}");
    }
}
