//! The shape of the source tree, checked: which top-level modules of `src/` import which
//! (no circle, and no role importing a role it must not), and no file under `src/`,
//! `benches/` or `tests/` past 1,100 lines. `cargo test --test structure -- --nocapture` prints the
//! import edges; doc/architecture.md explains the rules.
//!
//! An import is any path naming another top-level module: `crate::x`, a `crate::{x, y}`
//! group, or `super::` climbing out of the module. Comments do not count; test modules
//! do (a circle through a test still ties two roles together).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// What each top-level module of `src/` may import. Roles (threads) import the shared
/// vocabulary (`pipeline`, `config`, `pool`) and the roles downstream of them; the
/// supervisor (`daemon`) may import everything. A module missing here fails the test, so
/// a new one must be placed.
const ALLOWED: &[(&str, &[&str])] = &[
    // Leaves: import nothing of dory.
    ("fasthash", &[]),
    ("latency", &[]),
    ("prefetch", &[]),
    ("kafka", &[]),
    ("pool", &["prefetch"]),
    // Settings: may be read by everyone, so import no role.
    ("config", &["kafka"]),
    // The vocabulary crossing threads: ids, messages, batches, channel payloads.
    ("pipeline", &["kafka", "pool"]),
    // The durable spool reports through a trait (`spool::SpoolReport`), not by importing
    // `report`.
    ("spool", &["config", "latency", "pipeline"]),
    // Counting and status pages: everyone reports to it; it imports no thread role.
    (
        "report",
        &["config", "latency", "pipeline", "pool", "prefetch", "spool"],
    ),
    ("notify", &["report"]),
    // The threads, upstream to downstream.
    (
        "deliver",
        &["config", "fasthash", "kafka", "pipeline", "report"],
    ),
    (
        "route",
        &[
            "config", "deliver", "fasthash", "kafka", "pipeline", "pool", "prefetch", "report",
        ],
    ),
    (
        "input",
        &[
            "config", "fasthash", "pipeline", "pool", "report", "route", "spool",
        ],
    ),
    // The supervisor and the command line.
    (
        "daemon",
        &[
            "config", "deliver", "input", "kafka", "notify", "pipeline", "pool", "report", "route",
            "spool",
        ],
    ),
    ("cli", &["config"]),
    ("send", &["cli", "input"]),
];

const MAX_LINES: usize = 1_100;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The text with comments blanked (line and block comments; string literals are kept,
/// since no import hides in one).
fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut in_str = false;
    while i < b.len() {
        let c = b[i];
        if in_str {
            if c == b'\\' && i + 1 < b.len() {
                out.push_str("  ");
                i += 2;
                continue;
            }
            if c == b'"' {
                in_str = false;
            }
            out.push(if c == b'\n' { '\n' } else { ' ' });
            i += 1;
        } else if c == b'"' {
            in_str = true;
            out.push(' ');
            i += 1;
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == b'\'' && b.get(i + 2) == Some(&b'\'') {
            // A char literal such as '"' must not open a string.
            out.push_str("   ");
            i += 3;
        } else {
            // Escaped char literals ('\'' and '\"').
            if c == b'\'' && b.get(i + 1) == Some(&b'\\') && b.get(i + 3) == Some(&b'\'') {
                out.push_str("    ");
                i += 4;
                continue;
            }
            out.push(c as char);
            i += 1;
        }
    }
    out
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first path segment of each item of a `{...}` group starting at `s[0] == '{'`.
fn group_heads(s: &str) -> Vec<&str> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut item_start = 1;
    for (i, c) in s.char_indices() {
        match c {
            '{' => {
                if depth == 0 {
                    item_start = i + 1;
                }
                depth += 1;
            }
            '}' | ',' if depth == 1 => {
                let h = ident_at(s[item_start..].trim_start());
                if !h.is_empty() {
                    heads.push(h);
                }
                item_start = i + 1;
                if c == '}' {
                    break;
                }
            }
            '}' => depth -= 1,
            _ => {}
        }
    }
    heads
}

/// Names following `prefix` in `code`: `prefix x` and `prefix {x, y::z}` give x (and y).
fn names_after<'a>(code: &'a str, prefix: &str) -> Vec<(usize, &'a str)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find(prefix) {
        let start = from + at;
        from = start + prefix.len();
        // Only whole path starts: not `foo_crate::` or `xcrate::`.
        if start > 0 {
            let before = code.as_bytes()[start - 1];
            if before.is_ascii_alphanumeric() || before == b'_' {
                continue;
            }
        }
        let rest = &code[from..];
        if rest.starts_with('{') {
            out.extend(group_heads(rest).into_iter().map(|h| (start, h)));
        } else {
            out.push((start, ident_at(rest)));
        }
    }
    out
}

