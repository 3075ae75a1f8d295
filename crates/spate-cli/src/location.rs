//! Where a checkpoint lives: a local directory or `s3://bucket/prefix`, and
//! the object store settings the `--s3-*` flags give (each one left out
//! comes from its AWS environment variable, read by the object store client).

use std::path::Path;

use spate_logstore::{CheckpointSettings, ObjectStoreSettings};

use crate::args::S3Args;
use crate::error::CliError;

/// The object store settings of the flags. The secret comes from a file so
/// that it never shows in the process list.
pub(crate) fn object_store_settings(args: &S3Args) -> Result<ObjectStoreSettings, CliError> {
    let secret_access_key = match &args.s3_secret_access_key_file {
        Some(path) => Some(read_secret(path)?),
        None => None,
    };
    Ok(ObjectStoreSettings {
        endpoint: args.s3_endpoint.clone(),
        region: args.s3_region.clone(),
        access_key_id: args.s3_access_key_id.clone(),
        secret_access_key,
        // Left out: AWS_ALLOW_HTTP decides.
        allow_http: args.s3_allow_http.then_some(true),
    })
}

/// Opening options that reach the checkpoint with `settings`.
pub(crate) fn checkpoint_options(settings: &ObjectStoreSettings) -> CheckpointSettings {
    CheckpointSettings::new().with_object_store(settings.clone())
}

/// The secret in `path`, without the newline an editor or `echo` leaves at its end.
fn read_secret(path: &Path) -> Result<String, CliError> {
    const FLAG: &str = "--s3-secret-access-key-file";
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("cannot read the secret access key of {FLAG} {}: {e}", path.display())))?;
    let secret = text.strip_suffix('\n').map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t));
    if secret.is_empty() {
        return Err(CliError::usage(format!("{FLAG} {} is empty: it must hold the secret access key", path.display())));
    }
    Ok(secret.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ExitCode;

    #[test]
    fn the_flags_print_no_credential() {
        let args = S3Args { s3_access_key_id: Some("AKIAEXAMPLEKEYID".into()), ..S3Args::default() };
        let printed = format!("{args:?}");
        assert!(!printed.contains("AKIAEXAMPLEKEYID"), "{printed}");
        let command = <crate::args::Cli as clap::Parser>::try_parse_from([
            "spate",
            "checkpoint",
            "inspect",
            "s3://b/ck",
            "--s3-access-key-id",
            "AKIAEXAMPLEKEYID",
        ]);
        let printed = format!("{:?}", command.unwrap());
        assert!(!printed.contains("AKIAEXAMPLEKEYID"), "{printed}");
    }

    #[test]
    fn the_secret_is_read_from_its_file_without_the_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        for (content, expected) in [("s3cr3t\n", "s3cr3t"), ("s3cr3t\r\n", "s3cr3t"), ("s3 cr3t ", "s3 cr3t ")] {
            std::fs::write(&path, content).unwrap();
            let args = S3Args { s3_secret_access_key_file: Some(path.clone()), ..S3Args::default() };
            let settings = object_store_settings(&args).unwrap();
            assert_eq!(settings.secret_access_key.as_deref(), Some(expected), "{content:?}");
        }
    }

    #[test]
    fn flags_left_out_stay_unset_for_the_environment_to_fill() {
        let settings = object_store_settings(&S3Args::default()).unwrap();
        assert_eq!(settings, ObjectStoreSettings::default());
        let args = S3Args {
            s3_endpoint: Some("http://127.0.0.1:8333".into()),
            s3_region: Some("eu-west-1".into()),
            s3_access_key_id: Some("id".into()),
            s3_allow_http: true,
            ..S3Args::default()
        };
        let settings = object_store_settings(&args).unwrap();
        assert_eq!(settings.endpoint.as_deref(), Some("http://127.0.0.1:8333"));
        assert_eq!(settings.region.as_deref(), Some("eu-west-1"));
        assert_eq!(settings.access_key_id.as_deref(), Some("id"));
        assert_eq!(settings.allow_http, Some(true));
    }

    #[test]
    fn a_missing_or_empty_secret_file_is_a_usage_error_naming_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        for path in [dir.path().join("missing"), empty] {
            let args = S3Args { s3_secret_access_key_file: Some(path), ..S3Args::default() };
            let error = object_store_settings(&args).unwrap_err();
            assert_eq!(error.exit_code(), ExitCode::Usage);
            assert!(error.to_string().contains("--s3-secret-access-key-file"), "{error}");
        }
    }
}
