//! The graph's checkpoint: a descriptor (data about the operators, never
//! code) and each stateful operator's state as bytes, matched by name when
//! a new build of the code restores it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use spate_core::{CoreError, ReadSeek, SeekWrite};

use crate::error::DStreamError;
use crate::graph::Graph;
use crate::node::StatefulNode;

/// The version of the descriptor's layout.
pub const DESCRIPTOR_FORMAT_VERSION: u32 = 1;

/// What the checkpoint records about a graph (written to `<checkpoint>/graph`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphDescriptor {
    /// Layout version of this descriptor.
    pub format_version: u32,
    /// The batch interval in milliseconds.
    pub batch_interval_ms: u64,
    /// Every operator, in graph order.
    pub operators: Vec<OperatorDescriptor>,
}

/// One operator of a [`GraphDescriptor`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorDescriptor {
    /// The stable name.
    pub name: String,
    /// The kind (`map`, `reduce_by_key_and_window_inv`, `map_with_state`, …).
    pub kind: String,
    /// The names of the operators it reads.
    pub parents: Vec<String>,
    /// True when it keeps state across batches.
    pub stateful: bool,
    /// `std::any::type_name` of the key, for keyed stateful operators.
    pub key_type: Option<String>,
    /// `std::any::type_name` of the values it reads, for stateful operators.
    pub value_type: Option<String>,
    /// `std::any::type_name` of the state it keeps, for stateful operators.
    pub state_type: Option<String>,
    /// Window length in milliseconds, for windows.
    pub window_ms: Option<u64>,
    /// Slide in milliseconds, for windows.
    pub slide_ms: Option<u64>,
    /// The windows of an event-time operator (`tumbling 10000 ms`,
    /// `sliding 10000 ms by 2000 ms`, `session gap 30000 ms`). Absent in
    /// descriptors written before event time existed, which had none (read
    /// as `None` from JSON; always written, so binary encodings round-trip).
    #[serde(default)]
    pub event_time: Option<String>,
}

/// How [`Graph::restore`] treats checkpointed state whose operator is gone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestorePolicy {
    allow_dropping: bool,
    allowed: BTreeSet<String>,
}

impl RestorePolicy {
    /// A removed stateful operator is an error (the default).
    pub fn strict() -> Self {
        Self::default()
    }

    /// The state of every removed stateful operator is dropped.
    pub fn allow_dropping_removed() -> Self {
        RestorePolicy { allow_dropping: true, allowed: BTreeSet::new() }
    }

    /// The state of the named removed operators is dropped; others are errors.
    pub fn allow_dropping<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Self {
        RestorePolicy { allow_dropping: false, allowed: names.into_iter().map(Into::into).collect() }
    }

    fn may_drop(&self, name: &str) -> bool {
        self.allow_dropping || self.allowed.contains(name)
    }
}

/// What [`Graph::restore`] did with each stateful operator.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Operators whose state was restored.
    pub resumed: Vec<String>,
    /// New operators, starting with empty state.
    pub started_empty: Vec<String>,
    /// Removed operators whose state was dropped.
    pub dropped: Vec<String>,
}

/// Lists every field in which the old and new descriptions of an operator
/// differ in a way its state cannot survive.
fn differences(old: &OperatorDescriptor, new: &OperatorDescriptor, old_ms: u64, new_ms: u64) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |field: &str, a: &Option<String>, b: &Option<String>| {
        if a != b {
            let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".to_string());
            out.push(format!("operator `{}`: {field} changed from {} to {}", new.name, show(a), show(b)));
        }
    };
    check("kind", &Some(old.kind.clone()), &Some(new.kind.clone()));
    check("key type", &old.key_type, &new.key_type);
    check("value type", &old.value_type, &new.value_type);
    check("state type", &old.state_type, &new.state_type);
    let ms = |v: Option<u64>| v.map(|ms| format!("{ms} ms"));
    check("window", &ms(old.window_ms), &ms(new.window_ms));
    check("slide", &ms(old.slide_ms), &ms(new.slide_ms));
    check("event-time windows", &old.event_time, &new.event_time);
    if new.window_ms.is_some() {
        check("batch interval", &ms(Some(old_ms)), &ms(Some(new_ms)));
    }
    out
}

