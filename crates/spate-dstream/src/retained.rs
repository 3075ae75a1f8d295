//! The retained slices of an inverse-window partition: in memory, or
//! beyond the partition's share of the state budget in a spill table.
//!
//! A window of 30 s over 1 s batches keeps 30 slices, and a slice is read
//! only twice: when it enters the window's value and when it leaves. So
//! the oldest slices are the ones to move: each is written once and read
//! once more, when it leaves, while the newest, which the next slide adds,
//! stay in memory.

use std::borrow::Cow;
use std::collections::VecDeque;

use spate_core::CoreError;

use crate::keyed::EncodedSlice;
use crate::spill::{SpillError, SpillTable, SpillWrites};

/// A partition's retained slices, oldest first.
#[derive(Default)]
pub(crate) struct RetainedSlices {
    slices: VecDeque<Held>,
    /// Opened when the first slice moves there.
    table: Option<Box<dyn SpillTable>>,
    /// The table key the next slice moved there gets.
    next_key: u64,
    /// Bytes of the slices held in memory.
    memory_bytes: usize,
}

enum Held {
    Memory(EncodedSlice),
    /// In the table under `key`, with its entry count.
    Spilled {
        key: u64,
        entries: u32,
    },
}

impl RetainedSlices {
    pub(crate) fn len(&self) -> usize {
        self.slices.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.slices.is_empty()
    }

    /// Bytes of the slices held in memory.
    #[cfg(test)]
    pub(crate) fn memory_bytes(&self) -> usize {
        self.memory_bytes
    }

    /// The number of slices in the spill table.
    #[cfg(test)]
    pub(crate) fn spilled(&self) -> usize {
        self.slices.iter().filter(|held| matches!(held, Held::Spilled { .. })).count()
    }

    pub(crate) fn push_back(&mut self, slice: EncodedSlice) {
        self.memory_bytes += slice.encoded_bytes();
        self.slices.push_back(Held::Memory(slice));
    }

    /// Takes the oldest slice out (from the table, if it is there).
    pub(crate) fn pop_front(&mut self) -> Result<Option<EncodedSlice>, CoreError> {
        let Some(held) = self.slices.pop_front() else { return Ok(None) };
        match held {
            Held::Memory(slice) => {
                self.memory_bytes -= slice.encoded_bytes();
                Ok(Some(slice))
            }
            Held::Spilled { key, entries } => {
                let table = self.table.as_mut().ok_or_else(|| missing("no table"))?;
                let bytes = table.get(&key.to_be_bytes()).map_err(read_error)?.ok_or_else(|| missing("not found"))?;
                let mut delete = SpillWrites::default();
                delete.delete(key.to_be_bytes().to_vec());
                table.write(&delete).map_err(write_error)?;
                Ok(Some(EncodedSlice::from_parts(bytes, entries)))
            }
        }
    }

    /// The slices from `first` on, oldest first, read from the table where
    /// they are there.
    pub(crate) fn from(&self, first: usize) -> Result<Vec<Cow<'_, EncodedSlice>>, CoreError> {
        self.slices.iter().skip(first).map(|held| self.load(held)).collect()
    }

    fn load<'a>(&'a self, held: &'a Held) -> Result<Cow<'a, EncodedSlice>, CoreError> {
        match held {
            Held::Memory(slice) => Ok(Cow::Borrowed(slice)),
            Held::Spilled { key, entries } => {
                let table = self.table.as_ref().ok_or_else(|| missing("no table"))?;
                let bytes = table.get(&key.to_be_bytes()).map_err(read_error)?.ok_or_else(|| missing("not found"))?;
                Ok(Cow::Owned(EncodedSlice::from_parts(bytes, *entries)))
            }
        }
    }

    /// Moves the oldest slices held in memory to the table (opened with
    /// `open` when it is first needed) until those in memory take at most
    /// `budget` bytes.
    pub(crate) fn spill_beyond(
        &mut self,
        budget: usize,
        open: impl FnOnce() -> Result<Box<dyn SpillTable>, CoreError>,
    ) -> Result<(), CoreError> {
        if self.memory_bytes <= budget {
            return Ok(());
        }
        if self.table.is_none() {
            self.table = Some(open()?);
        }
        let Some(table) = self.table.as_mut() else { return Ok(()) };
        for held in self.slices.iter_mut() {
            if self.memory_bytes <= budget {
                break;
            }
            let Held::Memory(slice) = held else { continue };
            let (key, entries, size) = (self.next_key, slice.len() as u32, slice.encoded_bytes());
            let mut put = SpillWrites::default();
            put.put(key.to_be_bytes().to_vec(), std::mem::take(slice).into_bytes());
            table.write(&put).map_err(write_error)?;
            *held = Held::Spilled { key, entries };
            self.next_key += 1;
            self.memory_bytes -= size;
        }
        Ok(())
    }
}

impl From<Vec<EncodedSlice>> for RetainedSlices {
    fn from(slices: Vec<EncodedSlice>) -> Self {
        let mut retained = RetainedSlices::default();
        slices.into_iter().for_each(|slice| retained.push_back(slice));
        retained
    }
}

fn missing(what: &str) -> CoreError {
    CoreError::Decode { reason: format!("a window slice moved to disk: {what}") }
}

fn read_error(e: SpillError) -> CoreError {
    CoreError::Decode { reason: e.to_string() }
}

fn write_error(e: SpillError) -> CoreError {
    CoreError::Encode { reason: e.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spill::{MemorySpillStore, SpillStore};

    fn slice(values: &[u64]) -> EncodedSlice {
        let mut entries: Vec<(u32, u64)> = values.iter().enumerate().map(|(id, v)| (id as u32, *v)).collect();
        EncodedSlice::encode(&mut entries).unwrap()
    }

    #[test]
    fn the_oldest_slices_move_to_the_table_and_come_back_whole() {
        let store = MemorySpillStore::new();
        let mut retained = RetainedSlices::default();
        for n in 1..=4u64 {
            retained.push_back(slice(&vec![n; 100]));
        }
        let each = retained.memory_bytes() / 4;
        retained
            .spill_beyond(each * 2, || store.open_table("t").map_err(|e| CoreError::Encode { reason: e.to_string() }))
            .unwrap();
        assert_eq!((retained.spilled(), retained.memory_bytes()), (2, each * 2));
        let later: Vec<Vec<(u32, u64)>> = retained.from(1).unwrap().iter().map(|s| s.decode().unwrap()).collect();
        assert_eq!(later.iter().map(|s| s[0].1).collect::<Vec<_>>(), vec![2, 3, 4]);
        assert_eq!(
            retained.pop_front().unwrap().unwrap().decode::<u64>().unwrap(),
            slice(&[1; 100]).decode::<u64>().unwrap()
        );
        assert_eq!(retained.len(), 3);
        store.fail_after(0);
        assert!(retained.pop_front().is_err(), "a failing table fails the read");
    }
}
