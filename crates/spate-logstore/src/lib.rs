//! HDFS-style metadata logs (offsets, commits), the checkpoint file manager, the writer lock and the recovery verdict.
