//! Storage levels: where the block manager keeps a block (memory, disk or
//! both), whether in memory it stays as records or as bytes, and how many
//! copies a cluster deployment would keep.

use std::fmt;

/// Where and how a block is kept (Spark's `StorageLevel`, without off-heap).
///
/// The block manager is local to the process, so `replication` is recorded
/// and reported but only one copy is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StorageLevel {
    use_memory: bool,
    use_disk: bool,
    deserialized: bool,
    replication: u8,
}

impl StorageLevel {
    /// Records kept as they are, in memory only; refused when memory is full.
    pub const MEMORY_ONLY: StorageLevel = StorageLevel::new(true, false, true, 1);
    /// Serialized bytes in memory only; refused when memory is full.
    pub const MEMORY_ONLY_SER: StorageLevel = StorageLevel::new(true, false, false, 1);
    /// Records in memory, spilled to disk (serialized) when memory is full.
    pub const MEMORY_AND_DISK: StorageLevel = StorageLevel::new(true, true, true, 1);
    /// Serialized bytes in memory, spilled to disk when memory is full.
    pub const MEMORY_AND_DISK_SER: StorageLevel = StorageLevel::new(true, true, false, 1);
    /// As [`StorageLevel::MEMORY_AND_DISK_SER`] with two copies: Spark's
    /// default for receivers, and spate's.
    pub const MEMORY_AND_DISK_SER_2: StorageLevel = StorageLevel::new(true, true, false, 2);
    /// Serialized bytes on disk only.
    pub const DISK_ONLY: StorageLevel = StorageLevel::new(false, true, false, 1);

    /// A level from its parts. A level with neither memory nor disk is
    /// treated as memory only; replication below one as one.
    pub const fn new(use_memory: bool, use_disk: bool, deserialized: bool, replication: u8) -> Self {
        let use_memory = use_memory || !use_disk;
        // Bytes on disk are always serialized.
        let deserialized = deserialized && use_memory;
        let replication = if replication == 0 { 1 } else { replication };
        StorageLevel { use_memory, use_disk, deserialized, replication }
    }

    /// Keeps the block in memory.
    pub const fn use_memory(self) -> bool {
        self.use_memory
    }

    /// Keeps (or spills) the block on disk.
    pub const fn use_disk(self) -> bool {
        self.use_disk
    }

    /// In memory, keeps records rather than bytes.
    pub const fn deserialized(self) -> bool {
        self.deserialized
    }

    /// Copies a cluster deployment would keep.
    pub const fn replication(self) -> u8 {
        self.replication
    }

    /// The level the write-ahead-log handler uses instead of `self`, as Spark
    /// does: the WAL is the durable copy, so no replication, and the block
    /// is serialized once for both stores so it is kept serialized.
    pub const fn for_write_ahead_log(self) -> StorageLevel {
        StorageLevel::new(self.use_memory, self.use_disk, false, 1)
    }
}

impl Default for StorageLevel {
    fn default() -> Self {
        StorageLevel::MEMORY_AND_DISK_SER_2
    }
}

impl fmt::Display for StorageLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let place = match (self.use_memory, self.use_disk) {
            (true, true) => "MEMORY_AND_DISK",
            (false, true) => "DISK_ONLY",
            _ => "MEMORY_ONLY",
        };
        let ser = if self.use_memory && !self.deserialized { "_SER" } else { "" };
        let copies = if self.replication > 1 { format!("_{}", self.replication) } else { String::new() };
        write!(f, "{place}{ser}{copies}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_like_spark() {
        assert_eq!(StorageLevel::MEMORY_AND_DISK_SER_2.to_string(), "MEMORY_AND_DISK_SER_2");
        assert_eq!(StorageLevel::MEMORY_ONLY.to_string(), "MEMORY_ONLY");
        assert_eq!(StorageLevel::DISK_ONLY.to_string(), "DISK_ONLY");
    }

    #[test]
    fn wal_adjustment_drops_replication_and_serializes() {
        let adjusted = StorageLevel::MEMORY_AND_DISK_SER_2.for_write_ahead_log();
        assert_eq!(adjusted, StorageLevel::MEMORY_AND_DISK_SER);
        assert_eq!(StorageLevel::MEMORY_ONLY.for_write_ahead_log(), StorageLevel::MEMORY_ONLY_SER);
        assert_eq!(StorageLevel::DISK_ONLY.for_write_ahead_log(), StorageLevel::DISK_ONLY);
    }
}
