//! spate
