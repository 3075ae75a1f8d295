//! cargo fuzz target: spate_fuzz's `kafka_offsets`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| spate_fuzz::run("kafka_offsets", data));
