//! The batch slices one partition of an inverse window retains, in memory
//! or on disk.
//!
//! A retained slice is read three times at most: when it enters the
//! window's result, when it leaves it, and when a snapshot lists it. In
//! between it only waits, so it is what goes to disk when the partition
//! takes more than its share of the state budget: the newest slices
//! already in the window's result first, since the oldest are read again
//! soonest (when they leave) and those still waiting for the next slide
//! are read at it. A slice on disk is read back whole, one at a time, so
//! at most one of them is in memory at once. Slices go to the store's
//! [`SpillBlobs`] (plain files in the runtime), not to a table: they are
//! never looked up by key, and a table's write buffers and cache would
//! cost more memory than the slices they hold.
//!
//! The blobs are scratch, as `map_with_state`'s tables are: a snapshot
//! lists the slices the same way wherever they are, and a restore starts
//! new blobs.

use std::borrow::Cow;
use std::collections::VecDeque;

use spate_core::CoreError;

use crate::keyed::EncodedSlice;
use crate::spill::{SpillBlobs, SpillError, SpillPlace};

/// One retained slice: in memory, or on disk under its number.
enum Retained {
    Memory(EncodedSlice),
    OnDisk(u64),
}

/// Where a partition's slices go beyond its budget.
struct SliceSpill {
    place: SpillPlace,
    /// The bytes the partition may keep in memory.
    budget: u64,
    /// Opened when the first slice moves there.
    blobs: Option<Box<dyn SpillBlobs>>,
    /// The number the next slice moved there gets.
    next: u64,
}

/// A partition's retained slices, oldest first.
#[derive(Default)]
pub(crate) struct RetainedSlices {
    list: VecDeque<Retained>,
    /// Encoded bytes of the slices in memory.
    memory_bytes: usize,
    /// How many of the newest slices the next slide adds (kept since the last).
    waiting: usize,
    spill: Option<SliceSpill>,
}

impl RetainedSlices {
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The bytes the slices in memory take.
    #[cfg(test)]
    pub(crate) fn memory_bytes(&self) -> usize {
        self.memory_bytes
    }

    /// How many slices are on disk.
    #[cfg(test)]
    pub(crate) fn on_disk(&self) -> usize {
        self.list.iter().filter(|slice| matches!(slice, Retained::OnDisk(_))).count()
    }

    /// From now on, slices beyond `budget` bytes (with what else the
    /// partition keeps) may move to blobs of `place`.
    pub(crate) fn use_spill(&mut self, place: SpillPlace, budget: u64) {
        match &mut self.spill {
            Some(spill) => spill.budget = budget,
            None => self.spill = Some(SliceSpill { place, budget, blobs: None, next: 0 }),
        }
    }

    /// Keeps `slice` as the newest, in memory.
    pub(crate) fn push_back(&mut self, slice: EncodedSlice) {
        self.memory_bytes += slice.encoded_bytes();
        self.list.push_back(Retained::Memory(slice));
        self.waiting += 1;
    }

    /// Every slice retained is now in the window's result (a slide added
    /// those that waited).
    pub(crate) fn all_entered(&mut self) {
        self.waiting = 0;
    }

    /// Takes the oldest slice out, reading it back when on disk. A slice
    /// that cannot be read back stays retained.
    pub(crate) fn pop_front(&mut self) -> Result<Option<EncodedSlice>, CoreError> {
        self.take_front(true)
    }

    /// Drops the oldest slices until `kept` are left, those on disk unread.
    pub(crate) fn keep_newest(&mut self, kept: usize) -> Result<(), CoreError> {
        while self.list.len() > kept {
            self.take_front(false)?;
        }
        Ok(())
    }