/// The module path of a file under `src/` (`route/router/accept.rs` → route, router,
/// accept; `route/mod.rs` → route).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

/// Whether byte `at` of `code` lies inside an inline `mod name { ... }` (a test module):
/// there `super::` starts one level lower.
fn inline_mod_depth(code: &str, at: usize) -> usize {
    let mut depth = 0;
    for line in code[..at].lines() {
        let t = line.trim_start();
        if (t.starts_with("mod ") || t.starts_with("pub mod ") || t.starts_with("pub(crate) mod "))
            && t.trim_end().ends_with('{')
        {
            depth += 1;
        }
    }
    depth
}

/// Top-level module → (imported top-level module → files importing it), for the tree
/// under `dir` (a crate root: `src/`, or a bench's folder).
fn import_edges(dir: &Path) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| {
            module_path(f.strip_prefix(dir).expect("under dir"))
                .first()
                .cloned()
        })
        .filter(|m| m != "lib" && m != "main")
        .collect();
    let mut edges: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(dir).expect("under dir");
        let path = module_path(rel);
        let Some(top) = path.first().filter(|m| modules.contains(*m)) else {
            continue;
        };
        let text = fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let code = strip_comments(&text);
        let mut add = |to: &str| {
            if to != top && modules.contains(to) {
                edges
                    .entry(top.clone())
                    .or_default()
                    .entry(to.to_string())
                    .or_default()
                    .insert(rel.display().to_string());
            }
        };
        for (_, name) in names_after(&code, "crate::") {
            add(name);
        }
        // `super::` climbing to the crate root: from a module `depth` deep, `depth`
        // supers reach it, and the next segment is a top-level module.
        let mut from = 0;
        while let Some(at) = code[from..].find("super::") {
            let start = from + at;
            let mut rest = &code[start..];
            let mut ups = 0;
            while let Some(r) = rest.strip_prefix("super::") {
                ups += 1;
                rest = r;
            }
            from = code.len() - rest.len();
            let depth = path.len() + inline_mod_depth(&code, start);
            if ups == depth {
                let names = if rest.starts_with('{') {
                    group_heads(rest)
                } else {
                    vec![ident_at(rest)]
                };
                for n in names {
                    add(n);
                }
            }
        }
    }
    edges
}

