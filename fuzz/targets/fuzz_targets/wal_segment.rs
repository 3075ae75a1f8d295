//! cargo fuzz target: spate_fuzz's `wal_segment`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| spate_fuzz::run("wal_segment", data));
