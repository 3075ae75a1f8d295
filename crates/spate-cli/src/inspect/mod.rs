//! `spate checkpoint inspect`: everything a person needs to know about a
//! checkpoint without changing it. A location is either one checkpoint
//! ([`checkpoint`]: its logs, verdict, last offsets, lock and sizes) or an
//! application's, holding a checkpoint per task ([`app`]: the tasks and the
//! members that hold them).

use std::path::Path;

use spate_logstore::ObjectStoreSettings;

use crate::error::CliError;

mod app;
mod checkpoint;

pub(crate) use app::{TASKS_DIR, is_application};

/// `spate checkpoint inspect LOCATION [--json]`: an application's location
/// is shown as the application, any other as one checkpoint.
pub(crate) fn run(dir: &Path, settings: &ObjectStoreSettings, as_json: bool) -> Result<String, CliError> {
    let (text, json) = if app::is_application(dir, settings) {
        let application = app::inspect_application(dir, settings)?;
        (application.to_text(), as_json.then(|| application.to_json()))
    } else {
        let inspection = checkpoint::inspect(dir, settings)?;
        (inspection.to_text(), as_json.then(|| inspection.to_json()))
    };
    Ok(match json {
        // Serialising a `Value` cannot fail; fall back to the compact form anyway.
        Some(json) => serde_json::to_string_pretty(&json).unwrap_or_else(|_| json.to_string()),
        None => text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let root = tempfile::tempdir().unwrap();
        let missing = root.path().join("nope");
        let error = run(&missing, &ObjectStoreSettings::default(), false).unwrap_err();
        assert!(error.to_string().contains("nope"), "{error}");
    }
}
