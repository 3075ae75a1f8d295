//! Helpers shared by the cross-crate tests.

#![allow(dead_code)]

pub(crate) mod s3;
