//! Kafka direct stream with safely stored offsets, an exclusive consumer pool and exactly-once sinks.
