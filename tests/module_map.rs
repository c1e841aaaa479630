//! `docs/architecture.md`'s crate map and module map match the tree.
//!
//! The crate map names each crate as `host/NAME` in its table's first column; every folder
//! under `host/` with a `Cargo.toml` must be there, and every one there must exist.
//!
//! The module map (from `## Module map` to `<!-- /module-map -->`) is read crate by crate: a
//! crate's part starts at a backticked `host/NAME/src…` and runs to the end of its table or
//! paragraph, or to the next such name. In a table row,
//! the first backticked name is the row's module (`plugin/`, `session.rs`) and the names after
//! it may be its files (`plan.rs`, `config/validate.rs`, or a bare `model`). A name resolves to
//! a file under the crate's `src/`, either as written or within the row's folder (`model` in
//! the `plugin/` row is `plugin/model.rs`; `mod.rs` in the `cache/` row is `cache/mod.rs`; a
//! row `plugin/` itself names `plugin/mod.rs`). Every `.rs` file under `host/*/src` must be
//! named so, and every name that looks like a file (ends in `.rs` or `/`) must resolve.
//!
//! Std only, like `tests/contract.rs`: it finds the repository root by walking up from
//! `CARGO_MANIFEST_DIR`.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

const ARCHITECTURE: &str = "docs/architecture.md";

/// The repository root: the nearest ancestor of the running crate's manifest folder holding
/// both `docs/architecture.md` and `host/`.
fn repo_root() -> PathBuf {
    let start = Path::new(env!("CARGO_MANIFEST_DIR"));
    start
        .ancestors()
        .find(|dir| dir.join(ARCHITECTURE).is_file() && dir.join("host").is_dir())
        .unwrap_or_else(|| panic!("no folder above {} holds {ARCHITECTURE}", start.display()))
        .to_path_buf()
}

/// The backticked spans of a line.
fn ticked(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// The crates: folders under `host/` with a `Cargo.toml`, by name.
fn crates(root: &Path) -> BTreeSet<String> {
    fs::read_dir(root.join("host"))
        .expect("read host/")
        .map(|e| e.expect("read host/").path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut BTreeSet<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.expect("read a folder entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.insert(path);
        }
    }
}

/// The crate a span names (`host/NAME/src` or a path under it), if any.
fn crate_of(span: &str) -> Option<&str> {
    let rest = span.strip_prefix("host/")?;
    let (name, rest) = rest.split_once('/')?;
    (rest == "src" || rest.starts_with("src/")).then_some(name)
}

/// The files `name` may mean in the row of folder `folder` (relative to `src`): as written,
/// or within the folder; a bare name is a `.rs` file or a folder's `mod.rs`.
fn candidates(src: &Path, folder: &str, name: &str) -> Vec<PathBuf> {
    let names: Vec<String> = if let Some(dir) = name.strip_suffix('/') {
        vec![format!("{dir}/mod.rs"), format!("{dir}.rs")]
    } else if name.ends_with(".rs") {
        vec![name.to_string()]
    } else {
        vec![format!("{name}.rs"), format!("{name}/mod.rs")]
    };
    let mut out = Vec::new();
    for n in &names {
        out.push(src.join(n));
        if !folder.is_empty() {
            out.push(src.join(folder).join(n));
        }
    }
    out
}

/// A name that should be a file: ends in `.rs` or `/`, and is a plain relative path.
fn file_like(name: &str) -> bool {
    (name.ends_with(".rs") || name.ends_with('/'))
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '/' | '.' | '-'))
}

#[test]
fn crate_map_names_every_crate() {
    let root = repo_root();
    let text = fs::read_to_string(root.join(ARCHITECTURE)).expect("read the architecture doc");
    let map = text
        .split("## Crate map")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .expect("a `## Crate map` section");
    let listed: BTreeSet<String> = (map.lines())
        .filter(|l| l.starts_with("| `host/"))
        .filter_map(|l| ticked(l).first().map(|s| s["host/".len()..].to_string()))
        .collect();
    let crates = crates(&root);
    let missing: Vec<_> = crates.difference(&listed).collect();
    let gone: Vec<_> = listed.difference(&crates).collect();
    assert!(
        missing.is_empty() && gone.is_empty(),
        "{ARCHITECTURE}'s crate map is out of date: crates not in it: {missing:?}; crates in it \
         that do not exist: {gone:?}"
    );
}

#[test]
fn module_map_names_every_module() {
    let root = repo_root();
    let text = fs::read_to_string(root.join(ARCHITECTURE)).expect("read the architecture doc");
    let map = text
        .split("## Module map")
        .nth(1)
        .and_then(|t| t.split("<!-- /module-map -->").next())
        .expect("a `## Module map` section ending in `<!-- /module-map -->`");
    let (mut named, mut unresolved) = (BTreeSet::new(), Vec::new());
    let mut src: Option<PathBuf> = None;
    let lines: Vec<&str> = map.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        // A crate's part ends with its table or paragraph (`host/cli`'s last one names
        // folders beside `src/`).
        if line.trim().is_empty() && !lines.get(n + 1).is_some_and(|l| l.starts_with('|')) {
            src = None;
        }
        let mut folder = String::new();
        for (i, span) in ticked(line).into_iter().enumerate() {
            if let Some(name) = crate_of(span) {
                let dir = root.join("host").join(name).join("src");
                let file = root.join(span);
                if file.is_file() {
                    named.insert(file);
                }
                src = Some(dir);
                continue;
            }
            let Some(src) = &src else { continue };
            if i == 0 && line.starts_with('|') {
                folder = span
                    .trim_end_matches('/')
                    .trim_end_matches(".rs")
                    .to_string();
                if matches!(folder.as_str(), "lib" | "main") {
                    folder.clear();
                }
            }
            let found: Vec<PathBuf> = (candidates(src, &folder, span).into_iter())
                .filter(|p| p.is_file())
                .collect();
            if found.is_empty() && file_like(span) {
                unresolved.push(format!("`{span}` ({})", src.display()));
            }
            named.extend(found);
        }
    }
    let mut files = BTreeSet::new();
    for name in crates(&root) {
        rust_files(&root.join("host").join(name).join("src"), &mut files);
    }
    let rel = |p: &PathBuf| p.strip_prefix(&root).unwrap_or(p).display().to_string();
    let missing: Vec<String> = files.difference(&named).map(rel).collect();
    assert!(
        missing.is_empty() && unresolved.is_empty(),
        "{ARCHITECTURE}'s module map is out of date:\nmodule files not in it (add a line from \
         each one's `//!` comment): {missing:#?}\nnames in it that are no file: {unresolved:#?}"
    );
}
