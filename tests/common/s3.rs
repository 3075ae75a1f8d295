//! The S3 server the object-store tests run against: started by
//! `cargo xtask test` (SeaweedFS) and named by `SPATE_TEST_S3_ENDPOINT`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use spate::logstore::ObjectStoreSettings;

/// The endpoint, or a panic that says how to get one: a test that needs the
/// server never passes without it.
pub(crate) fn endpoint() -> String {
    std::env::var("SPATE_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "SPATE_TEST_S3_ENDPOINT is not set: this test needs an S3 server. Run it with `cargo xtask test`, \
             or start one with `cargo xtask s3 start` and export what it prints"
        )
    })
}

/// The bucket the tests write into.
pub(crate) fn bucket() -> String {
    std::env::var("SPATE_TEST_S3_BUCKET").unwrap_or_else(|_| "spate-test".to_string())
}

/// Settings that reach the test server whatever the AWS environment says.
pub(crate) fn settings() -> ObjectStoreSettings {
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
    ObjectStoreSettings {
        endpoint: Some(endpoint()),
        region: Some(var("AWS_REGION", "us-east-1")),
        access_key_id: Some(var("AWS_ACCESS_KEY_ID", "spate-test")),
        secret_access_key: Some(var("AWS_SECRET_ACCESS_KEY", "spate-test-secret")),
        allow_http: Some(true),
    }
}

/// A location no other test (or earlier run) uses: `s3://<bucket>/tests/<name>-<pid>-<n>-<ns>`.
pub(crate) fn fresh_location(name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    PathBuf::from(format!("s3://{}/tests/{name}-{}-{n}-{nanos}", bucket(), std::process::id()))
}
