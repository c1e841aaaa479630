//! The import-loop check (issue 46): within each crate under `host/`, no module imports one
//! that imports it back.
//!
//! Every `.rs` file under a crate's `src/` is a module: `src/a/b.rs` and `src/a/b/mod.rs` are
//! `a::b`, `lib.rs` and `main.rs` the crate root, and a file named by `#[path = "…"] mod name;`
//! is `name` under the file declaring it. A file has an edge to the module a `crate::…` or
//! `super::…` path in it names (the longest prefix that is a module file), unless that module
//! is the file's own ancestor or descendant. An edge counts between the two modules' distinct
//! ancestors under their common parent: `a::x → b::y` is `a → b`, `a::x → a::y` is `x → y`
//! within `a`. Comments and string literals are stripped first; `use` groups are expanded.
//! Test modules (`tests`, a file or inline) are left out: tests sit above what they test, and
//! are no part of the graph the crate's code is built on.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A module path within its crate (the root is empty).
type Module = Vec<String>;

/// One module-level edge and the file and path that make it.
#[derive(Clone, Debug)]
struct Edge {
    from: Module,
    to: Module,
    file: PathBuf,
    target: PathBuf,
    path: String,
}

/// Every import cycle in the crates under `root/host`, each as lines: the modules in the
/// cycle, then one line per edge naming the file, the file it imports and the path.
pub fn cycles(root: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let host = root.join("host");
    let mut crates: Vec<PathBuf> = std::fs::read_dir(&host)
        .with_context(|| format!("read {}", host.display()))?
        .map(|e| e.map(|e| e.path().join("src")))
        .collect::<Result<_, _>>()?;
    crates.sort();
    for src in crates.into_iter().filter(|s| s.is_dir()) {
        let name = src.parent().unwrap().strip_prefix(root).unwrap().display();
        for cycle in crate_cycles(&src)? {
            let modules: Vec<String> = (cycle.iter())
                .map(|e| display(&e.from))
                .chain(std::iter::once(display(&cycle[0].from)))
                .collect();
            let mut text = format!("{name}: {}", modules.join(" → "));
            for e in &cycle {
                let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).display().to_string();
                text += &format!("\n    {} → {} ({})", rel(&e.file), rel(&e.target), e.path);
            }
            out.push(text);
        }
    }
    Ok(out)
}

fn display(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// The cycles of one crate: for each sibling-level edge `u → v`, the shortest way back from
/// `v` to `u`, each cycle once.
fn crate_cycles(src: &Path) -> Result<Vec<Vec<Edge>>> {
    let files = module_files(src)?;
    let modules: BTreeMap<&Module, &PathBuf> = files.iter().map(|(m, f)| (m, f)).collect();
    let mut graph: BTreeMap<Module, BTreeMap<Module, Edge>> = BTreeMap::new();
    for (module, file) in &files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
        for (inline, path) in paths(&strip(&text)) {
            // Tests sit above what they test: a `tests` module (a file or inline) is no edge.
            if module.iter().chain(&inline).any(|m| m == "tests") {
                continue;
            }
            let Some(target) = resolve(module, &inline, &path, &modules) else {
                continue;
            };
            let common = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common == module.len() || common == target.len() {
                continue; // an ancestor or a descendant
            }
            let edge = Edge {
                from: module[..=common].to_vec(),
                to: target[..=common].to_vec(),
                file: file.clone(),
                target: modules[&target].clone(),
                path: path.join("::"),
            };
            let out = graph.entry(edge.from.clone()).or_default();
            out.entry(edge.to.clone()).or_insert(edge);
        }
    }
    let mut seen = BTreeSet::new();
    let mut cycles = Vec::new();
    for edges in graph.values() {
        for edge in edges.values() {
            let Some(back) = shortest(&graph, &edge.to, &edge.from) else {
                continue;
            };
            let mut cycle = vec![edge.clone()];
            cycle.extend(back);
            let mut key: Vec<&Module> = cycle.iter().map(|e| &e.from).collect();
            let first = (0..key.len()).min_by_key(|&i| key[i]).unwrap();
            key.rotate_left(first);
            if seen.insert(key.into_iter().cloned().collect::<Vec<_>>()) {
                cycle.rotate_left(first);
                cycles.push(cycle);
            }
        }
    }
    Ok(cycles)
}

