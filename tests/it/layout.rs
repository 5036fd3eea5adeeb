//! The crate's layout holds: the library below `src/cli/` prints nothing and uses no `anyhow` (it returns typed
//! errors and tells a reporter), no two source files import each other, directly or through others, the
//! command stays thin (under 3,000 lines outside its tests), and no function runs past 80 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `src/`, by its path from `src/`, with its whole text before its `#[cfg(test)]` module.
fn code_before_tests() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path: PathBuf = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                let name = path.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
                out.insert(name, text.split("#[cfg(test)]").next().unwrap_or_default().to_string());
            }
        }
    }
    out
}

/// [`code_before_tests`] without comment lines.
fn sources() -> BTreeMap<String, String> {
    code_before_tests()
        .into_iter()
        .map(|(name, code)| {
            let kept: Vec<&str> = code.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
            (name, kept.join("\n"))
        })
        .collect()
}

/// The module path of a file: `lance/sink.rs` is `["lance", "sink"]`, `lance/mod.rs` and `lib.rs` their folder's.
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file.trim_end_matches(".rs").split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// The paths a file names through `crate::` and `super::`, as module paths from the crate's root; a group
/// (`crate::a::{b, c::d}`) gives one path per item.
fn named_paths(file: &str, code: &str) -> Vec<Vec<String>> {
    let me = module_of(file);
    let parent: Vec<String> = me[..me.len().saturating_sub(1)].to_vec();
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for (start, root) in [("crate::", Vec::new()), ("super::", parent)] {
        for (at, _) in code.match_indices(start) {
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            let rest = &code[at + start.len()..];
            let path: String =
                rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
            let mut base = root.clone();
            base.extend(path.split("::").filter(|s| !s.is_empty()).map(str::to_string));
            let after = &rest[path.len()..];
            if path.ends_with("::") && after.starts_with('{') {
                let group = &after[1..after.find('}').unwrap_or(after.len())];
                for item in group.split(',') {
                    let first = item.trim().split("::").next().unwrap_or_default().trim();
                    let mut p = base.clone();
                    if !first.is_empty() && first != "self" {
                        p.push(first.to_string());
                    }
                    out.push(p);
                }
            } else {
                out.push(base);
            }
        }
    }
    out
}

/// The items each module re-exports from a submodule of its own (`pub use sub::{A, B};`), by module path: a
/// path through the re-export (`crate::udf::EmbedSearchFunc`) names the submodule's file.
type Reexports = BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>;

fn reexports(files: &BTreeMap<String, String>) -> Reexports {
    let mut out = Reexports::new();
    for (file, code) in files {
        let module = module_of(file);
        for line in code.lines() {
            let Some(rest) = line.trim().strip_prefix("pub use ") else { continue };
            let Some((sub, items)) = rest.trim_end_matches(';').split_once("::") else { continue };
            if ["crate", "super", "self"].contains(&sub) {
                continue;
            }
            let mut target = module.clone();
            target.push(sub.to_string());
            for item in items.trim_matches(|c| c == '{' || c == '}').split(',') {
                let name = item.trim().rsplit("::").next().unwrap_or_default().trim();
                if !name.is_empty() {
                    out.entry(module.clone()).or_default().insert(name.to_string(), target.clone());
                }
            }
        }
    }
    out
}

/// Which file a module path lands in: the longest prefix of it that is a file's module, or the file of the
/// submodule the item after that prefix is re-exported from.
fn file_of<'a>(
    path: &[String],
    modules: &'a BTreeMap<Vec<String>, String>,
    reexported: &Reexports,
) -> Option<&'a String> {
    let n = (0..=path.len()).rev().find(|n| modules.contains_key(&path[..*n].to_vec()))?;
    let module = path[..n].to_vec();
    let through = path.get(n).and_then(|item| reexported.get(&module)?.get(item)).and_then(|t| modules.get(t));
    through.or_else(|| modules.get(&module))
}

/// That it prints nothing is clippy's `print_stdout` and `print_stderr` (Cargo.toml's lints).
#[test]
fn the_library_below_the_command_returns_typed_errors() {
    let found: Vec<String> = sources()
        .iter()
        .filter(|(file, _)| !file.starts_with("cli/") && file.as_str() != "main.rs")
        .flat_map(|(file, code)| {
            code.lines().filter(|l| l.contains("anyhow")).map(move |l| format!("src/{file}: {}", l.trim()))
        })
        .collect();
    assert!(found.is_empty(), "outside src/cli/:\n{}", found.join("\n"));
}

#[test]
fn no_two_source_files_import_each_other() {
    let files = sources();
    let modules: BTreeMap<Vec<String>, String> = files.keys().map(|f| (module_of(f), f.clone())).collect();
    let reexported = reexports(&files);
    let mut edges: BTreeMap<&String, BTreeSet<&String>> = BTreeMap::new();
    for (file, code) in &files {
        for path in named_paths(file, code) {
            if let Some(to) = file_of(&path, &modules, &reexported)
                && to != file
            {
                edges.entry(file).or_default().insert(to);
            }
        }
    }
    // A file's imports followed depth first: a file met again on the current path closes a circle.
    fn visit<'a>(
        file: &'a String,
        edges: &BTreeMap<&'a String, BTreeSet<&'a String>>,
        path: &mut Vec<&'a String>,
        done: &mut BTreeSet<&'a String>,
        circles: &mut Vec<String>,
    ) {
        if let Some(at) = path.iter().position(|f| *f == file) {
            let circle: Vec<&str> = path[at..].iter().chain([&file]).map(|f| f.as_str()).collect();
            circles.push(circle.join(" -> "));
            return;
        }
        if !done.insert(file) {
            return;
        }
        path.push(file);
        for next in edges.get(file).into_iter().flatten() {
            visit(next, edges, path, done, circles);
        }
        path.pop();
    }
    let (mut done, mut circles) = (BTreeSet::new(), Vec::new());
    for file in files.keys() {
        visit(file, &edges, &mut Vec::new(), &mut done, &mut circles);
    }
    assert!(circles.is_empty(), "import circles:\n{}", circles.join("\n"));
    // The walk sees the imports it should: the command imports the library's operations.
    assert!(edges[&"cli/run.rs".to_string()].contains(&"ops/run.rs".to_string()), "{edges:?}");
    // And through a re-export: the session registers `crate::udf::EmbedSearchFunc`, which is udf/search.rs's.
    assert!(edges[&"session/mod.rs".to_string()].contains(&"udf/search.rs".to_string()), "{edges:?}");
}

/// How long a function may be is clippy's `too_many_lines` (Cargo.toml's lints, clippy.toml); the command's size is
/// this: src/cli/ and the binary's src/main.rs together, as what runs the command moves between them (issue 55
/// moved its runtime into `cli::run`, and the limit from 3,000 for src/cli/ alone to 3,100 for both: as much room).
#[test]
fn the_command_stays_thin() {
    let files = code_before_tests();
    let command: usize = files
        .iter()
        .filter(|(f, _)| f.starts_with("cli/") || *f == "main.rs")
        .map(|(_, code)| code.lines().count())
        .sum();
    assert!(command < 3100, "src/cli/ and src/main.rs hold {command} lines outside their tests");
    assert!(command > 1000, "the count sees the command's files: {command} lines");
}
