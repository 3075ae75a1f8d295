//! cargo fuzz target: spate_fuzz's `block`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| spate_fuzz::run("block", data));
