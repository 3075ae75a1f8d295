//! One batch of a stream: a partitioned, in-memory collection.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::hash::Hash;

/// What a stream may carry: owned, cloneable, shareable between threads and
/// serializable (so windows and state can be checkpointed as data).
pub trait Data: Clone + Send + Sync + Serialize + DeserializeOwned + 'static {}
impl<T: Clone + Send + Sync + Serialize + DeserializeOwned + 'static> Data for T {}

/// What a key-value stream may use as a key: [`Data`] that hashes and compares.
pub trait Key: Data + Hash + Eq {}
impl<T: Data + Hash + Eq> Key for T {}

/// The records of one batch of one stream, split into partitions that are
/// processed in parallel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch<T> {
    partitions: Vec<Vec<T>>,
}

impl<T> Default for Batch<T> {
    fn default() -> Self {
        Batch { partitions: Vec::new() }
    }
}

impl<T> Batch<T> {
    /// A batch made of `partitions`.
    pub fn new(partitions: Vec<Vec<T>>) -> Self {
        Batch { partitions }
    }

    /// A batch with one partition holding `records`.
    pub fn from_vec(records: Vec<T>) -> Self {
        Batch { partitions: vec![records] }
    }

    /// The partitions.
    pub fn partitions(&self) -> &[Vec<T>] {
        &self.partitions
    }

    /// The partitions, by value.
    pub fn into_partitions(self) -> Vec<Vec<T>> {
        self.partitions
    }

    /// The number of partitions.
    pub fn num_partitions(&self) -> usize {
        self.partitions.len()
    }

    /// The number of records over all partitions.
    pub fn len(&self) -> usize {
        self.partitions.iter().map(Vec::len).sum()
    }

    /// True when no partition holds a record.
    pub fn is_empty(&self) -> bool {
        self.partitions.iter().all(Vec::is_empty)
    }

    /// Every record, partition by partition.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.partitions.iter().flatten()
    }

    /// Every record in one vector, partition by partition.
    pub fn into_vec(self) -> Vec<T> {
        let mut out = Vec::with_capacity(self.len());
        for part in self.partitions {
            out.extend(part);
        }
        out
    }

    /// Appends the partitions of `other` after this batch's.
    pub fn append(&mut self, other: Batch<T>) {
        self.partitions.extend(other.partitions);
    }
}
