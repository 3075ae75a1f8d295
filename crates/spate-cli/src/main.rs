//! The `spate` command.
fn main() {}