impl Graph {
    /// The descriptor to write to the checkpoint.
    pub fn descriptor(&self) -> GraphDescriptor {
        let operators = self
            .metas
            .iter()
            .zip(&self.names)
            .map(|(meta, name)| OperatorDescriptor {
                name: name.clone(),
                kind: meta.kind.to_string(),
                parents: meta.parents.iter().filter_map(|p| self.names.get(*p).cloned()).collect(),
                stateful: meta.state.is_some(),
                key_type: meta.state.as_ref().and_then(|s| s.key_type).map(str::to_string),
                value_type: meta.state.as_ref().map(|s| s.value_type.to_string()),
                state_type: meta.state.as_ref().map(|s| s.state_type.to_string()),
                window_ms: meta.window.map(|(window, _)| window.as_millis()),
                slide_ms: meta.window.map(|(_, slide)| slide.as_millis()),
                event_time: meta.event_time.clone(),
            })
            .collect();
        GraphDescriptor {
            format_version: DESCRIPTOR_FORMAT_VERSION,
            batch_interval_ms: self.batch_interval.as_millis(),
            operators,
        }
    }

    /// Each stateful operator's whole state, by name, as a `FrameCodec`
    /// frame. Take it between batches; changes taken later (see
    /// [`Graph::snapshot_state_changes`]) are relative to it.
    pub fn snapshot_state(&mut self) -> Result<Vec<(String, Vec<u8>)>, DStreamError> {
        let mut out = Vec::new();
        for (node, name) in self.nodes.iter_mut().zip(&self.names) {
            if let Some(state) = node.state_mut() {
                let bytes =
                    state.snapshot().map_err(|source| DStreamError::StateEncode { operator: name.clone(), source })?;
                out.push((name.clone(), bytes));
            }
        }
        Ok(out)
    }

