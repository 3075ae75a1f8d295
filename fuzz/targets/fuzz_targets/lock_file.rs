//! cargo fuzz target: spate_fuzz's `lock_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| spate_fuzz::run("lock_file", data));
