//! Runs: one partition's values by key id, ids ascending, in two arrays.
//!
//! The compact windows keep each key of a partition once, in a
//! [`KeyTable`](crate::keyed::KeyTable), and each pane or aggregate as a
//! [`Run`] against its ids. A run of `u64` counts takes 12 bytes an entry
//! (a pair would take 16, a map entry with its key some 60), and two runs
//! combine by merging sorted arrays, in one pass and in cache order.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

/// Values by id, ids strictly ascending.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Run<V> {
    pub(crate) ids: Vec<u32>,
    pub(crate) values: Vec<V>,
}

impl<V> Default for Run<V> {
    fn default() -> Self {
        Run { ids: Vec::new(), values: Vec::new() }
    }
}

/// Where one id of a walk over two runs is: in the older, the newer, or both.
pub(crate) enum Side<A, B> {
    Older(A),
    Newer(B),
    Both(A, B),
}

/// Walks two id-ascending sequences together, calling `each` once an id.
pub(crate) fn walk<A, B>(
    older: impl Iterator<Item = (u32, A)>,
    newer: impl Iterator<Item = (u32, B)>,
    mut each: impl FnMut(u32, Side<A, B>),
) {
    let (mut older, mut newer) = (older.peekable(), newer.peekable());
    loop {
        let order = match (older.peek(), newer.peek()) {
            (Some((a, _)), Some((b, _))) => a.cmp(b),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => return,
        };
        match order {
            Ordering::Less => older.next().into_iter().for_each(|(id, a)| each(id, Side::Older(a))),
            Ordering::Greater => newer.next().into_iter().for_each(|(id, b)| each(id, Side::Newer(b))),
            Ordering::Equal => {
                if let (Some((id, a)), Some((_, b))) = (older.next(), newer.next()) {
                    each(id, Side::Both(a, b));
                }
            }
        }
    }
}

/// How many ids two ascending id lists hold between them.
fn union_len(older: &[u32], newer: &[u32]) -> usize {
    let mut union = 0;
    walk(older.iter().map(|id| (*id, ())), newer.iter().map(|id| (*id, ())), |_, _| union += 1);
    union
}

impl<V> Run<V> {
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = (u32, &V)> {
        self.ids.iter().copied().zip(&self.values)
    }

    /// The value of `id`.
    pub(crate) fn get(&self, id: u32) -> Option<&V> {
        self.ids.binary_search(&id).ok().and_then(|at| self.values.get(at))
    }

    /// A run of `entries` in any order; `None` when an id comes twice.
    pub(crate) fn from_entries(mut entries: Vec<(u32, V)>) -> Option<Self> {
        entries.sort_unstable_by_key(|(id, _)| *id);
        if entries.windows(2).any(|pair| pair.first().map(|p| p.0) == pair.last().map(|p| p.0)) {
            return None;
        }
        let (ids, values) = entries.into_iter().unzip();
        Some(Run { ids, values })
    }

    /// `older ⊕ newer`, keeping `newer`: `both(older's, newer's)` where both
    /// hold an id, a copy of newer's where only it does. Allocated at its
    /// exact size: the union of two panes of mostly the same keys is far
    /// smaller than their sum.
    pub(crate) fn merge_from(older: Run<V>, newer: &Run<V>, mut both: impl FnMut(&mut V, &V)) -> Run<V>
    where
        V: Clone,
    {
        let union = union_len(&older.ids, &newer.ids);
        let mut out = Run { ids: Vec::with_capacity(union), values: Vec::with_capacity(union) };
        walk(older.ids.into_iter().zip(older.values), newer.entries(), |id, side| {
            out.ids.push(id);
            out.values.push(match side {
                Side::Older(value) => value,
                Side::Newer(value) => value.clone(),
                Side::Both(mut value, other) => {
                    both(&mut value, other);
                    value
                }
            });
        });
        out
    }

    /// `older ⊕ newer`, consuming both: `both(older's, newer's)` where both
    /// hold an id; `fresh` is told each id only `newer` held.
    pub(crate) fn merge_owned(
        older: Run<V>,
        newer: Run<V>,
        mut both: impl FnMut(&mut V, V),
        mut fresh: impl FnMut(u32),
    ) -> Run<V> {
        let union = union_len(&older.ids, &newer.ids);
        let mut out = Run { ids: Vec::with_capacity(union), values: Vec::with_capacity(union) };
        walk(older.ids.into_iter().zip(older.values), newer.ids.into_iter().zip(newer.values), |id, side| {
            out.ids.push(id);
            out.values.push(match side {
                Side::Older(value) => value,
                Side::Newer(value) => {
                    fresh(id);
                    value
                }
                Side::Both(mut value, other) => {
                    both(&mut value, other);
                    value
                }
            });
        });
        out
    }

    /// True when ids ascend strictly, each with a value and each `named`
    /// (a key of the table the run is against).
    pub(crate) fn is_well_formed(&self, named: impl Fn(u32) -> bool) -> bool {
        self.ids.len() == self.values.len()
            && self.ids.windows(2).all(|pair| pair.first() < pair.last())
            && self.ids.iter().all(|id| named(*id))
    }
}

/// Answers "does this run hold `id`?" for ascending ids in one pass.
pub(crate) struct Cursor<'a> {
    ids: &'a [u32],
    at: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new<V>(run: Option<&'a Run<V>>) -> Self {
        Cursor { ids: run.map_or(&[], |run| run.ids.as_slice()), at: 0 }
    }

    pub(crate) fn holds(&mut self, id: u32) -> bool {
        while self.ids.get(self.at).is_some_and(|found| *found < id) {
            self.at += 1;
        }
        self.ids.get(self.at) == Some(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(entries: &[(u32, u64)]) -> Run<u64> {
        Run::from_entries(entries.to_vec()).unwrap()
    }

    #[test]
    fn a_merge_combines_shared_ids_older_first_and_is_exactly_as_long_as_the_union() {
        let combine = |a: &mut u64, b: &u64| *a = *a * 100 + b;
        let merged = Run::merge_from(run(&[(5, 10), (1, 1), (9, 90)]), &run(&[(9, 2), (3, 30), (1, 4)]), combine);
        assert_eq!(merged.ids, [1, 3, 5, 9]);
        assert_eq!(merged.values, [104, 30, 10, 9002]);
        assert_eq!((merged.ids.capacity(), merged.values.capacity()), (4, 4));
        let mut fresh = Vec::new();
        let owned = Run::merge_owned(
            run(&[(5, 10), (1, 1)]),
            run(&[(7, 70), (1, 4)]),
            |a, b| *a = *a * 100 + b,
            |id| fresh.push(id),
        );
        assert_eq!((owned.ids, owned.values, fresh), (vec![1, 5, 7], vec![104, 10, 70], vec![7]));
    }

    #[test]
    fn a_run_finds_its_ids_and_refuses_an_id_twice() {
        let r = run(&[(8, 80), (2, 20)]);
        assert_eq!((r.get(2), r.get(8), r.get(5)), (Some(&20), Some(&80), None));
        assert!(Run::from_entries(vec![(3, 1u64), (3, 2)]).is_none());
        assert!(r.is_well_formed(|_| true) && !r.is_well_formed(|id| id != 8));
        assert!(!Run { ids: vec![2, 2], values: vec![1, 2] }.is_well_formed(|_| true));
        let mut cursor = Cursor::new(Some(&r));
        assert_eq!([1, 2, 5, 8, 9].map(|id| cursor.holds(id)), [false, true, false, true, false]);
    }
}
