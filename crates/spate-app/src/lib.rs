//! Applications of many spate processes: the same job started on N
//! machines (or N times on one), its Kafka partitions spread among them by
//! Kafka's consumer-group protocol, nothing lost or repeated when a member
//! dies, joins or leaves. Kafka and the checkpoint store are the only
//! things the members share: there is no coordinator of spate's own.
//!
//! It features:
//!
//! - **Members and tasks.** Every process is a [`Member`] of the
//!   application's consumer group (cooperative-sticky assignment, KIP-429,
//!   or the broker-side protocol of KIP-848). Each partition it is given is
//!   a task: the stage's pipeline on that one partition, in a streaming
//!   context of its own, with its own offsets, commits and state under
//!   `<location>/tasks/<topic>-<partition>/`. A partition that moves is
//!   resumed by its new owner from that checkpoint, at the next uncommitted
//!   batch with exactly the logged offsets.
//! - **Rebalances at batch boundaries.** A revoked task finishes its batch
//!   in flight (or, when the member was dropped from the group, abandons
//!   it: never half-commits it) and releases its checkpoint before the
//!   group hands the partition on; the checkpoint's writer lock (a lease in
//!   S3, renewed with conditional puts, with per-batch put-if-absent
//!   entries) keeps two owners from both writing it.
//! - **Keyed aggregation across partitions.** A stage sends records on by
//!   key ([`TaskBuilder::repartition_by_key`]) through an internal topic
//!   named after the application and the operator, with the input's
//!   partition count; a later stage reads it
//!   ([`TaskBuilder::repartitioned`]). A stage over every key at once reads
//!   a one-partition internal topic ([`Topology::single_stage`]).
//! - **Watermarks across the hop.** Every task that writes an internal
//!   topic ends each batch with a progress mark to each of its partitions,
//!   in the batch's transaction; a reading task keeps one watermark per
//!   writer task and takes the smallest, so a writer running ahead through
//!   its backlog makes no other writer's records late.
//! - **Exactly once across members.** Each member has one transactional
//!   producer. Every batch of every task ends with one transaction: what the
//!   stage emitted and the batch's offsets, committed under the member's
//!   current group metadata (KIP-447), so the broker refuses a zombie's
//!   commit; internal topics are read with `read_committed`. `commits/N`
//!   follows the transaction, so a dropped member commits nothing.
//!
//! It is not a scheduler: which member runs which task is the group's
//! choice, and a task runs where its partition is assigned.
//!
//! ```no_run
//! use spate_app::{Emit, Member, MemberSettings, Topology};
//! use spate_core::Duration;
//! use spate_runtime::StreamingSettings;
//!
//! // Lines of `lines` split into words, counted per word across members.
//! let topology = Topology::new("wordcount")
//!     .stage_from_topic("split", "lines", |task| {
//!         let words = task.records().flat_map(|r| {
//!             let text = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
//!             text.split_whitespace().map(|w| (w.to_string(), 1u64)).collect::<Vec<_>>()
//!         });
//!         task.repartition_by_key("words", &words, |_| None)
//!     })
//!     .stage_from_repartition("count", "words", |task| {
//!         let counts = task.repartitioned::<String, u64>().records().reduce_by_key(|a, b| a + b);
//!         Ok(counts.map(|(word, n)| Emit::to_topic("counts", Some(word.into_bytes()), n.to_string().into_bytes())))
//!     });
//! let streaming = StreamingSettings::new(Duration::from_secs(1)).with_max_memory_bytes(256 << 20);
//! let settings = MemberSettings::new("127.0.0.1:9092", "/var/lib/wordcount", streaming, "host-a");
//! let member = Member::start(topology, settings, None)?;
//! // … until asked to stop:
//! member.leave()?;
//! # Ok::<(), spate_app::AppError>(())
//! ```

#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod error;
mod internal;
mod member;
mod memory;
mod task;
mod topology;
mod watch;

pub use error::AppError;
pub use internal::decode_repartitioned;
pub use member::{Member, MemberEvent, MemberListener, MemberSettings};
pub use topology::{DeclareTask, Emit, InternalTopic, Repartitioned, TaskBuilder, TaskId, Topology};
