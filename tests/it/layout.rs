//! The workspace's layout holds: the library (crates/embedding-pipeline) depends on no command-line crate and
//! keeps the cluster behind its feature, no two source files of a crate import each other, directly or through
//! others, the command's files stay short, and the README's layout table names the tree as it is. That nothing but the
//! command prints, and that no function runs past 80 lines, are clippy's lints (Cargo.toml, clippy.toml).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The repository: the command's crate is its root.
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The library's crate.
const LIBRARY: &str = "crates/embedding-pipeline";

/// Every `.rs` file under a crate's `src/`, by its path from `src/`, with its whole text before its `#[cfg(test)]`
/// module.
fn code_before_tests(krate: &str) -> BTreeMap<String, String> {
    let root = repo().join(krate).join("src");
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
fn sources(krate: &str) -> BTreeMap<String, String> {
    code_before_tests(krate)
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

/// The dependencies a manifest names, by section (`dependencies`, `dev-dependencies`…): each line's key.
fn dependencies(manifest: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut section = String::new();
    for line in manifest.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
        } else if let Some((key, _)) = line.split_once('=')
            && !line.starts_with('#')
        {
            out.entry(section.clone()).or_default().push(key.trim().to_string());
        }
    }
    out
}

/// The library is what the Python package and any Rust program link: the command's crates stay in the command
/// (`cargo tree -p embedding-pipeline` shows none of them), and the cluster's only with the `cluster` feature.
#[test]
fn the_library_leaves_the_command_line_to_the_command() {
    let manifest = std::fs::read_to_string(repo().join(LIBRARY).join("Cargo.toml")).unwrap();
    let sections = dependencies(&manifest);
    let library = &sections["dependencies"];
    for command_only in ["clap", "clap_complete", "anyhow", "indicatif", "rustyline", "mimalloc"] {
        assert!(!library.iter().any(|d| d == command_only), "the library depends on {command_only}");
    }
    let optional: Vec<&str> = manifest
        .lines()
        .filter(|l| l.contains("optional = true"))
        .filter_map(|l| l.split('=').next())
        .map(str::trim)
        .collect();
    for cluster in ["ballista", "ballista-core", "ballista-scheduler", "ballista-executor", "tonic", "rustls", "rcgen"]
    {
        assert!(optional.contains(&cluster), "{cluster} is not behind the cluster feature: {optional:?}");
    }
    let python = std::fs::read_to_string(repo().join("python/Cargo.toml")).unwrap();
    let python = &dependencies(&python)["dependencies"];
    assert!(python.iter().any(|d| d == "embedding-pipeline"), "{python:?}");
    assert!(!python.iter().any(|d| d == "pipeline"), "the Python package links the command: {python:?}");
    // What the library's build of its own would catch, seen here too: no `anyhow` in its code.
    let found: Vec<String> = sources(LIBRARY)
        .iter()
        .flat_map(|(file, code)| {
            code.lines().filter(|l| l.contains("anyhow")).map(move |l| format!("{file}: {}", l.trim()))
        })
        .collect();
    assert!(found.is_empty(), "the library:\n{}", found.join("\n"));
}

/// A crate's files and whom each imports (through `crate::` and `super::`, re-exports followed).
fn imports(krate: &str) -> BTreeMap<String, BTreeSet<String>> {
    let files = sources(krate);
    let modules: BTreeMap<Vec<String>, String> = files.keys().map(|f| (module_of(f), f.clone())).collect();
    let reexported = reexports(&files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = files.keys().map(|f| (f.clone(), BTreeSet::new())).collect();
    for (file, code) in &files {
        for path in named_paths(file, code) {
            if let Some(to) = file_of(&path, &modules, &reexported)
                && to != file
            {
                edges.get_mut(file).unwrap().insert(to.clone());
            }
        }
    }
    edges
}

/// The files that import each other, directly or through others: each circle as `a -> b -> a`.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    // A file's imports followed depth first: a file met again on the current path closes a circle.
    fn visit<'a>(
        file: &'a String,
        edges: &'a BTreeMap<String, BTreeSet<String>>,
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
    for file in edges.keys() {
        visit(file, edges, &mut Vec::new(), &mut done, &mut circles);
    }
    circles
}

#[test]
fn no_two_source_files_import_each_other() {
    let library = imports(LIBRARY);
    assert!(circles(&library).is_empty(), "import circles in the library:\n{}", circles(&library).join("\n"));
    // The walk sees the imports it should: the operations use the session.
    assert!(library["ops/run.rs"].contains("session/mod.rs"), "{library:?}");
    // And through a re-export: the session registers `crate::udf::EmbedSearchFunc`, which is udf/search.rs's.
    assert!(library["session/mod.rs"].contains("udf/search.rs"), "{library:?}");
    // Nor do the library's modules, taken whole (`lance/` and `session/`, `ops/` and `udf/`).
    let mut modules: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let top = |file: &str| module_of(file).first().cloned().unwrap_or_else(|| "lib".to_string());
    for (file, to) in &library {
        let from = modules.entry(top(file)).or_default();
        from.extend(to.iter().map(|t| top(t)).filter(|t| *t != top(file)));
    }
    assert!(
        circles(&modules).is_empty(),
        "import circles between the library's modules:\n{}",
        circles(&modules).join("\n")
    );
    assert!(modules["ops"].contains("session") && modules["session"].contains("udf"), "{modules:?}");
    let command = imports(".");
    assert!(circles(&command).is_empty(), "import circles in the command:\n{}", circles(&command).join("\n"));
    assert!(command["cli/shell.rs"].contains("cli/run.rs"), "{command:?}");
    assert!(command["cli/run.rs"].contains("cli/printer.rs"), "{command:?}");
}