    /// [`Graph::snapshot_state`] streamed: `write` is given each stateful
    /// operator's name and a [`StateWriter`] that writes its whole state
    /// where the caller streams it (a file), so a state larger than memory
    /// (one on disk) is never in memory whole. Take it between batches, as
    /// [`Graph::snapshot_state`]; `write`'s first error stops it.
    pub fn snapshot_state_streamed<E>(
        &mut self,
        write: impl FnMut(&str, &mut StateWriter<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.offer_state_writers(false, write)
    }

    /// [`Graph::snapshot_state_changes`] offered to `write` operator by
    /// operator, to be streamed into files: each [`StateWriter`] says
    /// whether it writes changes ([`StateWriter::is_changes`]) or the
    /// whole state, so that `write` can put a header before changes.
    pub fn snapshot_state_changes_streamed<E>(
        &mut self,
        write: impl FnMut(&str, &mut StateWriter<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.offer_state_writers(true, write)
    }

    /// Offers each stateful operator's [`StateWriter`] to `write`: of its
    /// changes when `changes` and the operator takes them now, else of
    /// its whole state.
    fn offer_state_writers<E>(
        &mut self,
        changes: bool,
        mut write: impl FnMut(&str, &mut StateWriter<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        for (node, name) in self.nodes.iter_mut().zip(&self.names) {
            if let Some(state) = node.state_mut() {
                let changes = changes && state.takes_changes();
                write(name, &mut StateWriter { state, operator: name, changes })?;
            }
        }
        Ok(())
    }

    /// Each stateful operator's state, by name: what changed since its
    /// previous snapshot where the operator can say (its large keyed
    /// windows), else the whole state. Take it between batches, after a
    /// snapshot of each operator (whole, or restored from a checkpoint)
    /// was written where a restore will find it.
    pub fn snapshot_state_changes(&mut self) -> Result<Vec<(String, StateSnapshot)>, DStreamError> {
        let mut out = Vec::new();
        for (node, name) in self.nodes.iter_mut().zip(&self.names) {
            let Some(state) = node.state_mut() else { continue };
            let encode_error = |source| DStreamError::StateEncode { operator: name.clone(), source };
            let snapshot = match state.snapshot_changes() {
                Some(changes) => StateSnapshot::Changes(changes.map_err(encode_error)?),
                None => StateSnapshot::Whole(state.snapshot().map_err(encode_error)?),
            };
            out.push((name.clone(), snapshot));
        }
        Ok(out)
    }

    /// Restores state checkpointed by an earlier build of the graph. Stateful
    /// operators are matched by name: unchanged ones resume, new ones start
    /// empty, removed ones are an error unless `policy` allows dropping them,
    /// and one whose kind, types, window or slide changed is an error that
    /// lists every difference. Nothing is restored unless everything fits.
    pub fn restore(
        &mut self,
        descriptor: &GraphDescriptor,
        states: Vec<(String, Vec<u8>)>,
        policy: &RestorePolicy,
    ) -> Result<RestoreReport, DStreamError> {
        let chains = states.into_iter().map(|(name, bytes)| (name, vec![bytes])).collect();
        self.restore_chains(descriptor, chains, policy)
    }

    /// Like [`Graph::restore`], each operator's state given as a chain: a
    /// whole snapshot followed by the changes taken after it, oldest first
    /// (see [`Graph::snapshot_state_changes`]).
    pub fn restore_chains(
        &mut self,
        descriptor: &GraphDescriptor,
        states: Vec<(String, Vec<Vec<u8>>)>,
        policy: &RestorePolicy,
    ) -> Result<RestoreReport, DStreamError> {
        let states = states
            .into_iter()
            .map(|(name, chain)| (name, chain.into_iter().map(StateFile::in_memory).collect()))
            .collect();
        self.restore_chains_from(descriptor, states, policy)
    }

    /// Like [`Graph::restore_chains`], each state file opened only when its
    /// operator is restored and read as a stream: an operator whose state
    /// can outgrow memory (`map_with_state`) decodes its whole snapshot
    /// entry by entry, so neither the chains nor one large snapshot are
    /// held in memory whole. Nothing is opened unless the descriptors fit.
    pub fn restore_chains_from(
        &mut self,
        descriptor: &GraphDescriptor,
        states: Vec<(String, Vec<StateFile<'_>>)>,
        policy: &RestorePolicy,
    ) -> Result<RestoreReport, DStreamError> {
        if descriptor.format_version > DESCRIPTOR_FORMAT_VERSION {
            return Err(DStreamError::IncompatibleState {
                differences: vec![format!(
                    "the graph descriptor has format version {}, this build reads up to {DESCRIPTOR_FORMAT_VERSION}",
                    descriptor.format_version
                )],
            });
        }
        let current = self.descriptor();
        let new_by_name: BTreeMap<&str, &OperatorDescriptor> =
            current.operators.iter().filter(|op| op.stateful).map(|op| (op.name.as_str(), op)).collect();
        let old_stateful: Vec<&OperatorDescriptor> = descriptor.operators.iter().filter(|op| op.stateful).collect();
        let mut report = RestoreReport::default();
        let (mut removed, mut diffs) = (Vec::new(), Vec::new());
        for old in &old_stateful {
            match new_by_name.get(old.name.as_str()) {
                None if policy.may_drop(&old.name) => report.dropped.push(old.name.clone()),
                None => removed.push(old.name.clone()),
                Some(new) => {
                    diffs.extend(differences(old, new, descriptor.batch_interval_ms, current.batch_interval_ms))
                }
            }
        }
        if !removed.is_empty() {
            return Err(DStreamError::RemovedOperators { operators: removed });
        }
        if !diffs.is_empty() {
            return Err(DStreamError::IncompatibleState { differences: diffs });
        }
        let mut states: BTreeMap<String, Vec<StateFile<'_>>> = states.into_iter().collect();
        let old_names: BTreeSet<&str> = old_stateful.iter().map(|op| op.name.as_str()).collect();
        if let Some(stray) = states.keys().find(|name| !old_names.contains(name.as_str())) {
            return Err(DStreamError::UnexpectedState { operator: stray.clone() });
        }
        if let Some(missing) =
            old_names.iter().find(|name| !report.dropped.iter().any(|d| d == *name) && !states.contains_key(**name))
        {
            return Err(DStreamError::MissingState { operator: (*missing).to_string() });
        }
        let partitions = self.partitions;
        for (node, name) in self.nodes.iter_mut().zip(&self.names) {
            let Some(state) = node.state_mut() else { continue };
            match states.remove(name) {
                Some(chain) => {
                    restore_chain(state, chain, partitions)
                        .map_err(|source| DStreamError::StateDecode { operator: name.clone(), source })?;
                    report.resumed.push(name.clone());
                }
                None => report.started_empty.push(name.clone()),
            }
        }
        tracing::info!(
            resumed = ?report.resumed,
            started_empty = ?report.started_empty,
            dropped = ?report.dropped,
            "restored graph state"
        );
        Ok(report)
    }
}

/// Restores a whole snapshot, then applies the changes after it in order.
fn restore_chain(state: &mut dyn StatefulNode, chain: Vec<StateFile<'_>>, partitions: usize) -> Result<(), CoreError> {
    let mut links = chain.into_iter();
    let Some(whole) = links.next() else {
        return Err(CoreError::Decode { reason: "an empty chain of snapshots".to_string() });
    };
    state.restore_from(&mut *whole.open()?, partitions)?;
    for change in links {
        state.apply_changes_from(&mut *change.open()?, partitions)?;
    }
    Ok(())
}

/// One file of a state chain (see [`Graph::restore_chains_from`]), opened
/// when its operator is restored: a reader at the start of its frame.
pub struct StateFile<'a> {
    open: Box<dyn FnOnce() -> Result<Box<dyn ReadSeek + 'a>, CoreError> + 'a>,
}

impl<'a> StateFile<'a> {
    /// A file `open` opens when it is read. What `open` fails with is the
    /// restore's error (a [`CoreError::Read`] for a storage failure).
    pub fn new(open: impl FnOnce() -> Result<Box<dyn ReadSeek + 'a>, CoreError> + 'a) -> Self {
        StateFile { open: Box::new(open) }
    }

    /// A file already read into memory.
    pub fn in_memory(bytes: Vec<u8>) -> Self {
        StateFile::new(move || Ok(Box::new(std::io::Cursor::new(bytes))))
    }

    fn open(self) -> Result<Box<dyn ReadSeek + 'a>, CoreError> {
        (self.open)()
    }
}

impl std::fmt::Debug for StateFile<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateFile").finish_non_exhaustive()
    }
}

