//! cargo fuzz target: spate_fuzz's `tracker_event`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| spate_fuzz::run("tracker_event", data));
