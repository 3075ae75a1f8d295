//! cargo fuzz target: spate_fuzz's `log_entry`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| spate_fuzz::run("log_entry", data));
