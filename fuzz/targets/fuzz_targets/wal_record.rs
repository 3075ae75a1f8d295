//! cargo fuzz target: spate_fuzz's `wal_record`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| spate_fuzz::run("wal_record", data));
