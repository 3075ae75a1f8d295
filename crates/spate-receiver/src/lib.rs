//! Receivers, the block generator, the block manager and the WAL-backed received-block handler.
