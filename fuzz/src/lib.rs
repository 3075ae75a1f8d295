//! Every decoder of spate under arbitrary input.
//!
//! Each [`Target`] is the body of one `cargo fuzz` target (the binaries in
//! `fuzz/targets/`, run by `cargo xtask fuzz`) and of one regression test
//! (`tests/corpus.rs`, run by `cargo xtask test`, which replays every file
//! of `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/`). A target
//! must never panic, hang or allocate without bound, whatever its input.
//!
//! Checksums stop a fuzzer at the first byte it changes, so each target
//! reads its first input byte as a mode: even, the rest is decoded as it
//! is (the checks themselves are fuzzed); odd, the rest is first wrapped in
//! a valid envelope (header, length, checksum) and then decoded, so the
//! fuzzer reaches the payload decoders behind the checksum.
//!
//! [`Target::seeds`] are valid encodings, the corpus a fuzzing run starts from.

mod targets;

pub use targets::TARGETS;

/// One decoder under test.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// The target's name: its `cargo fuzz` binary and its corpus folder.
    pub name: &'static str,
    /// Decodes `input`; panics only on a bug.
    pub run: fn(&[u8]),
    /// Valid inputs to start from (each with its mode byte).
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// The target named `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// Runs the target named `name` on `input`; an unknown name is a bug of
/// the caller (a fuzz binary naming a target that does not exist) and panics.
pub fn run(name: &str, input: &[u8]) {
    match target(name) {
        Some(target) => (target.run)(input),
        None => panic!("no fuzz target named {name}"),
    }
}

/// Splits an input into its mode (wrap in a valid envelope or not) and the rest.
fn mode(input: &[u8]) -> (bool, &[u8]) {
    match input.split_first() {
        Some((first, rest)) => (first & 1 == 1, rest),
        None => (false, input),
    }
}

/// `bytes` behind a mode byte that asks for them as they are.
fn raw(bytes: impl Into<Vec<u8>>) -> Vec<u8> {
    let mut out = vec![0];
    out.extend(bytes.into());
    out
}

/// `bytes` behind a mode byte that asks for them wrapped in a valid envelope.
fn wrapped(bytes: impl Into<Vec<u8>>) -> Vec<u8> {
    let mut out = vec![1];
    out.extend(bytes.into());
    out
}
