//! Retrying calls while the group coordinator moves or loads, and while
//! the broker is away.
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
//!
//! A broker that is paused, restarting or unreachable makes metadata and
//! watermark requests time out, then answer *unknown partition* or *not
//! leader* while it loads its logs again. [`retry_unavailable`] waits for
//! it up to [`BROKER_OUTAGE_LIMIT`], saying so in a warning and in the
//! counter [`BROKER_UNAVAILABLE`] at every failed attempt: the job carries
//! on once the broker is back, and the outage is visible while it lasts.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError as RdKafkaError;
use rdkafka::types::RDKafkaErrorCode;
use tracing::{debug, warn};

use crate::error::client as client_error;
use crate::error::{KafkaError, client};
use crate::offsets::TopicPartition;

/// The first pause between attempts; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between attempts.
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// How long a call waits for an unreachable or restarting broker before
/// its error is returned (and the batch fails).
pub(crate) const BROKER_OUTAGE_LIMIT: Duration = Duration::from_secs(300);
/// The counter of requests that failed because the broker was unreachable
/// or not ready, and were tried again.
pub(crate) const BROKER_UNAVAILABLE: &str = "spate_kafka_broker_unavailable_total";

/// Whether `error` says the broker is unreachable, paused or still loading
/// after a restart: worth waiting for, unlike a refusal.
pub(crate) fn is_broker_unavailable(error: &RdKafkaError) -> bool {
    is_coordinator_transient(error)
        || matches!(
            error.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::OperationTimedOut
                    | RDKafkaErrorCode::RequestTimedOut
                    | RDKafkaErrorCode::AllBrokersDown
                    | RDKafkaErrorCode::BrokerTransportFailure
                    | RDKafkaErrorCode::NetworkException
                    | RDKafkaErrorCode::BrokerNotAvailable
                    | RDKafkaErrorCode::LeaderNotAvailable
                    | RDKafkaErrorCode::NotLeaderForPartition
                    | RDKafkaErrorCode::UnknownPartition
                    | RDKafkaErrorCode::UnknownTopicOrPartition
                    | RDKafkaErrorCode::Resolve
            )
        )
}

/// The low and high watermarks of `tp`, asked of the broker by the client
/// in `admin`.
///
/// A client that met the broker while it restarted can keep a metadata
/// cache that lacks the partition or names an old leader, and then fails
/// every watermark request locally (*unknown partition*), even after asking
/// for the topic's metadata again; only a new client, which bootstraps
/// afresh, finds the broker as it is now. On such an error the client in
/// `admin` is replaced by one `fresh` makes, and the error is returned for
/// the caller's retry to count.
pub(crate) fn watermarks(
    admin: &std::sync::Mutex<BaseConsumer>,
    fresh: impl FnOnce() -> Result<BaseConsumer, KafkaError>,
    tp: &TopicPartition,
    timeout: Duration,
) -> Result<(i64, i64), KafkaError> {
    let mut client = spate_core::sync::lock(admin);
    match client.fetch_watermarks(&tp.topic, tp.partition, timeout) {
        Ok(marks) => Ok(marks),
        Err(error) => {
            if is_stale_metadata(&error) {
                match fresh() {
                    Ok(new) => *client = new,
                    Err(e) => debug!(%tp, error = %e, "could not open a new metadata client; keeping the old one"),
                }
                debug!(%tp, "a new metadata client replaces one whose metadata went stale");
            }
            Err(client_error(format!("fetch watermarks of {tp}"))(error))
        }
    }
}

/// Whether `error` says the client's idea of the partition's place is out of date.
fn is_stale_metadata(error: &RdKafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnknownPartition
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::NotLeaderForPartition
                | RDKafkaErrorCode::LeaderNotAvailable
        )
    )
}

/// Whether `error` is the broker being away: a client error that
/// [`is_broker_unavailable`], or a read that got nothing within its timeout.
pub(crate) fn is_outage(error: &KafkaError) -> bool {
    match error {
        KafkaError::Client { source, .. } => is_broker_unavailable(source),
        KafkaError::PollTimeout { .. } => true,
        _ => false,
    }
}

/// Runs `call` until it succeeds, fails with an error that is no
/// [`is_outage`], or [`BROKER_OUTAGE_LIMIT`] has passed since the first
/// attempt; each failed attempt is warned about and counted in
/// [`BROKER_UNAVAILABLE`]. `call` must be safe to repeat (a read of fixed
/// offsets, a metadata request).
pub(crate) fn retry_unavailable<T>(call: impl FnMut() -> Result<T, KafkaError>) -> Result<T, KafkaError> {
    retry_unavailable_for(BROKER_OUTAGE_LIMIT, call)
}

fn retry_unavailable_for<T>(limit: Duration, mut call: impl FnMut() -> Result<T, KafkaError>) -> Result<T, KafkaError> {
    let deadline = Instant::now() + limit;
    let mut pause = FIRST_PAUSE;
    loop {
        match call() {
            Err(e) if is_outage(&e) && Instant::now() + pause < deadline => {
                metrics::counter!(BROKER_UNAVAILABLE).increment(1);
                warn!(error = %e, "the Kafka broker is unreachable or not ready; retrying");
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_PAUSE);
            }
            result => return result,
        }
    }
}

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
    fn an_unreachable_broker_is_waited_for_and_a_refusal_is_not() {
        let mut attempts = 0;
        fn failed<T>(code: RDKafkaErrorCode) -> Result<T, KafkaError> {
            Err(client("fetch watermarks")(RdKafkaError::MetadataFetch(code)))
        }
        let result = retry_unavailable_for(Duration::from_secs(10), || {
            attempts += 1;
            match attempts {
                1 => failed(RDKafkaErrorCode::OperationTimedOut),
                2 => failed(RDKafkaErrorCode::UnknownPartition),
                3 => Err(KafkaError::PollTimeout { topic: "t".into(), partition: 0, offset: 0, timeout_ms: 1 }),
                _ => Ok(attempts),
            }
        });
        assert_eq!(result.unwrap(), 4);
        let mut attempts = 0;
        let result: Result<(), _> = retry_unavailable_for(Duration::from_secs(10), || {
            attempts += 1;
            failed(RDKafkaErrorCode::TopicAuthorizationFailed)
        });
        assert!(result.is_err());
        assert_eq!(attempts, 1, "a refusal is returned at once");
        let result: Result<(), _> =
            retry_unavailable_for(Duration::from_millis(200), || failed(RDKafkaErrorCode::AllBrokersDown));
        assert!(result.is_err(), "a broker that never comes back fails the call once the time is spent");
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
