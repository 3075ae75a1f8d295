//! Test hooks that stop or break the driver at a known point of a batch, so
//! tests of crashes, signals and panics do not depend on timing. They are
//! off unless the environment variable `SPATE_FAILPOINTS` names one when a
//! context is created; nothing else reads it. Only a build with the
//! `failpoints` feature has them: without it, nothing ever fires.
//!
//! `SPATE_FAILPOINTS` is one of:
//!
//! - `hold-before-outputs`: once `offsets/N` is durable, before any output
//!   of batch N starts;
//! - `hold-in-batch`: once every output of batch N finished, before
//!   `commits/N` is written;
//! - `hold-after-commit`: once `commits/N` is durable, before the state
//!   checkpoint, the purge and the progress report of batch N;
//! - `panic-in-batch`: the driver panics once `offsets/N` is durable;
//! - `panic-in-output`: the first output job of batch N panics.
//!
//! A hold writes the file `held` (its content: N) into the directory
//! `SPATE_FAILPOINT_DIR` and waits until a file `release` appears there.
//! N is the first batch whose id is at least `SPATE_FAILPOINT_BATCH`
//! (default 0); each failpoint fires once per context.

#[cfg(feature = "failpoints")]
use std::path::PathBuf;

use spate_core::BatchId;

use crate::error::RuntimeError;

/// The variable that names the failpoint.
const FAILPOINTS_VAR: &str = "SPATE_FAILPOINTS";
/// The variable that names the directory of a hold's `held` and `release` files.
#[cfg(feature = "failpoints")]
const FAILPOINT_DIR_VAR: &str = "SPATE_FAILPOINT_DIR";
/// The variable that names the first batch a failpoint may fire in.
#[cfg(feature = "failpoints")]
const FAILPOINT_BATCH_VAR: &str = "SPATE_FAILPOINT_BATCH";

/// Where in a batch a failpoint sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Point {
    /// `offsets/N` durable, no output started.
    OffsetsLogged,
    /// Every output finished, `commits/N` not written.
    OutputsDone,
    /// `commits/N` durable.
    Committed,
}

/// What the failpoint does.
#[cfg(feature = "failpoints")]
#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    Hold { at: Point, dir: PathBuf },
    PanicInDriver,
    PanicInOutput,
}

/// The configured failpoint of one context (usually none).
#[derive(Debug, Default)]
pub(crate) struct Failpoints {
    #[cfg(feature = "failpoints")]
    armed: Option<(Action, BatchId)>,
}

#[cfg(not(feature = "failpoints"))]
impl Failpoints {
    /// None: this build has no failpoints. One named in the environment is
    /// reported, since a test that sets it would otherwise wait for a hold
    /// that never comes.
    pub(crate) fn from_env() -> Result<Self, RuntimeError> {
        if std::env::var_os(FAILPOINTS_VAR).is_some_and(|name| !name.is_empty()) {
            tracing::warn!("{FAILPOINTS_VAR} is set, but this build has no failpoints (feature `failpoints`)");
        }
        Ok(Failpoints::default())
    }

    /// Never fires.
    pub(crate) fn reach(&mut self, _point: Point, _batch: BatchId) {}

    /// Never fires.
    pub(crate) fn output_panics(&mut self, _batch: BatchId) -> bool {
        false
    }
}

#[cfg(feature = "failpoints")]
impl Failpoints {
    /// Reads the environment; a failpoint that is named but malformed is an error.
    pub(crate) fn from_env() -> Result<Self, RuntimeError> {
        let Some(name) = std::env::var_os(FAILPOINTS_VAR) else { return Ok(Failpoints::default()) };
        let bad = |reason: String| RuntimeError::InvalidSetting { setting: FAILPOINTS_VAR.to_string(), reason };
        let name = name.into_string().map_err(|_| bad("not UTF-8".to_string()))?;
        let dir = || {
            std::env::var_os(FAILPOINT_DIR_VAR)
                .map(PathBuf::from)
                .ok_or_else(|| bad(format!("{name} needs {FAILPOINT_DIR_VAR}")))
        };
        let action = match name.as_str() {
            "" => return Ok(Failpoints::default()),
            "hold-before-outputs" => Action::Hold { at: Point::OffsetsLogged, dir: dir()? },
            "hold-in-batch" => Action::Hold { at: Point::OutputsDone, dir: dir()? },
            "hold-after-commit" => Action::Hold { at: Point::Committed, dir: dir()? },
            "panic-in-batch" => Action::PanicInDriver,
            "panic-in-output" => Action::PanicInOutput,
            other => return Err(bad(format!("unknown failpoint {other:?}"))),
        };
        let from = match std::env::var(FAILPOINT_BATCH_VAR) {
            Ok(text) => text.parse().map_err(|e| bad(format!("{FAILPOINT_BATCH_VAR}={text:?}: {e}")))?,
            Err(_) => 0,
        };
        tracing::warn!(failpoint = %name, from, "test failpoint armed");
        Ok(Failpoints { armed: Some((action, BatchId(from))) })
    }

    /// Fires at `point` of `batch` if armed for it: holds, or panics in the driver.
    pub(crate) fn reach(&mut self, point: Point, batch: BatchId) {
        let fires = match &self.armed {
            Some((Action::Hold { at, .. }, from)) => *at == point && batch >= *from,
            Some((Action::PanicInDriver, from)) => point == Point::OffsetsLogged && batch >= *from,
            _ => false,
        };
        if !fires {
            return;
        }
        match self.armed.take() {
            Some((Action::Hold { dir, .. }, _)) => hold(&dir, batch),
            Some((Action::PanicInDriver, _)) => panic!("failpoint panic-in-batch fired in batch {batch}"),
            _ => {}
        }
    }

    /// True (once) when the first output of `batch` must panic.
    pub(crate) fn output_panics(&mut self, batch: BatchId) -> bool {
        let fires = matches!(&self.armed, Some((Action::PanicInOutput, from)) if batch >= *from);
        if fires {
            self.armed = None;
        }
        fires
    }
}

#[cfg(feature = "failpoints")]
/// Writes `held`, then waits for `release`. Polling is fine: this is a test
/// hook, and the test waits on `held` rather than on time.
fn hold(dir: &std::path::Path, batch: BatchId) {
    tracing::warn!(%batch, dir = %dir.display(), "failpoint: holding inside the batch");
    if let Err(e) = std::fs::write(dir.join("held"), batch.0.to_string()) {
        tracing::error!(error = %e, "failpoint: cannot write the held marker; not holding");
        return;
    }
    while !dir.join("release").exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    tracing::warn!(%batch, "failpoint: released");
}
