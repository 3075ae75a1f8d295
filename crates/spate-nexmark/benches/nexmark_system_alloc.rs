//! The Nexmark queries on the process's default allocator (Rust's
//! `System`: glibc's `malloc` on Linux), which the `spate` binary uses and
//! a program built on the spate crates gets unless it sets a
//! `#[global_allocator]`: the benchmark
//! of `common/nexmark.rs`, which `nexmark` runs with mimalloc.
//!
//! ```sh
//! cargo bench -p spate-nexmark --bench nexmark_system_alloc -- q1 q5
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "common/nexmark.rs"]
mod nexmark;

fn main() {
    nexmark::main("system");
}
