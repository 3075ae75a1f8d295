//! The figures spate-kafka records for `/metrics` (through the `metrics`
//! facade): on librdkafka's in-process mock cluster (no broker needed),
//! each partition's consumer lag after a planned batch and the records and
//! bytes it read; against the local broker, the output transactions
//! committed and aborted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use spate_core::BatchId;
use spate_core::Time;
use spate_kafka::{CommitOutcome, DirectKafkaSettings, OutputRecord, TopicPartition, TransactionalKafkaSink};

const TOPIC: &str = "metered";

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

#[test]
fn a_planned_batch_records_the_lag_left_and_the_records_and_bytes_read() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic(TOPIC, 1, 1).unwrap();
    produce(&cluster, 100);
    let config = DirectKafkaSettings::subscribe(cluster.bootstrap_servers(), "metered", [TOPIC])
        .with_partitions([TopicPartition::new(TOPIC, 0)])
        .with_max_rate_per_partition(30);
    // A 1 s interval: 30 records a second are 30 records a batch.
    let stream = common::registered_every(config, spate_core::Duration::from_secs(1)).unwrap();
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let ranges = metrics::with_local_recorder(&recorder, || {
        stream.plan_batch(Time::from_millis(1000), spate_dstream::BatchLimits::UNLIMITED)
    })
    .unwrap();
    assert_eq!(ranges.count(), 30);
    let text = handle.render();
    let labels = format!("{{source=\"{TOPIC}\",partition=\"0\"}}");
    assert!(text.contains(&format!("spate_kafka_consumer_lag{{topic=\"{TOPIC}\",partition=\"0\"}} 70\n")), "{text}");
    assert!(text.contains(&format!("spate_input_records_total{labels} 30\n")), "{text}");
    // v0..v9 are two bytes, v10..v29 three.
    assert!(text.contains(&format!("spate_input_bytes_total{labels} 80\n")), "{text}");
}

#[test]
fn output_transactions_committed_and_aborted_are_counted_per_topic() {
    let (input, output) = (common::unique("metered-in"), common::unique("metered-out"));
    common::create_topic(&input, 1);
    common::create_topic(&output, 1);
    common::produce(&input, 1, common::values(0..20));
    let group = common::unique("metered-group");
    let config = DirectKafkaSettings::subscribe(common::brokers(), group.as_str(), [input.as_str()])
        .with_max_rate_per_partition(100);
    let stream = common::registered(config).unwrap();
    let sink = TransactionalKafkaSink::new(&common::brokers(), output.as_str(), &common::unique("metered-app"), &group)
        .unwrap();
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        let ranges = stream.plan_batch(common::time_of(0), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        assert_eq!(ranges.count(), 10);
        let outcome = sink.write_batch(BatchId(0), &ranges, [OutputRecord::value("fits")]).unwrap();
        assert_eq!(outcome, CommitOutcome::Committed);
        // A record over the producer's largest message fails the send: the transaction is aborted.
        let ranges = stream.plan_batch(common::time_of(1), spate_dstream::BatchLimits::UNLIMITED).unwrap();
        assert!(sink.write_batch(BatchId(1), &ranges, [OutputRecord::value(vec![0u8; 2 << 20])]).is_err());
    });
    let text = handle.render();
    let topic = format!("{{topic=\"{output}\"}}");
    assert!(text.contains(&format!("spate_kafka_transactions_committed_total{topic} 1\n")), "{text}");
    assert!(text.contains(&format!("spate_kafka_transactions_aborted_total{topic} 1\n")), "{text}");
}
