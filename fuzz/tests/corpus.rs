//! Replays every kept fuzzing input: the seeds, the corpus a fuzzing run
//! grew (`fuzz/corpus/<target>/`) and every input that once made a target
//! fail (`fuzz/regressions/<target>/`). None may panic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use spate_fuzz::TARGETS;

fn inputs(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect();
    files.sort();
    files.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
}

#[test]
fn every_seed_decodes_without_a_panic() {
    for target in TARGETS {
        let seeds = (target.seeds)();
        assert!(!seeds.is_empty(), "target {} has no seeds", target.name);
        for seed in seeds {
            (target.run)(&seed);
        }
    }
}

#[test]
fn every_kept_input_decodes_without_a_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut replayed = 0;
    for target in TARGETS {
        let corpus = root.join("corpus").join(target.name);
        assert!(
            !inputs(&corpus).is_empty(),
            "{} is empty: `cargo xtask fuzz {}` seeds and grows it",
            corpus.display(),
            target.name
        );
        for folder in ["corpus", "regressions"] {
            for (path, bytes) in inputs(&root.join(folder).join(target.name)) {
                let outcome = std::panic::catch_unwind(|| (target.run)(&bytes));
                assert!(outcome.is_ok(), "{} panics on {}", target.name, path.display());
                replayed += 1;
            }
        }
    }
    println!("replayed {replayed} kept fuzzing inputs");
}
