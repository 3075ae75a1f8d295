//! The receiver-based Kafka source against the local broker: every record
//! reaches the receiver write-ahead log, and the group's offsets only move
//! past records already stored.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{brokers, create_topic, produce, unique, values};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use spate_core::{StreamId, SystemClock};
use spate_kafka::{KafkaReceiver, KafkaReceiverSettings, KafkaRecord, record_footprint};
use spate_receiver::{
    BlockManager, BlockManagerSettings, FnSink, ReceiverSupervisor, StorageLevel, SupervisorSettings,
    WalHandlerSettings, WriteAheadLogBasedBlockHandler, open_receiver_wal, read_block_from_wal,
};
use spate_wal::WalSettings;

fn committed(group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let consumer: BaseConsumer =
        ClientConfig::new().set("bootstrap.servers", brokers()).set("group.id", group).create().unwrap();
    let mut list = TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition(topic, p);
    }
    let committed = consumer.committed_offsets(list, Duration::from_secs(10)).unwrap();
    committed
        .elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => o,
            _ => 0,
        })
        .collect()
}

fn footprint(record: &KafkaRecord) -> u64 {
    record_footprint(record.key.as_ref().map_or(0, Vec::len), record.value.as_ref().map_or(0, Vec::len))
}

#[test]
fn the_receiver_stores_every_record_in_the_wal_before_committing_its_offsets() {
    let topic = unique("receiver");
    create_topic(&topic, 2);
    produce(&topic, 2, values(0..1_000));
    let group = unique("receiver-group");
    let checkpoint = tempfile::tempdir().unwrap();
    let stream = StreamId(0);
    let clock = Arc::new(SystemClock);
    let wal = open_receiver_wal(checkpoint.path(), stream, WalSettings::default()).unwrap();
    let blocks =
        Arc::new(BlockManager::<KafkaRecord>::open(BlockManagerSettings::in_memory(64 << 20), clock.clone()).unwrap());
    let handler = WriteAheadLogBasedBlockHandler::new(
        blocks,
        wal.clone(),
        stream,
        StorageLevel::default(),
        WalHandlerSettings::default(),
        clock.clone(),
    )
    .unwrap();

    // At every stored block, the group's offsets must not be past what the WAL holds.
    let (infos, received) = crossbeam::channel::unbounded();
    let (check_group, check_topic) = (group.clone(), topic.clone());
    let stored_until = Arc::new(std::sync::Mutex::new(vec![0i64; 2]));
    let stored = Arc::clone(&stored_until);
    let sink = FnSink(move |info: spate_core::ReceivedBlockInfo| {
        let before = committed(&check_group, &check_topic, 2);
        let mut stored = stored.lock().unwrap();
        assert!(before.iter().zip(stored.iter()).all(|(c, s)| c <= s), "offsets committed before the block was stored");
        let records: Vec<KafkaRecord> = read_block_from_wal(wal.as_ref(), stream, info.wal_handle().unwrap()).unwrap();
        for r in &records {
            let s = &mut stored[r.partition as usize];
            *s = (*s).max(r.offset + 1);
        }
        infos.send((info, records)).unwrap();
        Ok(())
    });

    let mut config = KafkaReceiverSettings::new(brokers(), group.clone(), vec![topic.clone()]);
    config.max_block_records = 128;
    // About 40 records: the byte cap, not the record cap, ends most blocks.
    let max_block_bytes = 40 * record_footprint(0, "record-1000".len());
    config.max_block_bytes = max_block_bytes;
    let supervisor = ReceiverSupervisor::start(
        KafkaReceiver::new(config),
        SupervisorSettings::new(stream),
        Arc::new(handler),
        Arc::new(sink),
        clock,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while committed(&group, &topic, 2) != vec![500, 500] && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    supervisor.stop().unwrap();
    assert!(supervisor.errors().is_empty(), "{:?}", supervisor.errors());

    let blocks: Vec<Vec<KafkaRecord>> = received.try_iter().map(|(_, records)| records).collect();
    for block in &blocks {
        let bytes: u64 = block.iter().map(footprint).sum();
        assert!(bytes <= max_block_bytes, "a block of {} records holds {bytes} bytes", block.len());
    }
    assert!(blocks.len() >= 1_000 / 40, "{} blocks", blocks.len());
    let mut seen: Vec<String> =
        blocks.into_iter().flatten().map(|r| String::from_utf8(r.value.unwrap()).unwrap()).collect();
    seen.sort();
    let mut expected = values(0..1_000);
    expected.sort();
    assert_eq!(seen, expected, "every record is in the WAL once");
    assert_eq!(committed(&group, &topic, 2), vec![500, 500]);
    assert_eq!(*stored_until.lock().unwrap(), vec![500, 500]);
}
