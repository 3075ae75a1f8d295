//! The driver-side ReceivedBlockTracker: block-to-batch allocation with a replayable event log.
