//! The writer fence: how a storage layer below the log store asks whether
//! the process still owns the checkpoint it writes into.
//!
//! The log store's writer lock gives each writer an epoch, one more than
//! the previous holder's. Layers that cannot depend on the log store (the
//! write-ahead log, the block tracker's event log) take an
//! `Arc<dyn WriterFence>`, check it before each change and put its epoch
//! into what they write (a segment name, a record), so that bytes a stale
//! writer manages to write after a takeover are recognised and ignored.

use std::fmt;

/// A writer's claim on a checkpoint: its epoch, and a check that the claim
/// still holds.
pub trait WriterFence: Send + Sync + fmt::Debug {
    /// This writer's epoch (never 0 for a real writer; 0 means "unfenced").
    fn epoch(&self) -> u64;

    /// `Ok` while this writer still holds the checkpoint; otherwise a
    /// sentence that says who holds it now.
    fn check(&self) -> Result<(), String>;

    /// True while this writer's changes wait for its claim to be confirmed
    /// (an object store away past the lease's renewal): such a wait ends
    /// in the change or in a refusal, so a caller that times its writes
    /// out does not count it.
    fn is_paused(&self) -> bool {
        false
    }
}

/// The fence of a writer that is alone by construction (tests, a log
/// outside any checkpoint): epoch 0, always held.
#[derive(Clone, Copy, Debug, Default)]
pub struct Unfenced;

impl WriterFence for Unfenced {
    fn epoch(&self) -> u64 {
        0
    }

    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}
