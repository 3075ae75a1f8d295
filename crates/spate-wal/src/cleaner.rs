//! The background cleaner: one thread per log, started on the first
//! background `clean`, that deletes (or recycles) the files of segments
//! already taken out of the live list.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam::channel::{Sender, unbounded};

use crate::file_log::Shared;
use crate::segment::Segment;

/// The handle of a log's cleaner thread.
pub(crate) struct Cleaner {
    sender: Option<Sender<Vec<Arc<Segment>>>>,
    thread: Option<JoinHandle<()>>,
}

impl Cleaner {
    /// Starts the thread. If the OS refuses a thread, every `submit` fails
    /// and the caller deletes in its own thread.
    pub(crate) fn start(shared: Arc<Shared>) -> Self {
        let (sender, receiver) = unbounded::<Vec<Arc<Segment>>>();
        let spawned = std::thread::Builder::new().name(String::from("spate-wal-cleaner")).spawn(move || {
            for victims in receiver {
                if let Err(e) = shared.retire_segments(&victims) {
                    tracing::warn!(error = %e, "background cleaning of write-ahead log segments failed");
                }
            }
        });
        match spawned {
            Ok(thread) => Cleaner { sender: Some(sender), thread: Some(thread) },
            Err(e) => {
                tracing::warn!(error = %e, "could not start the cleaner thread; cleaning in the caller");
                Cleaner { sender: None, thread: None }
            }
        }
    }

    /// Queues `victims` for deletion; gives them back when there is no thread.
    pub(crate) fn submit(&self, victims: Vec<Arc<Segment>>) -> Result<(), Vec<Arc<Segment>>> {
        match &self.sender {
            Some(sender) => sender.send(victims).map_err(|e| e.into_inner()),
            None => Err(victims),
        }
    }

    /// Lets the thread finish what is queued and waits for it.
    pub(crate) fn finish(mut self) {
        self.sender = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::warn!("the write-ahead log cleaner thread panicked");
        }
    }
}