    /// Takes the oldest slice out; one on disk is read back only when `read`.
    fn take_front(&mut self, read: bool) -> Result<Option<EncodedSlice>, CoreError> {
        let read_back = match self.list.front() {
            None => return Ok(None),
            Some(Retained::Memory(_)) => None,
            Some(Retained::OnDisk(number)) => {
                let number = *number;
                let slice = if read { Some(self.read(number)?) } else { None };
                self.blobs_mut()?.remove(number).map_err(SpillError::writing)?;
                slice
            }
        };
        let popped = self.list.pop_front();
        self.waiting = self.waiting.min(self.list.len());
        match popped {
            Some(Retained::Memory(slice)) => {
                self.memory_bytes -= slice.encoded_bytes();
                Ok(Some(slice))
            }
            _ => Ok(read_back),
        }
    }

    /// The slice at `index` (0: the oldest), read back when on disk.
    pub(crate) fn get(&self, index: usize) -> Result<Cow<'_, EncodedSlice>, CoreError> {
        match self.list.get(index) {
            Some(Retained::Memory(slice)) => Ok(Cow::Borrowed(slice)),
            Some(Retained::OnDisk(number)) => self.read(*number).map(Cow::Owned),
            None => Err(CoreError::Decode { reason: format!("no retained slice {index} of {}", self.list.len()) }),
        }
    }

    /// Calls `each` with the slices from `from` on, oldest first.
    pub(crate) fn for_each_from(
        &self,
        from: usize,
        mut each: impl FnMut(&EncodedSlice) -> Result<(), CoreError>,
    ) -> Result<(), CoreError> {
        (from..self.list.len()).try_for_each(|index| each(&*self.get(index)?))
    }

    /// Moves slices in memory to disk until the partition, which keeps
    /// `other_bytes` besides them, is within its budget: the newest of
    /// those in the window's result, then the newest waiting.
    pub(crate) fn spill_beyond(&mut self, other_bytes: usize) -> Result<(), CoreError> {
        let Some(budget) = self.spill.as_ref().map(|spill| spill.budget) else { return Ok(()) };
        let in_memory = |slice: &Retained| matches!(slice, Retained::Memory(_));
        while (other_bytes + self.memory_bytes) as u64 > budget {
            let entered = self.list.len() - self.waiting;
            let newest_entered = self.list.iter().take(entered).rposition(in_memory);
            let Some(index) = newest_entered.or_else(|| self.list.iter().rposition(in_memory)) else { break };
            self.move_to_disk(index)?;
        }
        Ok(())
    }

    fn move_to_disk(&mut self, index: usize) -> Result<(), CoreError> {
        let Some(spill) = self.spill.as_mut() else { return Ok(()) };
        let Some(Retained::Memory(slice)) = self.list.get(index) else { return Ok(()) };
        let number = spill.next;
        let blobs = match &mut spill.blobs {
            Some(blobs) => blobs,
            None => {
                tracing::info!(operator = %spill.place.operator(), "window slices beyond the memory budget go to disk");
                spill.blobs.insert(spill.place.open_blobs()?)
            }
        };
        blobs.put(number, &encode(slice)?).map_err(SpillError::writing)?;
        spill.next += 1;
        let bytes = slice.encoded_bytes();
        if let Some(entry) = self.list.get_mut(index) {
            *entry = Retained::OnDisk(number);
        }
        self.memory_bytes -= bytes;
        Ok(())
    }

    fn read(&self, number: u64) -> Result<EncodedSlice, CoreError> {
        let blobs = self.spill.as_ref().and_then(|spill| spill.blobs.as_ref()).ok_or_else(|| CoreError::Decode {
            reason: format!("window slice {number} is on disk but its blobs are not open"),
        })?;
        let bytes = blobs.get(number).map_err(SpillError::reading)?.ok_or_else(|| CoreError::Decode {
            reason: format!("window slice {number} is missing from the spill store"),
        })?;
        decode(&bytes)
    }

    fn blobs_mut(&mut self) -> Result<&mut Box<dyn SpillBlobs>, CoreError> {
        self.spill.as_mut().and_then(|spill| spill.blobs.as_mut()).ok_or_else(|| CoreError::Encode {
            reason: "a window slice is on disk but its blobs are not open".to_string(),
        })
    }
}

fn encode(slice: &EncodedSlice) -> Result<Vec<u8>, CoreError> {
    bincode::serde::encode_to_vec(slice, bincode::config::standard())
        .map_err(|e| CoreError::Encode { reason: format!("a window slice: {e}") })
}

