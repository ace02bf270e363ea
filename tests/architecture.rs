//! The crate's shape, checked: the host cannot leak into the core (only `src/filter/` names
//! `proxy_wasm`), and no module imports one that imports it back.
//!
//! The import graph is read from the sources: every `crate::a::b` path, every `super::x`, and
//! every `use x::...` of a child module, outside comments, string literals and `#[cfg(test)]`
//! code, resolved to the longest module path it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/config/build.rs` -> `config::build`; `src/config/mod.rs` -> `config`.
fn module_of(path: &Path) -> String {
    let relative = path.strip_prefix(src()).expect("under src");
    let mut parts: Vec<String> = relative
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts.join("::")
}

/// The code of a file without comments, string and char literals, or test-only code.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut code = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        code.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if c == '"' && !escaped {
                        break;
                    }
                    escaped = c == '\\' && !escaped;
                }
                code.push_str("\"\"");
            }
            _ => code.push(c),
        }
    }
    code
}

/// Path-like words (`a::b::c`) in the code.
fn paths(code: &str) -> Vec<Vec<&str>> {
    code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.contains("::"))
        .map(|word| word.split("::").filter(|s| !s.is_empty()).collect())
        .collect()
}

fn longest_module(modules: &BTreeSet<String>, parts: &[&str]) -> Option<String> {
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].join("::"))
        .find(|candidate| modules.contains(candidate))
}

fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.retain(|f| !f.starts_with(src().join("bin")));
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(file);
        let code = code_of(&std::fs::read_to_string(file).expect("readable source"));
        let parent: Vec<&str> = module.split("::").collect();
        let parent = &parent[..parent.len().saturating_sub(1)];
        for path in paths(&code) {
            let resolved: Vec<&str> = match path.first() {
                Some(&"crate") => path[1..].to_vec(),
                Some(&"super") => parent
                    .iter()
                    .copied()
                    .chain(path[1..].iter().copied())
                    .collect(),
                // `use child::item` from a module's own file.
                Some(_) | None => module
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .chain(path.iter().copied())
                    .collect(),
            };
            if let Some(target) = longest_module(&modules, &resolved) {
                if target != module && !module.is_empty() {
                    graph.entry(module.clone()).or_default().insert(target);
                }
            }
        }
    }
    graph
}

/// A cycle in the graph, if there is one, as the list of modules along it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = import_graph();
    assert!(graph.len() > 40, "the graph looks unread: {graph:?}");
    assert!(
        graph["tick_flow"].contains("shared_state"),
        "known edge missing: {:?}",
        graph["tick_flow"]
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&graph), None);
    graph.entry("c".into()).or_default().insert("a".into());
    assert_eq!(find_cycle(&graph).map(|c| c.len()), Some(4));
}

#[test]
fn only_the_host_edge_names_proxy_wasm() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let filter = src().join("filter");
    let leaks: Vec<String> = files
        .iter()
        .filter(|file| !file.starts_with(&filter))
        .filter(|file| {
            let text = std::fs::read_to_string(file).expect("readable source");
            code_of(&text).contains("proxy_wasm")
        })
        .map(|file| file.display().to_string())
        .collect();
    assert!(
        leaks.is_empty(),
        "proxy_wasm outside src/filter/: {leaks:?}"
    );
    let manifest = std::fs::read_to_string(src().join("../Cargo.toml")).expect("Cargo.toml");
    let wasm_only = manifest
        .split("[target.'cfg(all(target_arch = \"wasm32\", target_os = \"wasi\"))'.dependencies]")
        .nth(1)
        .is_some_and(|section| {
            section
                .split("\n[")
                .next()
                .unwrap_or("")
                .contains("proxy-wasm")
        });
    assert!(
        wasm_only,
        "proxy-wasm must be a dependency of the filter's target (wasm32-wasi) only"
    );
}
