//! The figures the direct stream records for `/metrics` (through the
//! `metrics` facade), on librdkafka's in-process mock cluster (no broker
//! needed): each partition's consumer lag after a planned batch, and the
//! records and bytes it read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use spate_core::{Duration as BatchDuration, Time};
use spate_kafka::{DirectKafkaConfig, DirectKafkaStream, TopicPartition};

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
    let config =
        DirectKafkaConfig::subscribe(cluster.bootstrap_servers(), "metered", [TOPIC], BatchDuration::from_secs(1))
            .assign([TopicPartition::new(TOPIC, 0)])
            .max_rate_per_partition(30);
    let stream = DirectKafkaStream::new(config).unwrap();
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let ranges = metrics::with_local_recorder(&recorder, || stream.plan_batch(Time::from_millis(1000), None)).unwrap();
    assert_eq!(ranges.count(), 30);
    let text = handle.render();
    let labels = format!("{{source=\"{TOPIC}\",partition=\"0\"}}");
    assert!(text.contains(&format!("spate_kafka_consumer_lag{{topic=\"{TOPIC}\",partition=\"0\"}} 70\n")), "{text}");
    assert!(text.contains(&format!("spate_input_records_total{labels} 30\n")), "{text}");
    // v0..v9 are two bytes, v10..v29 three.
    assert!(text.contains(&format!("spate_input_bytes_total{labels} 80\n")), "{text}");
}
