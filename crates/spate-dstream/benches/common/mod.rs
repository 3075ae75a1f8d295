//! What the window benches share: whether this is a full run, and their
//! deterministic random numbers.

/// True under `cargo bench`; `cargo test --all-targets` runs with small sizes.
pub(crate) fn full_run() -> bool {
    std::env::args().any(|arg| arg == "--bench")
}

/// A tiny deterministic generator (xorshift), so runs are comparable.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
