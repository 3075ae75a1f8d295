//! The Nexmark queries with mimalloc as the global allocator, as a
//! program built on the spate crates runs them once it sets it (one line,
//! `#[global_allocator]`; neither the crates nor the `spate` binary do):
//! the benchmark of `common/nexmark.rs` (every query, checkpoints on and
//! off, beside the best published per-core figures).
//! `nexmark_system_alloc` is the same on the system's allocator.
//!
//! ```sh
//! cargo xtask bench nexmark                      # both allocators
//! cargo bench -p spate-nexmark --bench nexmark -- q1 q5
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common/nexmark.rs"]
mod nexmark;

fn main() {
    nexmark::main("mimalloc");
}