/// The circles among `edges` (strongly connected sets of two or more modules).
fn circles(edges: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>) -> Vec<Vec<String>> {
    // Reachability by repeated search: the graphs are a few dozen nodes.
    let nodes: BTreeSet<&String> = edges
        .keys()
        .chain(edges.values().flat_map(|m| m.keys()))
        .collect();
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for next in edges.get(&n).into_iter().flat_map(|m| m.keys()) {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut found: BTreeSet<Vec<String>> = BTreeSet::new();
    for n in &nodes {
        let mut set: Vec<String> = reaches[n]
            .iter()
            .filter(|m| reaches.get(m).is_some_and(|r| r.contains(*n)))
            .cloned()
            .collect();
        if set.len() >= 2 || (set.len() == 1 && set[0] != **n) {
            if !set.contains(n) {
                set.push((*n).clone());
            }
            set.sort();
            found.insert(set);
        }
    }
    found.into_iter().collect()
}

fn print_edges(name: &str, edges: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>) {
    println!("import edges of {name}:");
    for (from, tos) in edges {
        for (to, files) in tos {
            let shown: Vec<&str> = files.iter().map(String::as_str).take(3).collect();
            let more = if files.len() > 3 { ", ..." } else { "" };
            println!("  {from} -> {to}   ({}{more})", shown.join(", "));
        }
    }
}

#[test]
fn no_import_circle_between_top_level_modules() {
    let src = import_edges(&root().join("src"));
    print_edges("src", &src);
    assert!(src.len() > 5, "the scan found the modules: {src:?}");
    assert_eq!(
        circles(&src),
        Vec::<Vec<String>>::new(),
        "import circles in src/"
    );
    for bench in fs::read_dir(root().join("benches")).expect("benches/") {
        let dir = bench.expect("entry").path();
        if dir.is_dir() {
            let edges = import_edges(&dir);
            print_edges(&dir.display().to_string(), &edges);
            assert_eq!(
                circles(&edges),
                Vec::<Vec<String>>::new(),
                "import circles in {}",
                dir.display()
            );
        }
    }
}

#[test]
fn no_module_imports_one_it_must_not() {
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(m, to)| (*m, to.iter().copied().collect()))
        .collect();
    // The rules themselves hold no circle.
    let as_edges: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = allowed
        .iter()
        .map(|(m, to)| {
            let tos = to
                .iter()
                .map(|t| (t.to_string(), BTreeSet::from(["rule".to_string()])))
                .collect();
            (m.to_string(), tos)
        })
        .collect();
    assert_eq!(
        circles(&as_edges),
        Vec::<Vec<String>>::new(),
        "ALLOWED has a circle"
    );

    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let src = root().join("src");
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| {
            module_path(f.strip_prefix(&src).expect("under src"))
                .first()
                .cloned()
        })
        .filter(|m| m != "lib" && m != "main")
        .collect();
    let unplaced: Vec<&String> = modules
        .iter()
        .filter(|m| !allowed.contains_key(m.as_str()))
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules missing from ALLOWED: {unplaced:?}"
    );

    let mut bad = Vec::new();
    for (from, tos) in import_edges(&src) {
        for (to, files) in tos {
            if !allowed[from.as_str()].contains(to.as_str()) {
                bad.push(format!("{from} -> {to} in {files:?}"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "imports a role must not make:\n{}",
        bad.join("\n")
    );
}

#[test]
fn no_source_file_is_longer_than_the_limit() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    rust_files(&root().join("benches"), &mut files);
    rust_files(&root().join("tests"), &mut files);
    assert!(files.len() > 20, "found the sources: {}", files.len());
    let mut long: Vec<(usize, String)> = files
        .iter()
        .map(|f| {
            let n = fs::read_to_string(f).expect("readable").lines().count();
            (
                n,
                f.strip_prefix(root())
                    .expect("in repo")
                    .display()
                    .to_string(),
            )
        })
        .filter(|(n, _)| *n > MAX_LINES)
        .collect();
    long.sort();
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:?}");
}

/// The checker itself: it must see every kind of import, and miss comments.
#[test]
fn the_scan_sees_groups_supers_and_skips_comments() {
    let dir = tempfile::tempdir().expect("temp dir");
    let w = |rel: &str, text: &str| {
        let p = dir.path().join(rel);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, text).expect("write");
    };
    w(
        "a.rs",
        "use crate::{b::X, c};\n// use crate::d::Y;\n/* crate::d */\n",
    );
    w(
        "b/mod.rs",
        "mod inner;\nfn f() -> &'static str { \"crate::d\" }\n",
    );
    w("b/inner.rs", "use super::super::c::Z;\nuse super::Q;\n");
    w(
        "c.rs",
        "#[cfg(test)]\nmod tests {\n    use super::super::d::T;\n}\n",
    );
    w("d.rs", "pub fn g() { crate::a::h(); }\n");
    let edges = import_edges(dir.path());
    let pairs: Vec<(String, String)> = edges
        .iter()
        .flat_map(|(f, t)| t.keys().map(move |t| (f.clone(), t.clone())))
        .collect();
    let want = [("a", "b"), ("a", "c"), ("b", "c"), ("c", "d"), ("d", "a")];
    assert_eq!(
        pairs,
        want.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        circles(&edges),
        vec![["a", "b", "c", "d"].map(String::from).to_vec()],
        "a -> b -> c -> d -> a"
    );
}

/// doc/architecture.md's module map names every top-level file and folder of `src/`,
/// and every `src/...` path the document mentions exists.
#[test]
fn the_architecture_doc_maps_the_tree() {
    let doc = fs::read_to_string(root().join("doc/architecture.md")).expect("doc");
    let mut missing = Vec::new();
    for entry in fs::read_dir(root().join("src")).expect("src/") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let shown = if path.is_dir() {
            format!("src/{name}/")
        } else {
            format!("src/{name}")
        };
        let listed =
            doc.contains(&shown) || (name == "lib.rs" && doc.contains("src/main.rs, lib.rs"));
        if !listed {
            missing.push(shown);
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "not in doc/architecture.md's map: {missing:?}"
    );
    let mut stale = Vec::new();
    for (at, _) in doc.match_indices("src/") {
        if at > 0 && doc.as_bytes()[at - 1].is_ascii_alphanumeric() {
            continue;
        }
        let path: String = doc[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '.' | '-'))
            .collect();
        let path = path.trim_end_matches('.');
        if !root().join(path).exists() {
            stale.push(path.to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "doc/architecture.md names paths that do not exist: {stale:?}"
    );
}