/// How long a function may be is clippy's `too_many_lines` (Cargo.toml's lints, clippy.toml); the command's files
/// stay short: each command's arguments and its printing in a file of its own, none over 400 lines outside its
/// tests, and no dispatch that has to say `unreachable!`.
#[test]
fn the_command_stays_thin() {
    let files = code_before_tests(".");
    assert!(files.len() > 20, "the count sees the command's files: {:?}", files.keys());
    let long: Vec<String> = files
        .iter()
        .map(|(f, code)| (f, code.lines().count()))
        .filter(|(_, lines)| *lines > 400)
        .map(|(f, lines)| format!("src/{f}: {lines} lines"))
        .collect();
    assert!(long.is_empty(), "command files over 400 lines outside their tests:\n{}", long.join("\n"));
    let unreachable: Vec<&String> =
        files.iter().filter(|(_, code)| code.contains("unreachable!")).map(|(f, _)| f).collect();
    assert!(unreachable.is_empty(), "unreachable! in {unreachable:?}");
}

/// The first column of the layout table (`docs/reference/layout.md`): the paths it describes.
fn layout_table() -> Vec<String> {
    let page = std::fs::read_to_string(repo().join(LAYOUT_PAGE)).unwrap();
    let table = page.split("\n## Layout\n").nth(1).expect("the layout page has a Layout section");
    let table = table.split("\n## ").next().unwrap_or_default();
    table
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(path, _)| path.to_string())
        .collect()
}

/// The README's layout table names what is there, and everything that is: each of the library's modules and each
/// folder of the repository has its row.
#[test]
fn the_layout_table_names_the_tree() {
    let rows = layout_table();
    assert!(rows.len() > 10, "the table's rows were read: {rows:?}");
    let missing: Vec<&String> = rows.iter().filter(|p| !repo().join(p).exists()).collect();
    assert!(missing.is_empty(), "{LAYOUT_PAGE}'s table names paths that are not there: {missing:?}");
    let listed = |path: &str| rows.iter().any(|r| r.trim_end_matches('/') == path.trim_end_matches('/'));
    let mut unlisted = Vec::new();
    for entry in std::fs::read_dir(repo().join(LIBRARY).join("src")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let path = format!("{LIBRARY}/src/{name}");
        if name != "lib.rs" && !listed(&path) {
            unlisted.push(path);
        }
    }
    // What the repository does not hold: the folders .gitignore names at its top (a build's output, the models
    // scripts/setup installs).
    let gitignore = std::fs::read_to_string(repo().join(".gitignore")).unwrap();
    let ignored: Vec<&str> = gitignore.lines().filter_map(|l| l.strip_prefix('/')?.strip_suffix('/')).collect();
    for entry in std::fs::read_dir(repo()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        // Folders only, hidden ones aside; tests/ by its parts.
        let skip = name.starts_with('.') || ignored.contains(&name.as_str()) || !entry.path().is_dir();
        if !skip && !rows.iter().any(|r| r.starts_with(&format!("{name}/"))) {
            unlisted.push(format!("{name}/"));
        }
    }
    assert!(unlisted.is_empty(), "{LAYOUT_PAGE}'s table has no row for: {unlisted:?}");
}

/// Where the layout table is.
const LAYOUT_PAGE: &str = "docs/reference/layout.md";

/// The manual's Markdown files: the README, the benchmarks, the changelog, and every page under docs/.
fn manual_pages() -> Vec<std::path::PathBuf> {
    let mut pages = vec![repo().join("README.md"), repo().join("BENCHMARKS.md"), repo().join("CHANGELOG.md")];
    let mut folders = vec![repo().join("docs")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages
}

/// A heading's anchor as GitHub makes it: lower case, punctuation but `-` and `_` dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every relative link of the manual reaches a file of the repository, and every `#anchor` a heading of the page it
/// names: pages moved or renamed leave no dead link behind.
#[test]
fn the_manuals_links_resolve() {
    // The target of each `](target)`.
    let links = |text: &str| -> Vec<String> {
        text.split("](")
            .skip(1)
            .filter_map(|rest| rest.split_once(')').map(|(t, _)| t.to_string()))
            .filter(|t| !t.is_empty() && !t.contains(char::is_whitespace))
            .collect()
    };
    let mut dead = Vec::new();
    let pages = manual_pages();
    assert!(pages.len() > 10, "the manual's pages were found: {pages:?}");
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for target in links(&text) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = target.split_once('#').map_or((target.as_str(), None), |(f, a)| (f, Some(a)));
            let file = if file.is_empty() { page.clone() } else { page.parent().unwrap().join(file) };
            let name = page.strip_prefix(repo()).unwrap().display().to_string();
            if !file.exists() {
                dead.push(format!("{name}: {target} (no such file)"));
                continue;
            }
            if let Some(fragment) = fragment.filter(|_| file.extension().is_some_and(|e| e == "md")) {
                let headings = std::fs::read_to_string(&file).unwrap();
                let found = headings
                    .lines()
                    .filter_map(|l| l.trim_start_matches('#').strip_prefix(' ').filter(|_| l.starts_with('#')))
                    .any(|h| anchor(h) == fragment);
                if !found {
                    dead.push(format!("{name}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(dead.is_empty(), "dead links in the manual:\n{}", dead.join("\n"));
}
