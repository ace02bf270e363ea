//! The workspace's shape, checked: the core cannot name the host SDK, the edges only carry
//! out what the core decides, no module of any crate imports one that imports it back, and
//! each kind of state has one owner: the data layer writes the pool's scraped state, the
//! director and the coordinator reach in-flight counts and prefix placements only through the
//! learned-state interface, shared-data keys are built in one file, and flow control's queue
//! is reached only through `flow_control`.
//!
//! The import graph is read from the sources: every `crate::a::b` path, every `super::x`, and
//! every `use x::...` of a child module, outside comments, string literals and `#[cfg(test)]`
//! code, resolved to the longest module path it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn crates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates")
}

/// The core's sources.
fn src() -> PathBuf {
    crates().join("core/src")
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
    module_under(&src(), path)
}

/// `path`'s module within the crate whose sources are under `root`.
fn module_under(root: &Path, path: &Path) -> String {
    let relative = path.strip_prefix(root).expect("under the crate's sources");
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

/// The code of a file without comments, string and char literals, or test-only code. A
/// `#[cfg(test)] mod tests;` line declares a file of its own (read as a module of its own):
/// the code after it is still the file's.
fn code_of(text: &str) -> String {
    let text = text.replace("#[cfg(test)]\nmod tests;", "");
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
    import_graph_of(&src())
}

/// The import graph of the crate whose sources are under `root`.
fn import_graph_of(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_under(root, f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_under(root, file);
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
        graph["tick_driver"].contains("shared_state"),
        "known edge missing: {:?}",
        graph["tick_driver"]
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle: {}", cycle.join(" -> "));
    }
}

/// Every crate of the workspace, the edges and the tools included: none has a cycle either.
#[test]
fn no_module_of_any_crate_imports_one_that_imports_it_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sources = [
        crates().join("wasm-filter/src"),
        crates().join("dynamic-module/src"),
        root.join("bench/extproc/src"),
        root.join("bench/wasm-micro/src"),
        root.join("bench/profile-filter/src"),
        root.join("tools/wasm-exports/src"),
    ];
    for crate_src in sources {
        let graph = import_graph_of(&crate_src);
        if let Some(cycle) = find_cycle(&graph) {
            panic!(
                "import cycle in {}: {}",
                crate_src.display(),
                cycle.join(" -> ")
            );
        }
    }
    let module = import_graph_of(&crates().join("dynamic-module/src"));
    assert!(
        module.len() >= 4,
        "the module's graph looks unread: {module:?}"
    );
}

/// Where each call that writes one kind of state appears, by module: the calls named in
/// `calls` may appear only in `owners` (a module or its children).
fn only_owners_call(calls: &[&str], owners: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in production_files() {
        let module = module_of(&file);
        let owned = owners
            .iter()
            .any(|owner| module == *owner || module.starts_with(&format!("{owner}::")));
        if owned {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&file).expect("readable source"));
        for call in calls {
            if code.contains(&format!(".{call}(")) {
                found.push(format!("{module} calls {call}"));
            }
        }
    }
    found
}

/// The core's sources that are not unit-test modules (`tests.rs` and the files under a
/// `tests/` folder): tests drive every room directly.
fn production_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files
        .into_iter()
        .filter(|file| !module_of(file).split("::").any(|part| part == "tests"))
        .collect()
}

#[test]
fn only_the_data_layer_writes_scraped_state() {
    let writes = [
        "record_scrape_ok",
        "record_scrape_failure",
        "record_scrape_timeout",
        "apply_shared",
        "mark_scrape_sent",
        "refresh_health",
        "set_members",
        "back_off",
    ];
    let outside = only_owners_call(&writes, &["endpoint", "datalayer"]);
    // The tick asks the data layer to refresh health (its own method of the same name).
    let outside: Vec<String> = outside
        .into_iter()
        .filter(|line| line != "tick_driver calls refresh_health")
        .collect();
    assert!(
        outside.is_empty(),
        "scraped state written outside the data layer: {outside:?}"
    );
    assert!(
        !only_owners_call(&writes, &["endpoint"]).is_empty(),
        "the check looks unread: the data layer itself writes"
    );
}

#[test]
fn only_flow_control_reaches_its_ledger_and_queue() {
    let ledger = [
        "expire",
        "pick_local",
        "set_has_endpoints",
        "clear_for",
        "unreserve",
    ];
    let outside = only_owners_call(&ledger, &["flow_control"]);
    assert!(
        outside.is_empty(),
        "flow control's queue reached from outside: {outside:?}"
    );
    // The VM carries out on the held streams what flow control's releases decide.
    let queue = ["take_deferred", "releases", "record_dispatched"];
    let outside = only_owners_call(&queue, &["flow_control", "vm::releases"]);
    assert!(
        outside.is_empty(),
        "held requests released outside flow control: {outside:?}"
    );
}

#[test]
fn learned_state_is_shared_only_through_its_interface() {
    // What a VM learned (in-flight counts, prefix placements) is written by the rooms that own
    // it; the coordinator and the tick driver go through `learned::Learned`.
    let direct = [
        "set_remote_in_flight",
        "learn_remote",
        "take_learned",
        "add_in_flight",
        "end_in_flight",
    ];
    let owners = ["router", "datalayer", "director", "scheduling", "endpoint"];
    let outside = only_owners_call(&direct, &owners);
    assert!(
        outside.is_empty(),
        "learned state reached around its interface: {outside:?}"
    );
}

