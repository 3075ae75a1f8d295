//! cargo fuzz target: spate_fuzz's `frame`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| spate_fuzz::run("frame", data));
