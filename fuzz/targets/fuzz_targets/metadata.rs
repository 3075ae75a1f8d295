//! cargo fuzz target: spate_fuzz's `metadata`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| spate_fuzz::run("metadata", data));
