//! cargo fuzz target: spate_fuzz's `file_manifest`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| spate_fuzz::run("file_manifest", data));