/// The edges of a shortest path from `from` to `to` (breadth first).
fn shortest(
    graph: &BTreeMap<Module, BTreeMap<Module, Edge>>,
    from: &Module,
    to: &Module,
) -> Option<Vec<Edge>> {
    let mut came: BTreeMap<&Module, &Edge> = BTreeMap::new();
    let mut queue = VecDeque::from([from]);
    while let Some(at) = queue.pop_front() {
        if at == to {
            let mut path = Vec::new();
            let mut at = to;
            while at != from {
                let edge = came[at];
                path.push(edge.clone());
                at = &edge.from;
            }
            path.reverse();
            return Some(path);
        }
        for (next, edge) in graph.get(at).into_iter().flatten() {
            if next != from && !came.contains_key(next) {
                came.insert(next, edge);
                queue.push_back(next);
            }
        }
    }
    None
}

/// Every module file under `src`, by module path.
fn module_files(src: &Path) -> Result<Vec<(Module, PathBuf)>> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut named: BTreeMap<PathBuf, Module> = BTreeMap::new();
    for file in &files {
        let rel = file.strip_prefix(src).unwrap().with_extension("");
        let mut module: Module = rel
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        if matches!(
            module.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            module.pop();
        }
        named.entry(file.clone()).or_insert(module.clone());
        // `#[path = "x.rs"] mod name;` makes x.rs the module `name` under this file.
        let text = std::fs::read_to_string(file)?;
        for (at, _) in text.match_indices("#[path = \"") {
            let rest = &text[at + 10..];
            let (target, rest) = rest.split_once('"').unwrap_or_default();
            let name = rest.split("mod ").nth(1).and_then(|r| r.split(';').next());
            if let Some(name) = name {
                let mut inner = module.clone();
                inner.push(name.trim().to_string());
                named.insert(file.parent().unwrap().join(target), inner);
            }
        }
    }
    Ok(named.into_iter().map(|(f, m)| (m, f)).collect())
}

/// The module `path` (as written: starting with `crate` or `super`) names from `module`, in
/// the inline modules `inline` of its file: the longest prefix that is a module file.
fn resolve(
    module: &Module,
    inline: &[String],
    path: &[String],
    modules: &BTreeMap<&Module, &PathBuf>,
) -> Option<Module> {
    let mut at: Module = module.iter().chain(inline).cloned().collect();
    let mut rest = path;
    if path.first().is_some_and(|s| s == "crate") {
        at.clear();
        rest = &path[1..];
    }
    while rest.first().is_some_and(|s| s == "super") {
        at.pop()?;
        rest = &rest[1..];
    }
    at.extend(rest.iter().cloned());
    while !modules.contains_key(&at) {
        at.pop()?;
    }
    Some(at)
}

