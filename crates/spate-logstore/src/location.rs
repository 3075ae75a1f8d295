//! Where a checkpoint lives: a local directory, or a prefix in an S3
//! bucket (`s3://bucket/prefix`), and the file manager for each.
//!
//! A checkpoint location is handled as a path everywhere (joined, shown in
//! messages): `s3://bucket/prefix/offsets/7` names an object exactly as
//! `/data/ck/offsets/7` names a file. Only the file manager tells them apart.

use std::path::Path;
use std::sync::Arc;

use crate::error::{LogStoreError, Result};
use crate::file_manager::{CheckpointFileManager, LocalFileManager};

/// The URL scheme of checkpoints in S3.
pub const S3_SCHEME: &str = "s3://";

/// How to reach the object store of an `s3://` checkpoint. Each setting left
/// unset comes from the usual AWS environment variables (`AWS_ENDPOINT_URL`,
/// `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
/// `AWS_SESSION_TOKEN`, `AWS_ALLOW_HTTP`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ObjectStoreSettings {
    /// The S3 endpoint (`http://127.0.0.1:8333` for a local server); AWS when unset.
    pub endpoint: Option<String>,
    /// The region.
    pub region: Option<String>,
    /// The access key id.
    pub access_key_id: Option<String>,
    /// The secret access key.
    pub secret_access_key: Option<String>,
    /// Allow plain `http://` endpoints.
    pub allow_http: Option<bool>,
}

impl std::fmt::Debug for ObjectStoreSettings {
    // Never print a credential: a debug line or a panic message ends up in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStoreSettings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &redacted(&self.access_key_id))
            .field("secret_access_key", &redacted(&self.secret_access_key))
            .field("allow_http", &self.allow_http)
            .finish()
    }
}

/// A credential as [`std::fmt::Debug`] shows it: whether it is set, never what it is.
pub fn redacted(credential: &Option<String>) -> Option<&'static str> {
    credential.as_ref().map(|_| "<redacted>")
}

/// True when `location` names a checkpoint in an object store (`s3://…`).
pub fn is_object_store_location(location: &Path) -> bool {
    location.to_str().is_some_and(|s| s.contains("://"))
}

/// The bucket and key prefix of `s3://bucket/prefix`.
pub(crate) fn parse_s3_location(location: &Path) -> Result<(String, String)> {
    let text = location.to_str().unwrap_or_default();
    let refuse = |reason: &str| LogStoreError::Location { location: text.to_string(), reason: reason.to_string() };
    let rest =
        text.strip_prefix(S3_SCHEME).ok_or_else(|| refuse("only s3://bucket/prefix object stores are supported"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(refuse("names no bucket (expected s3://bucket/prefix)"));
    }
    let prefix = prefix.trim_matches('/');
    if prefix.split('/').any(|part| part == "." || part == "..") {
        return Err(refuse("the prefix may not contain `.` or `..`"));
    }
    Ok((bucket.to_string(), prefix.to_string()))
}

/// The file manager for the checkpoint at `location`: the local file system
/// for a path, the object store for `s3://bucket/prefix`.
pub fn file_manager_for(location: &Path, settings: &ObjectStoreSettings) -> Result<Arc<dyn CheckpointFileManager>> {
    if !is_object_store_location(location) {
        return Ok(Arc::new(LocalFileManager));
    }
    object_store_file_manager(location, settings)
}

#[cfg(feature = "s3")]
fn object_store_file_manager(
    location: &Path,
    settings: &ObjectStoreSettings,
) -> Result<Arc<dyn CheckpointFileManager>> {
    Ok(Arc::new(crate::object_files::ObjectStoreFileManager::connect(location, settings)?))
}

#[cfg(not(feature = "s3"))]
fn object_store_file_manager(
    location: &Path,
    _settings: &ObjectStoreSettings,
) -> Result<Arc<dyn CheckpointFileManager>> {
    parse_s3_location(location)?;
    Err(LogStoreError::Location {
        location: location.display().to_string(),
        reason: "this build has no object store support; build spate-logstore with the `s3` feature".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_locations_are_parsed_and_bad_ones_refused() {
        let parse = |s: &str| parse_s3_location(Path::new(s));
        assert_eq!(parse("s3://b/jobs/a/").unwrap(), ("b".to_string(), "jobs/a".to_string()));
        assert_eq!(parse("s3://b").unwrap(), ("b".to_string(), String::new()));
        for bad in ["s3:///x", "gs://b/x", "s3://b/../x"] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.starts_with(&format!("checkpoint location {bad}:")), "{err}");
        }
        assert!(is_object_store_location(Path::new("s3://b/x")));
        assert!(!is_object_store_location(Path::new("/tmp/s3/x")));
    }

    #[test]
    fn no_credential_is_ever_printed() {
        let settings = ObjectStoreSettings {
            access_key_id: Some("AKIAEXAMPLEKEYID".into()),
            secret_access_key: Some("hunter2".into()),
            ..Default::default()
        };
        let printed = format!("{settings:?}");
        assert!(!printed.contains("AKIAEXAMPLEKEYID") && !printed.contains("hunter2"), "{printed}");
        assert!(printed.contains("access_key_id: Some(\"<redacted>\")"), "{printed}");
    }
}
