//! The DStream graph: transformations, incremental windows and named, upgradeable state.
