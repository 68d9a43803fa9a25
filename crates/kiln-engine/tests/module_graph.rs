//! No module of kiln-engine imports from a module that imports it, directly or through
//! others: the engine runs the scheduler, the scheduler runs sequences, sequences use the leaf
//! request types, never the other way round. Read from the sources: every `crate::name` path
//! (grouped `use crate::{…}` included), with the names `lib.rs` re-exports resolved to their
//! modules; comments are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src` belongs to (`None`: lib.rs itself).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let name = first.trim_end_matches(".rs").to_string();
    (name != "lib").then_some(name)
}

fn ident_at(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The first segment of every path after `crate::`, grouped imports included.
fn crate_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                names.push(ident_at(item.trim()).to_string());
            }
        } else {
            names.push(ident_at(rest).to_string());
        }
    }
    names
}

/// Names `lib.rs` re-exports (`pub use module::{A, B}`), each with its module.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for line in lib.lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let module = ident_at(rest).to_string();
        let items = rest[module.len()..].trim_start_matches("::");
        let items = items.trim_matches(|c| c == '{' || c == '}' || c == ';');
        for item in items.split(',') {
            let name = ident_at(item.trim().trim_start_matches('{'));
            map.insert(name.to_string(), module.clone());
        }
    }
    map
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let names = reexports(&lib);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(&src, f)).collect();
    let mut graph = Graph::new();
    for file in &files {
        let Some(from) = module_of(&src, file) else {
            continue;
        };
        let source = std::fs::read_to_string(file).expect("source");
        // Doc links name items without importing them.
        let code: Vec<&str> = source
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect();
        for name in crate_names(&code.join("\n")) {
            let to = if modules.contains(&name) {
                Some(name)
            } else {
                names.get(&name).cloned()
            };
            if let Some(to) = to.filter(|t| *t != from) {
                graph.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    graph
}

/// A path of imports from `start` back to itself, if there is one.
fn cycle_from(graph: &Graph, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![(start.to_string(), vec![start.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((at, path)) = stack.pop() {
        for next in graph.get(&at).into_iter().flatten() {
            if next == start {
                let mut cycle = path.clone();
                cycle.push(next.clone());
                return Some(cycle);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

#[test]
fn no_module_imports_from_a_module_that_imports_it() {
    let graph = graph();
    // The reader works: the engine is known to use the scheduler and the scheduler sequences.
    assert!(graph["engine"].contains("sched"), "{graph:?}");
    assert!(graph["sched"].contains("sequence"), "{graph:?}");
    for module in graph.keys() {
        if let Some(cycle) = cycle_from(&graph, module) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_reader_finds_a_cycle_when_there_is_one() {
    let mut graph = graph();
    graph
        .entry("request".to_string())
        .or_default()
        .insert("engine".to_string());
    assert!(cycle_from(&graph, "request").is_some());
}