/// One stateful operator's state, whole or what changed, as
/// [`Graph::snapshot_state_streamed`] and
/// [`Graph::snapshot_state_changes_streamed`] offer it to be written.
pub struct StateWriter<'a> {
    state: &'a mut dyn StatefulNode,
    operator: &'a str,
    changes: bool,
}

impl StateWriter<'_> {
    /// True when [`StateWriter::write_to`] writes what changed since the
    /// operator's previous snapshot ([`StateSnapshot::Changes`]'s frame),
    /// false when it writes the whole state.
    pub fn is_changes(&self) -> bool {
        self.changes
    }

    /// Writes the state to `out` as the frame [`Graph::snapshot_state`]
    /// (or, for changes, [`Graph::snapshot_state_changes`]) gives for the
    /// operator; returns the bytes written. Changes taken later are
    /// relative to the state it wrote last.
    pub fn write_to(&mut self, out: &mut dyn SeekWrite) -> Result<u64, DStreamError> {
        let operator = self.operator;
        let written = if self.changes { self.state.snapshot_changes_to(out) } else { self.state.snapshot_to(out) };
        written.map_err(|source| DStreamError::StateEncode { operator: operator.to_string(), source })
    }
}

/// One stateful operator's snapshot, as [`Graph::snapshot_state_changes`] takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateSnapshot {
    /// The whole state: a restore starts from it.
    Whole(Vec<u8>),
    /// What changed since the operator's previous snapshot: a restore
    /// applies it after that snapshot (and the changes between).
    Changes(Vec<u8>),
}

impl StateSnapshot {
    /// The snapshot's bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            StateSnapshot::Whole(bytes) | StateSnapshot::Changes(bytes) => bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_written_before_event_time_existed_still_reads() {
        let json = r#"{"format_version":1,"batch_interval_ms":1000,"operators":[{"name":"counts",
            "kind":"reduce_by_key_and_window_inv","parents":["words"],"stateful":true,"key_type":"String",
            "value_type":"u64","state_type":"u64","window_ms":30000,"slide_ms":2000}]}"#;
        let descriptor: GraphDescriptor = serde_json::from_str(json).unwrap();
        assert_eq!(descriptor.operators[0].event_time, None);
        assert_eq!(descriptor.operators[0].window_ms, Some(30_000));
    }
}
