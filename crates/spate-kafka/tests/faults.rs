//! Fault cases on librdkafka's in-process mock cluster (no broker needed):
//! a leader change between batches, and a broker that goes down and comes
//! back while a read waits for it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use spate_kafka::{DirectKafkaSettings, DirectKafkaStream, KafkaError, OffsetRange, OffsetRanges, TopicPartition};

const TOPIC: &str = "faults";

fn produce(cluster: &MockCluster<'_, DefaultProducerContext>, count: u32) {
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", cluster.bootstrap_servers()).create().unwrap();
    for i in 0..count {
        let value = format!("v{i}");
        while let Err((e, _)) = producer.send(BaseRecord::<(), String>::to(TOPIC).payload(&value).partition(0)) {
            assert!(matches!(e, rdkafka::error::KafkaError::MessageProduction(_)), "{e}");
            producer.poll(Duration::from_millis(10));
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

fn stream(cluster: &MockCluster<'_, DefaultProducerContext>, poll_timeout: Duration) -> DirectKafkaStream {
    let config = DirectKafkaSettings::subscribe(cluster.bootstrap_servers(), "faults", [TOPIC])
        .with_partitions([TopicPartition::new(TOPIC, 0)])
        .with_poll_timeout(poll_timeout);
    DirectKafkaStream::new(config).unwrap()
}

fn range(from: i64, until: i64) -> OffsetRanges {
    OffsetRanges::new(vec![OffsetRange::new(TOPIC, 0, from, until)])
}

fn offsets(stream: &DirectKafkaStream, ranges: &OffsetRanges) -> Result<Vec<i64>, KafkaError> {
    Ok(stream.read(ranges)?.iter().flatten().map(|r| r.offset).collect())
}

#[test]
fn reading_goes_on_after_a_leader_change() {
    let cluster = MockCluster::new(3).unwrap();
    cluster.create_topic(TOPIC, 1, 3).unwrap();
    cluster.partition_leader(TOPIC, 0, Some(1)).unwrap();
    produce(&cluster, 100);
    let stream = stream(&cluster, Duration::from_secs(30));
    assert_eq!(offsets(&stream, &range(0, 50)).unwrap(), (0..50).collect::<Vec<_>>());
    cluster.partition_leader(TOPIC, 0, Some(2)).unwrap();
    assert_eq!(offsets(&stream, &range(50, 100)).unwrap(), (50..100).collect::<Vec<_>>());
    assert_eq!(stream.pool().consumers_created(), 1, "the pooled consumer followed the new leader");
}

#[test]
fn a_read_while_the_broker_is_down_waits_for_it_and_reads_once_it_is_back() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic(TOPIC, 1, 1).unwrap();
    produce(&cluster, 20);
    let first = stream(&cluster, Duration::from_secs(2));
    assert_eq!(offsets(&first, &range(0, 10)).unwrap(), (0..10).collect::<Vec<_>>());

    cluster.broker_down(1).unwrap();
    // A consumer that has not prefetched anything must reach the broker: it
    // times out, is not given back to the pool, and the read tries again
    // with a fresh one until the broker answers.
    let cut_off = stream(&cluster, Duration::from_secs(2));
    std::thread::scope(|scope| {
        let read = scope.spawn(|| offsets(&cut_off, &range(10, 20)));
        while cut_off.pool().consumers_created() < 2 {
            assert!(!read.is_finished(), "the read ended while the broker was down: {:?}", read.join());
            // Polled, not timed: the broker comes back only once a retry is under way.
            std::thread::sleep(Duration::from_millis(10));
        }
        cluster.broker_up(1).unwrap();
        assert_eq!(read.join().unwrap().unwrap(), (10..20).collect::<Vec<_>>());
    });
}