fn decode(bytes: &[u8]) -> Result<EncodedSlice, CoreError> {
    let (slice, used) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map_err(|e| CoreError::Decode { reason: format!("a window slice read back: {e}") })?;
    if used != bytes.len() {
        return Err(CoreError::Decode { reason: "a window slice read back has bytes after it".to_string() });
    }
    Ok(slice)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::spill::{MemorySpillStore, StateSpill};

    fn slice(ids: &[u32]) -> EncodedSlice {
        let mut entries: Vec<(u32, u64)> = ids.iter().map(|id| (*id, u64::from(*id) * 10)).collect();
        EncodedSlice::encode(&mut entries).unwrap()
    }

    fn spilling(store: &Arc<MemorySpillStore>, budget: u64) -> RetainedSlices {
        let mut slices = RetainedSlices::default();
        let place = SpillPlace::new("window", &StateSpill::new(Arc::clone(store) as _, budget));
        slices.use_spill(place, budget);
        slices
    }

    #[test]
    fn slices_beyond_the_budget_go_to_disk_newest_first_and_come_back_in_order() {
        let store = Arc::new(MemorySpillStore::new());
        let all: Vec<EncodedSlice> = (0..4u32).map(|n| slice(&[n, n + 5, n + 9])).collect();
        // Room for one slice besides 1 byte of other state: the newer goes.
        let (one, other) = (all[0].encoded_bytes(), 1);
        let mut slices = spilling(&store, (one + other) as u64);
        slices.push_back(all[0].clone());
        slices.push_back(all[1].clone());
        slices.spill_beyond(other).unwrap();
        assert_eq!(slices.on_disk(), 1);
        assert!(matches!(slices.list.front(), Some(Retained::Memory(_))));
        assert_eq!(slices.memory_bytes(), one);
        slices.push_back(all[2].clone());
        slices.push_back(all[3].clone());
        slices.spill_beyond(other).unwrap();
        assert_eq!(slices.on_disk(), 3);
        assert!(matches!(slices.list.front(), Some(Retained::Memory(_))), "the oldest stays");
        let mut seen = Vec::new();
        slices
            .for_each_from(1, |s| {
                seen.push(s.clone());
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, all[1..].to_vec(), "slices on disk are read back as they were kept");
        for expected in &all {
            assert_eq!(slices.pop_front().unwrap().as_ref(), Some(expected));
        }
        assert_eq!(slices.pop_front().unwrap(), None);
        assert_eq!(slices.memory_bytes(), 0);
        assert_eq!(store.tables_opened(), 1);
    }

    #[test]
    fn a_failing_store_is_an_error_not_a_lost_slice() {
        let store = Arc::new(MemorySpillStore::new());
        let mut slices = spilling(&store, 0);
        slices.push_back(slice(&[1, 2]));
        slices.spill_beyond(0).unwrap();
        store.fail_after(0);
        let error = slices.get(0).unwrap_err();
        assert!(error.to_string().contains("failpoint"), "{error}");
        assert!(slices.pop_front().is_err());
        assert_eq!(slices.len(), 1, "the slice stays retained");
    }

    #[test]
    fn slices_in_the_result_go_to_disk_before_those_the_next_slide_reads() {
        let store = Arc::new(MemorySpillStore::new());
        let all: Vec<EncodedSlice> = (0..4u32).map(|n| slice(&[n, n + 3])).collect();
        let one = all[0].encoded_bytes();
        let mut slices = spilling(&store, (2 * one) as u64);
        slices.push_back(all[0].clone());
        slices.push_back(all[1].clone());
        slices.all_entered();
        slices.push_back(all[2].clone());
        slices.push_back(all[3].clone());
        slices.spill_beyond(0).unwrap();
        let on_disk: Vec<bool> = slices.list.iter().map(|s| matches!(s, Retained::OnDisk(_))).collect();
        assert_eq!(on_disk, vec![true, true, false, false], "the two waiting for the slide stay");
    }
}
