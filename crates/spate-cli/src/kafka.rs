//! `spate run`: the word-count pipeline on a Kafka topic.

use crate::args::RunArgs;
use crate::error::CliError;

/// Runs the Kafka pipeline until it is stopped.
pub(crate) fn run(args: &RunArgs) -> Result<String, CliError> {
    Err(CliError::Refused {
        message: format!(
            "`spate run` on Kafka ({} topic {} to {}) is not available in this build: the runtime does not \
             provide the Kafka pipeline yet; `spate demo` runs the same job without a broker",
            args.kafka, args.topic, args.output_topic
        ),
    })
}
