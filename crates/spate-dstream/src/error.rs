//! The error type of spate-dstream.

use std::fmt;
use std::path::PathBuf;

use spate_core::{BatchId, CoreError, Duration, Time};
use thiserror::Error;

/// A boxed error from user code (a source, a sink, a transform function).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Everything that can go wrong building, running or restoring a graph.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DStreamError {
    /// The graph is not valid; every problem found is listed.
    #[error("invalid stream graph: {}", join(problems))]
    InvalidGraph {
        /// The problems, each naming its operator.
        problems: Vec<GraphProblem>,
    },
    /// A batch time that is not a multiple of the batch interval.
    #[error("batch time {time} is not a multiple of the batch interval {interval}")]
    UnalignedBatchTime {
        /// The time asked for.
        time: Time,
        /// The graph's batch interval.
        interval: Duration,
    },
    /// Batches must run in increasing time order.
    #[error("batch time {time} is not after the previous batch time {previous}")]
    TimeNotIncreasing {
        /// The time asked for.
        time: Time,
        /// The last time that ran.
        previous: Time,
    },
    /// An input source failed to plan or produce a batch.
    #[error("input `{input}` failed at batch time {time}: {source}")]
    Source {
        /// The input's name.
        input: String,
        /// The batch time.
        time: Time,
        /// What the source said.
        source: BoxError,
    },
    /// A replayable input was run without the offsets planned for it.
    #[error("input `{input}` is replayable but batch time {time} has no planned offsets for it")]
    MissingPlan {
        /// The input's name.
        input: String,
        /// The batch time.
        time: Time,
    },
    /// A transformation failed.
    #[error("operator `{operator}` failed at batch time {time}: {source}")]
    Operator {
        /// The operator's name.
        operator: String,
        /// The batch time.
        time: Time,
        /// What went wrong.
        source: BoxError,
    },
    /// A user function panicked inside a partition task.
    #[error("operator `{operator}` panicked at batch time {time}: {message}")]
    TaskPanicked {
        /// The operator's name.
        operator: String,
        /// The batch time.
        time: Time,
        /// The panic message.
        message: String,
    },
    /// An output operation failed.
    #[error("output `{operator}` failed for batch {batch_id} (time {time}): {source}")]
    Output {
        /// The output's name.
        operator: String,
        /// The batch id.
        batch_id: BatchId,
        /// The batch time.
        time: Time,
        /// What the sink said.
        source: BoxError,
    },
    /// Writing a batch's text files failed.
    #[error("output `{operator}` could not write {}: {source}", path.display())]
    Io {
        /// The output's name.
        operator: String,
        /// The path being written.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The checkpointed graph holds state for operators that the new graph
    /// no longer has, and the restore policy does not allow dropping them.
    #[error(
        "the checkpoint holds state for operators missing from the new graph: {}; \
         give them their old names or restore with RestorePolicy::allow_dropping_removed()",
        operators.join(", ")
    )]
    RemovedOperators {
        /// The names of the removed stateful operators.
        operators: Vec<String>,
    },
    /// Stateful operators with the same name changed incompatibly.
    #[error("the checkpointed state does not fit the new graph: {}", differences.join("; "))]
    IncompatibleState {
        /// One line per difference, naming the operator, the field, old and new.
        differences: Vec<String>,
    },
    /// The descriptor names a stateful operator whose state bytes are missing.
    #[error("the checkpoint describes operator `{operator}` but holds no state for it")]
    MissingState {
        /// The operator's name.
        operator: String,
    },
    /// State bytes were given for an operator the descriptor does not describe.
    #[error("state given for operator `{operator}`, which the checkpointed descriptor does not list")]
    UnexpectedState {
        /// The operator's name.
        operator: String,
    },
    /// An operator's state could not be encoded.
    #[error("state of operator `{operator}` does not encode: {source}")]
    StateEncode {
        /// The operator's name.
        operator: String,
        /// The codec's error.
        source: CoreError,
    },
    /// An operator's checkpointed state could not be decoded.
    #[error("state of operator `{operator}` does not decode: {source}")]
    StateDecode {
        /// The operator's name.
        operator: String,
        /// The codec's error.
        source: CoreError,
    },
    /// The graph's internal bookkeeping disagreed with itself.
    #[error("internal error in operator `{operator}`: {reason}")]
    Internal {
        /// The operator's name.
        operator: String,
        /// What was inconsistent.
        reason: String,
    },
}

/// One reason a graph is invalid, found when it is built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GraphProblem {
    /// The graph has no output operation at all.
    NoOutputs,
    /// A stream whose result nobody consumes (Spark's "No output operations registered").
    NoOutput {
        /// The operator whose result is unused.
        operator: String,
    },
    /// A window or slide that is not a whole multiple of the batch interval.
    WindowNotMultiple {
        /// The window operator.
        operator: String,
        /// Which duration: `"window"` or `"slide"`.
        which: &'static str,
        /// The duration given.
        duration: Duration,
        /// The batch interval.
        batch_interval: Duration,
    },
    /// A stateful operator in a graph without a checkpoint directory.
    NeedsCheckpoint {
        /// The stateful operator.
        operator: String,
        /// Its kind.
        kind: &'static str,
    },
    /// Two streams with different slide durations were combined.
    SlideMismatch {
        /// The combining operator.
        operator: String,
        /// The slides of its parents.
        slides: Vec<Duration>,
    },
    /// Two operators have the same name.
    DuplicateName {
        /// The name.
        name: String,
    },
    /// An empty name, or one with a `/` (names become checkpoint directories).
    BadName {
        /// The name.
        name: String,
    },
    /// Event-time windows that cannot be computed (an empty window, a
    /// slide longer than the window).
    BadEventWindows {
        /// The windowed operator.
        operator: String,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for GraphProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GraphProblem::NoOutputs => write!(f, "No output operations registered, so nothing to execute"),
            GraphProblem::NoOutput { operator } => write!(
                f,
                "No output operations registered for `{operator}`: its result is never consumed \
                 (add an output such as foreach_batch, or remove it)"
            ),
            GraphProblem::WindowNotMultiple { operator, which, duration, batch_interval } => write!(
                f,
                "`{operator}`: {which} duration {duration} is not a multiple of the batch interval {batch_interval}"
            ),
            GraphProblem::NeedsCheckpoint { operator, kind } => write!(
                f,
                "`{operator}` ({kind}) keeps state and needs a checkpoint directory; configure one on the graph builder"
            ),
            GraphProblem::SlideMismatch { operator, slides } => {
                write!(f, "`{operator}` combines streams with different slide durations {slides:?}")
            }
            GraphProblem::DuplicateName { name } => write!(f, "two operators are named `{name}`"),
            GraphProblem::BadName { name } => {
                write!(f, "operator name `{name}` is empty or contains `/`, `\\` or `..`")
            }
            GraphProblem::BadEventWindows { operator, reason } => write!(f, "`{operator}`: {reason}"),
        }
    }
}

fn join(problems: &[GraphProblem]) -> String {
    problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}
