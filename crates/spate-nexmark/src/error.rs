//! The one error type of the crate.

/// What can go wrong building a generator or reading a source's offsets.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NexmarkError {
    /// A generator parameter the spec's formulas cannot work with.
    #[error("invalid Nexmark generator config: {field} {reason}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A source's logged offsets that do not read back.
    #[error("Nexmark source offsets {offsets:?} do not read back: {source}")]
    BadOffsets {
        /// The offsets as logged.
        offsets: String,
        /// Why they do not parse.
        source: serde_json::Error,
    },
    /// A replayable source asked to compute a batch it did not plan.
    #[error("the Nexmark source was asked for batch {time_ms} without its planned offsets")]
    MissingPlan {
        /// The batch time, in milliseconds.
        time_ms: i64,
    },
    /// Logged offsets whose range runs backwards.
    #[error("Nexmark source offsets {offsets:?} run backwards (from {from} > until {until})")]
    BackwardRange {
        /// The offsets as logged.
        offsets: String,
        /// Where the range starts.
        from: u64,
        /// Where it ends.
        until: u64,
    },
    /// A line of a side-input file (q13) that is not `key,value`.
    #[error("side input line {line}: {reason}")]
    BadSideInput {
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
}