#[test]
fn shared_data_keys_are_built_in_one_place() {
    let mut builders = Vec::new();
    for file in production_files() {
        let text = std::fs::read_to_string(&file).expect("readable source");
        let text = text.split("#[cfg(test)]").next().unwrap_or_default();
        let suffixes = [
            "}/lease\"",
            "}/snapshot\"",
            "}/members\"",
            "}/models\"",
            "}/vms\"",
            "}/load/",
            "}/prefix/",
            "}/flow/",
            "}/flow-ledger",
            "\"inference-picker/",
        ];
        if suffixes.iter().any(|suffix| text.contains(suffix)) {
            builders.push(module_of(&file));
        }
    }
    assert_eq!(
        builders,
        ["shared_keys"],
        "shared-data keys built outside shared_keys.rs"
    );
}

#[test]
fn a_request_is_decided_and_a_pool_ticked_through_one_entry() {
    // Scheduling a request: only the decision (`PoolSlot::decide`) and flow control's
    // releases call the director's scheduling; the edges reach neither.
    let outside = only_owners_call(
        &["route_prepared", "route_parsed"],
        &["router", "flow_control", "director"],
    );
    assert!(
        outside.is_empty(),
        "a second way to schedule a request: {outside:?}"
    );
    // A pool's tick: only the worker VM drives it.
    let outside = only_owners_call(&["on_tick", "on_callout_response"], &["vm", "tick_driver"]);
    assert!(
        outside.is_empty(),
        "a second way to tick a pool: {outside:?}"
    );
}

/// The rooms: the core's top-level modules, each with its children (`datalayer::scrapes` is
/// the data layer). A room that imports one that imports it back, through any file, is one
/// tangle a reader cannot take apart.
#[test]
fn no_room_of_the_core_imports_one_that_imports_it_back() {
    let mut rooms: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let room = |module: &str| module.split("::").next().unwrap_or_default().to_owned();
    // Unit-test modules drive every room directly.
    let test = |module: &str| module.split("::").any(|part| part == "tests");
    for (from, targets) in import_graph() {
        for target in targets {
            if room(&from) != room(&target) && !test(&from) {
                rooms.entry(room(&from)).or_default().insert(room(&target));
            }
        }
    }
    assert!(rooms.len() > 15, "the rooms look unread: {rooms:?}");
    if let Some(cycle) = find_cycle(&rooms) {
        panic!("rooms in a cycle: {}", cycle.join(" -> "));
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

/// The `[dependencies]`-like sections of a manifest: every dependency name it lists.
fn dependencies(manifest: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut in_dependencies = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_dependencies = line.trim_end_matches(']').ends_with("dependencies");
            continue;
        }
        if in_dependencies && !line.starts_with('#') {
            if let Some((name, _)) = line.split_once('=') {
                let name = name.trim().trim_end_matches(".workspace").to_owned();
                if !name.is_empty() {
                    names.insert(name);
                }
            }
        }
    }
    names
}

fn manifest(crate_dir: &str) -> String {
    std::fs::read_to_string(crates().join(crate_dir).join("Cargo.toml")).expect("manifest")
}

#[test]
fn the_core_cannot_name_proxy_wasm() {
    let core = dependencies(&manifest("core"));
    assert!(
        core.contains("serde"),
        "the manifest looks unread: {core:?}"
    );
    assert!(
        !core.iter().any(|name| name.contains("proxy-wasm")),
        "the core depends on the host SDK: {core:?}"
    );
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let leaks: Vec<String> = files
        .iter()
        .filter(|file| {
            let text = std::fs::read_to_string(file).expect("readable source");
            code_of(&text).contains("proxy_wasm")
        })
        .map(|file| file.display().to_string())
        .collect();
    assert!(leaks.is_empty(), "proxy_wasm in the core: {leaks:?}");
}

/// What an edge (the wasm filter, the dynamic module) may use of the core: the host contract it
/// implements, the worker VM it forwards to, the request state each stream keeps, and the protocol's names and error
/// shapes it writes. Scheduling, flow control or configuration named here would be a
/// decision made in the edge.
const FILTER_USES: [&str; 5] = ["host", "vm", "request_driver", "error_response", "protocol"];

#[test]
fn the_filter_only_carries_out_what_the_core_decides() {
    check_edge(
        "wasm-filter",
        700,
        &["inference-picker-core", "log", "proxy-wasm"],
    );
}

/// The dynamic module is held to the same: its budget is larger by the ABI bindings it writes
/// itself (the wasm filter's come with the proxy-wasm crate), and it has no SDK dependency.
#[test]
fn the_dynamic_module_only_carries_out_what_the_core_decides() {
    check_edge("dynamic-module", 2000, &["inference-picker-core", "log"]);
}

/// An edge crate uses only [`FILTER_USES`] of the core, stays under `max_lines`, and depends
/// on exactly `dependencies`.
fn check_edge(name: &str, max_lines: usize, dependencies_expected: &[&str]) {
    let mut files = Vec::new();
    rust_files(&crates().join(name).join("src"), &mut files);
    let mut lines = 0;
    let mut used = BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable source");
        lines += text.lines().count();
        for path in paths(&code_of(&text)) {
            if let ["inference_picker_core", module, ..] = path[..] {
                used.insert(module.to_owned());
            }
        }
    }
    assert!(
        files.len() >= 2 && used.contains("vm"),
        "{name} looks unread: {used:?}"
    );
    assert!(
        lines < max_lines,
        "{name} is {lines} lines: move logic into the core"
    );
    let beyond: Vec<&String> = used
        .iter()
        .filter(|m| !FILTER_USES.contains(&m.as_str()))
        .collect();
    assert!(
        beyond.is_empty(),
        "{name} uses the core's {beyond:?}: decisions belong in the core"
    );
    let deps = dependencies(&manifest(name));
    let expected: BTreeSet<String> = dependencies_expected
        .iter()
        .map(|d| d.to_string())
        .collect();
    assert_eq!(deps, expected, "{name}'s dependencies");
}
