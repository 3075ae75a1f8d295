//! Retrying group-coordinator calls while the coordinator moves or loads.
//!
//! A consumer group's offsets live with its coordinator broker. Right after
//! a broker starts, after a leader change, or while `__consumer_offsets` is
//! being created, the broker answers offset reads and commits with *not
//! coordinator*, *coordinator not available* or *load in progress*. These
//! are transient: the client finds the coordinator again and the next call
//! works. librdkafka does not retry them on every path (an offset read
//! returns the first answer), so a batch would fail on a broker that is
//! merely busy. Here they are retried with a growing pause until the call's
//! own timeout is spent; every other error returns at once.

use std::time::{Duration, Instant};

use rdkafka::error::KafkaError as RdKafkaError;
use rdkafka::types::RDKafkaErrorCode;
use tracing::debug;

use crate::error::{KafkaError, client};

/// The first pause between attempts; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between attempts.
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Whether `error` says the group coordinator is moving or loading.
pub(crate) fn is_coordinator_transient(error: &RdKafkaError) -> bool {
    if let RdKafkaError::Transaction(e) = error
        && e.is_retriable()
    {
        return true;
    }
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorNotAvailable
                | RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::WaitingForCoordinator
        )
    )
}

/// Runs `call` (doing `operation`) until it succeeds, fails with an error
/// that is not coordinator-transient, or `timeout` has passed since the
/// first attempt; an error is the last one, with `operation` as context.
/// `call` gets the time left, to pass on as its own timeout.
pub(crate) fn retry_coordinator<T>(
    operation: impl Into<String>,
    timeout: Duration,
    mut call: impl FnMut(Duration) -> Result<T, RdKafkaError>,
) -> Result<T, KafkaError> {
    let operation = operation.into();
    let deadline = Instant::now() + timeout;
    let mut pause = FIRST_PAUSE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match call(left) {
            Err(e) if is_coordinator_transient(&e) && Instant::now() + pause < deadline => {
                debug!(operation, error = %e, ?pause, "coordinator not ready; retrying");
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_PAUSE);
            }
            result => return result.map_err(client(operation)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn not_coordinator() -> RdKafkaError {
        RdKafkaError::OffsetFetch(RDKafkaErrorCode::NotCoordinator)
    }

    #[test]
    fn coordinator_errors_are_transient_and_others_are_not() {
        assert!(is_coordinator_transient(&not_coordinator()));
        assert!(is_coordinator_transient(&RdKafkaError::MetadataFetch(RDKafkaErrorCode::CoordinatorLoadInProgress)));
        assert!(is_coordinator_transient(&RdKafkaError::ConsumerCommit(RDKafkaErrorCode::CoordinatorNotAvailable)));
        assert!(!is_coordinator_transient(&RdKafkaError::OffsetFetch(RDKafkaErrorCode::GroupAuthorizationFailed)));
        assert!(!is_coordinator_transient(&RdKafkaError::ConsumerCommit(RDKafkaErrorCode::UnknownTopicOrPartition)));
    }

    #[test]
    fn a_transient_error_is_retried_until_the_call_works() {
        let mut attempts = 0;
        let result = retry_coordinator("read", Duration::from_secs(10), |_| {
            attempts += 1;
            if attempts < 3 { Err(not_coordinator()) } else { Ok(attempts) }
        });
        assert_eq!(result.unwrap(), 3);
    }

    #[test]
    fn another_error_returns_after_one_attempt() {
        let mut attempts = 0;
        let result: Result<(), _> = retry_coordinator("read", Duration::from_secs(10), |_| {
            attempts += 1;
            Err(RdKafkaError::OffsetFetch(RDKafkaErrorCode::GroupAuthorizationFailed))
        });
        assert!(result.is_err());
        assert_eq!(attempts, 1);
    }

    #[test]
    fn a_coordinator_that_never_comes_back_fails_with_its_error_once_the_time_is_spent() {
        let mut attempts = 0;
        let mut lefts = Vec::new();
        let result: Result<(), _> = retry_coordinator("read", Duration::from_millis(200), |left| {
            attempts += 1;
            lefts.push(left);
            Err(not_coordinator())
        });
        match result.unwrap_err() {
            KafkaError::Client { operation, source } => {
                assert_eq!(operation, "read");
                assert_eq!(source.rdkafka_error_code(), Some(RDKafkaErrorCode::NotCoordinator));
            }
            other => panic!("not the client's error: {other}"),
        }
        assert!(attempts >= 2, "retried at least once: {attempts}");
        assert!(lefts.windows(2).all(|w| w[1] < w[0]), "each attempt gets the time left: {lefts:?}");
    }
}
