//! A program that installed a `metrics` recorder of its own keeps it: asking
//! spate to serve `/metrics` or the page then fails at once, saying why,
//! instead of serving figures that go elsewhere. (A process of its own: the
//! global recorder can be set once.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use spate_core::Duration;
use spate_dstream::QueueSource;
use spate_runtime::{RuntimeError, StreamingContext, StreamingSettings};

#[test]
fn serving_metrics_is_refused_when_the_program_has_its_own_recorder() {
    metrics::set_global_recorder(metrics::NoopRecorder).unwrap();
    let any_port: SocketAddr = "127.0.0.1:0".parse().unwrap();
    for settings in [
        StreamingSettings::new(Duration::from_secs(1)).with_metrics_addr(any_port),
        StreamingSettings::new(Duration::from_secs(1)).with_ui_addr(any_port),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let error = StreamingContext::get_or_create(dir.path(), settings, |p| {
            p.input("lines", std::sync::Arc::new(QueueSource::<String>::new()))
                .foreach_batch(|_, _| Ok(()))
                .name("out");
            Ok(())
        })
        .unwrap_err();
        assert!(matches!(error, RuntimeError::InvalidSetting { .. }), "{error}");
        assert!(error.to_string().contains("already has a `metrics` recorder"), "{error}");
        // Refused before the checkpoint was created.
        assert!(!dir.path().join("metadata").exists());
    }
    // Without those settings the program's recorder gets the figures and nothing is refused.
    let dir = tempfile::tempdir().unwrap();
    let ctx = StreamingContext::get_or_create(dir.path(), StreamingSettings::new(Duration::from_secs(1)), |p| {
        p.input("lines", std::sync::Arc::new(QueueSource::<String>::new())).foreach_batch(|_, _| Ok(())).name("out");
        Ok(())
    });
    assert!(ctx.is_ok());
}
