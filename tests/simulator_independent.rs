//! The simulated model server shares nothing with the picker: no file of it (nor any file it
//! includes with `#[path]`) names the picker's crates or includes a file from `crates/`.
//! Otherwise the prefix hit rates it measures could repeat the picker's own estimates instead
//! of checking them.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use support::repo;

/// The `#[path = "..."]` targets in `text`, resolved against `dir`.
fn path_includes(text: &str, dir: &Path) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("#[path")?;
            let quoted = rest.split('"').nth(1)?;
            Some(dir.join(quoted))
        })
        .collect()
}

fn simulator_files() -> BTreeSet<PathBuf> {
    let root = repo().join("examples/model-server-sim");
    let mut pending: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("examples/model-server-sim/")
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .collect();
    let mut seen = BTreeSet::new();
    while let Some(path) = pending.pop() {
        let path = path.canonicalize().unwrap_or_else(|_| panic!("{path:?}"));
        if !seen.insert(path.clone()) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        pending.extend(path_includes(&text, path.parent().unwrap()));
    }
    seen
}

#[test]
fn the_simulator_imports_nothing_from_the_picker() {
    let files = simulator_files();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.strip_prefix(repo()).unwrap_or(p).display().to_string())
        .collect();
    for must in [
        "examples/model-server-sim/main.rs",
        "examples/model-server-sim/tokenizer.rs",
        "examples/model-server-sim/kv_cache.rs",
        "tests/support/http1.rs",
    ] {
        assert!(
            names.iter().any(|n| n == must),
            "{must} not found in {names:?}"
        );
    }
    let crates = repo().join("crates").canonicalize().unwrap();
    for (path, name) in files.iter().zip(&names) {
        assert!(
            !path.starts_with(&crates),
            "the simulator includes {name} from crates/"
        );
        let text = std::fs::read_to_string(path).unwrap();
        for (n, line) in text.lines().enumerate() {
            assert!(
                !line.contains("inference_picker"),
                "{name}:{}: the simulator names the picker's crate: {line}",
                n + 1
            );
        }
    }
}
