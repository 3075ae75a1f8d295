//! What several WAL test files share.

use spate_core::WriterFence;

/// The fence of a writer at a fixed epoch that is never taken over.
#[derive(Debug)]
pub(crate) struct Epoch(pub(crate) u64);

impl WriterFence for Epoch {
    fn epoch(&self) -> u64 {
        self.0
    }

    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}
