//! Every invalid graph fails to build with an error naming the operator.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::{INTERVAL, collect};
use spate_core::Duration;
use spate_dstream::{DStream, DStreamError, GraphBuilder, GraphProblem, QueueSource, State};

fn setup(checkpointing: bool) -> (GraphBuilder, DStream<(u32, u64)>) {
    let b = GraphBuilder::new(INTERVAL).checkpointing(checkpointing);
    let s = b.input("events", Arc::new(QueueSource::<(u32, u64)>::new()));
    (b, s)
}

fn problems(b: GraphBuilder) -> Vec<GraphProblem> {
    match b.build() {
        Err(DStreamError::InvalidGraph { problems }) => problems,
        other => panic!("expected an invalid graph, got {other:?}"),
    }
}

#[test]
fn window_and_slide_must_be_multiples_of_the_batch_interval() {
    let (b, s) = setup(true);
    collect(&s.window(Duration::from_millis(2500), Duration::from_secs(1)).name("odd-window"));
    collect(
        &s.reduce_by_key_and_window(|a, b| a + b, Duration::from_secs(4), Duration::from_millis(1500))
            .name("odd-slide"),
    );
    let found = problems(b);
    assert!(found.contains(&GraphProblem::WindowNotMultiple {
        operator: "odd-window".into(),
        which: "window",
        duration: Duration::from_millis(2500),
        batch_interval: INTERVAL,
    }));
    assert!(found.iter().any(
        |p| matches!(p, GraphProblem::WindowNotMultiple { operator, which: "slide", .. } if operator == "odd-slide")
    ));
    let message = DStreamError::InvalidGraph { problems: found }.to_string();
    assert!(message.contains("odd-window") && message.contains("not a multiple of the batch interval"), "{message}");
}

#[test]
fn stateful_operators_need_a_checkpoint_directory() {
    let (b, s) = setup(false);
    collect(
        &s.reduce_by_key_and_window_inv(|a, b| a + b, |a, b| a - b, Duration::from_secs(4), Duration::from_secs(2))
            .name("inv"),
    );
    collect(
        &s.update_state_by_key(|v: Vec<u64>, st: Option<u64>| Some(st.unwrap_or(0) + v.len() as u64)).name("totals"),
    );
    collect(&s.map_with_state(|_k: &u32, _v: Option<u64>, _s: &mut State<u8>| 0u8, None).name("sessions").mapped());
    // Windows without an inverse keep their state in memory and need no checkpoint.
    collect(&s.reduce_by_key_and_window(|a, b| a + b, Duration::from_secs(4), Duration::from_secs(2)).name("panes"));
    let found = problems(b);
    let needing: Vec<&str> = found
        .iter()
        .filter_map(|p| match p {
            GraphProblem::NeedsCheckpoint { operator, .. } => Some(operator.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(needing, vec!["inv", "totals", "sessions"]);
    assert_eq!(found.len(), 3, "{found:?}");
}

#[test]
fn the_same_graph_with_a_checkpoint_directory_builds() {
    let (b, s) = setup(true);
    collect(&s.reduce_by_key_and_window_inv(
        |a, b| a + b,
        |a, b| a - b,
        Duration::from_secs(4),
        Duration::from_secs(2),
    ));
    assert!(b.build().is_ok());
}

#[test]
fn a_stream_nobody_consumes_is_an_error() {
    let (b, s) = setup(true);
    collect(&s);
    let _unused = s.map(|(k, v)| (k, v + 1)).name("dangling");
    assert_eq!(problems(b), vec![GraphProblem::NoOutput { operator: "dangling".into() }]);

    let b = GraphBuilder::new(INTERVAL);
    let used = b.input("used", Arc::new(QueueSource::<u8>::new()));
    let _unused = b.input("forgotten", Arc::new(QueueSource::<u8>::new()));
    collect(&used);
    let found = problems(b);
    assert_eq!(found, vec![GraphProblem::NoOutput { operator: "forgotten".into() }]);
    assert!(found[0].to_string().contains("No output operations registered"));
}

#[test]
fn a_graph_without_outputs_is_an_error() {
    let (b, _s) = setup(true);
    let found = problems(b);
    assert!(found.contains(&GraphProblem::NoOutputs), "{found:?}");
    assert!(found.contains(&GraphProblem::NoOutput { operator: "events".into() }), "{found:?}");
}

#[test]
fn combining_streams_with_different_slides_is_an_error() {
    let (b, s) = setup(true);
    let windowed = s.window(Duration::from_secs(4), Duration::from_secs(2));
    collect(&windowed.union(&s).name("mixed"));
    let found = problems(b);
    assert!(matches!(&found[..], [GraphProblem::SlideMismatch { operator, .. }] if operator == "mixed"), "{found:?}");
}

#[test]
fn names_must_be_unique_and_usable_as_directories() {
    let (b, s) = setup(true);
    collect(&s.map(|x| x).name("same"));
    collect(&s.map(|x| x).name("same"));
    collect(&s.map(|x| x).name("a/b"));
    let found = problems(b);
    assert!(found.contains(&GraphProblem::DuplicateName { name: "same".into() }));
    assert!(found.contains(&GraphProblem::BadName { name: "a/b".into() }));
}