/// `text` without comments and with every string and char literal emptied, so that neither
/// can make an edge.
pub(crate) fn strip(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let (mut out, mut i) = (String::new(), 0);
    while i < b.len() {
        let next = b.get(i + 1).copied();
        if b[i] == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if b[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    (depth, i) = (depth + 1, i + 2);
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    (depth, i) = (depth - 1, i + 2);
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if b[i] == 'r' && raw_string(&b, i) {
            let hashes = b[i + 1..].iter().take_while(|&&c| c == '#').count();
            let close: String = std::iter::once('"')
                .chain((0..hashes).map(|_| '#'))
                .collect();
            let body = i + 2 + hashes;
            let rest: String = b[body.min(b.len())..].iter().collect();
            i = body
                + rest
                    .find(&close)
                    .map_or(rest.len(), |n| rest[..n].chars().count() + close.len());
            out.push_str("\"\"");
        } else if b[i] == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                i += if b[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == '\'' && (next == Some('\\') || b.get(i + 2) == Some(&'\'')) {
            i += 2;
            while i < b.len() && b[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Whether `b[i]` (an `r`) starts a raw string (`r"…"`, `r#"…"#`, `br"…"`), not a raw
/// identifier (`r#type`) or the end of a word.
fn raw_string(b: &[char], i: usize) -> bool {
    let word = |c: &char| c.is_alphanumeric() || *c == '_';
    let before = match i.checked_sub(1).map(|j| b[j]) {
        Some('b') => i.checked_sub(2).map(|j| b[j]).filter(word).is_none(),
        Some(c) => !word(&c),
        None => true,
    };
    let hashes = b[i + 1..].iter().take_while(|&&c| c == '#').count();
    before && b.get(i + 1 + hashes) == Some(&'"')
}

fn tokens(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            let mut word = c.to_string();
            while let Some(&n) = chars.peek().filter(|n| n.is_alphanumeric() || **n == '_') {
                word.push(n);
                chars.next();
            }
            out.push(word);
        } else if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            out.push("::".into());
        } else if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    out
}

/// Every path starting with `crate::` or `super::` in stripped source, `use` groups expanded,
/// each with the inline modules (`mod name { … }`) it is written in.
pub(crate) fn paths(text: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let t = tokens(text);
    let (mut out, mut inline, mut depth) = (Vec::new(), Vec::<(String, usize)>::new(), 0usize);
    let mut i = 0;
    while i < t.len() {
        match t[i].as_str() {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            "mod" if t.get(i + 2).is_some_and(|s| s == "{") => {
                inline.push((t[i + 1].clone(), depth));
            }
            "crate" | "super" if t.get(i + 1).is_some_and(|s| s == "::") => {
                let names: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
                let mut found = Vec::new();
                i = tree(&t, i, Vec::new(), &mut found);
                out.extend(found.into_iter().map(|p| (names.clone(), p)));
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Reads one path or `use` tree at `t[i]` under `prefix` into `out`; returns where it ends.
fn tree(t: &[String], mut i: usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    loop {
        match t.get(i).map(String::as_str) {
            Some("{") => {
                i += 1;
                while t.get(i).is_some_and(|s| s != "}") {
                    i = tree(t, i, prefix.clone(), out);
                    if t.get(i).is_some_and(|s| s == ",") {
                        i += 1;
                    }
                }
                return i + 1; // a group names its members, not its prefix
            }
            Some("self") if !prefix.is_empty() => i += 1,
            Some(word) if word.starts_with(|c: char| c.is_alphanumeric() || c == '_') => {
                prefix.push(word.to_string());
                i += 1;
            }
            _ => break,
        }
        if t.get(i).is_some_and(|s| s == "::") {
            i += 1;
        } else {
            if t.get(i).is_some_and(|s| s == "as") {
                i += 2;
            }
            break;
        }
    }
    if !prefix.is_empty() {
        out.push(prefix);
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(src: &str) -> Vec<String> {
        paths(&strip(src))
            .into_iter()
            .map(|(inline, p)| {
                let at = inline.iter().map(|m| format!("{m}:")).collect::<String>();
                format!("{at}{}", p.join("::"))
            })
            .collect()
    }

    #[test]
    fn plain_paths_and_groups() {
        assert_eq!(found("use crate::a::B;"), ["crate::a::B"]);
        assert_eq!(
            found("use crate::{a::X, b::{self, Y as Z}, c};"),
            ["crate::a::X", "crate::b", "crate::b::Y", "crate::c"]
        );
        assert_eq!(
            found("let x = super::super::m::f(1);"),
            ["super::super::m::f"]
        );
        assert_eq!(
            found("fn f() -> crate::log::Level {}"),
            ["crate::log::Level"]
        );
    }

    #[test]
    fn comments_and_strings_make_no_paths() {
        let src = "// crate::a::X\n/// crate::b\n/* crate::c /* nested */ crate::d */\n\
                   let s = \"crate::e\"; let r = r#\"crate::f\"#; let c = '\"';\n\
                   let r#type = 1; let b = br\"crate::i\\\";\n\
                   let t = \"\\\" crate::g\"; use crate::h;";
        assert_eq!(found(src), ["crate::h"]);
    }

    #[test]
    fn visibility_and_lifetimes_are_not_paths() {
        assert_eq!(
            found("pub(crate) fn f<'a>(x: &'a str) {}"),
            Vec::<String>::new()
        );
        assert_eq!(found("pub(super) struct S; use super::*;"), ["super"]);
    }

    #[test]
    fn inline_modules_are_tracked() {
        let src = "use crate::a; mod tests { use super::b; fn f() {} } use crate::c;";
        assert_eq!(found(src), ["crate::a", "tests:super::b", "crate::c"]);
    }

    #[test]
    fn resolves_to_the_longest_module() {
        let a = vec!["a".to_string()];
        let ab = vec!["a".to_string(), "b".to_string()];
        let c = vec!["c".to_string()];
        let files = [
            PathBuf::from("a.rs"),
            PathBuf::from("a/b.rs"),
            PathBuf::from("c.rs"),
        ];
        let modules: BTreeMap<&Module, &PathBuf> =
            [(&a, &files[0]), (&ab, &files[1]), (&c, &files[2])].into();
        let p = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
        assert_eq!(
            resolve(&c, &[], &p("crate::a::b::X::f"), &modules),
            Some(ab.clone())
        );
        assert_eq!(resolve(&ab, &[], &p("super::X"), &modules), Some(a.clone()));
        assert_eq!(
            resolve(&ab, &[], &p("super::super::c::Y"), &modules),
            Some(c.clone())
        );
        // `super` in `a/b.rs`'s inline `tests` is `a::b` itself.
        assert_eq!(
            resolve(&ab, &p("tests"), &p("super::X"), &modules),
            Some(ab.clone())
        );
    }
}
