//! `docs/contract.md` and the tree cite the same rule ids.
//!
//! The contract defines each rule as a bullet that starts with its id in bold (`- **ID** …`,
//! an uppercase letter and one or two digits). This test walks the source folders and collects
//! every citation of a rule id, then checks that the contract defines each id once, that every
//! cited id is defined, and that every defined id is cited somewhere.
//!
//! A citation is either
//! - a token made of a defined prefix letter and one or two digits, with no letter, digit or
//!   `_` on either side (a comment like `(R2)` or `SPEC A1–A10`; a range cites its two ends), or
//! - the name of a Rust function that starts with such ids in lower case, as tests are named
//!   after the rule they check: `fn a3_…`, `fn q3_q4_…`, `fn q1_to_q5_…`.
//!
//! Only the prefixes the contract defines count, so `Z0` in a character class such as
//! `[a-zA-Z0-9_-]` (there is no Z rule), `U8` or `-O2` are never taken for rule ids, and the word
//! boundaries rule out hex (`0xA1`) and identifiers (`fooT1`, `T1_bar`, `v1_marker`).
//!
//! Std only, so it runs from any crate: it finds the repository root by walking up from
//! `CARGO_MANIFEST_DIR`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The folders whose files may cite rule ids, relative to the repository root.
const SCANNED: &[&str] = &["host", "tests", "sdk", "plugins", "xtask"];

/// Folders never read: build output, installed dependencies, generated bindings. Folders whose
/// name starts with `.` are skipped too.
const SKIPPED_DIRS: &[&str] = &[
    "target",
    "node_modules",
    ".venv",
    "__pycache__",
    "generated",
];

/// Files read, by extension; everything else is treated as binary or irrelevant.
const TEXT_EXTENSIONS: &[&str] = &["rs", "py", "js", "c", "h", "md", "toml", "wit", "sh"];

/// This file names ids in its docs, messages and scanner checks without citing any rule.
const THIS_FILE: &str = "tests/contract.rs";

const CONTRACT: &str = "docs/contract.md";

/// The repository root: the nearest ancestor of the running crate's manifest folder holding
/// both `docs/contract.md` and `wit/`.
fn repo_root() -> PathBuf {
    let start = Path::new(env!("CARGO_MANIFEST_DIR"));
    start
        .ancestors()
        .find(|dir| dir.join(CONTRACT).is_file() && dir.join("wit").is_dir())
        .unwrap_or_else(|| {
            panic!(
                "no folder above {} holds both {CONTRACT} and wit/",
                start.display()
            )
        })
        .to_path_buf()
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `A3`, `Q12`: one ASCII uppercase letter and one or two ASCII digits.
fn is_rule_id(s: &str) -> bool {
    let mut chars = s.chars();
    let first = chars.next();
    let digits = chars.as_str();
    first.is_some_and(|c| c.is_ascii_uppercase())
        && (1..=2).contains(&digits.len())
        && digits.bytes().all(|b| b.is_ascii_digit())
}

/// The ids the contract defines, each with every line (1-based) that defines it.
fn definitions(contract: &str) -> BTreeMap<String, Vec<usize>> {
    let mut defined: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, line) in contract.lines().enumerate() {
        let Some(rest) = line.strip_prefix("- **") else {
            continue;
        };
        let Some(end) = rest.find("**") else {
            continue;
        };
        let id = &rest[..end];
        if is_rule_id(id) {
            defined.entry(id.to_string()).or_default().push(i + 1);
        }
    }
    defined
}

fn read_contract(root: &Path) -> String {
    fs::read_to_string(root.join(CONTRACT))
        .unwrap_or_else(|e| panic!("cannot read {CONTRACT}: {e}"))
}

fn defined_ids(root: &Path) -> BTreeMap<String, Vec<usize>> {
    let defined = definitions(&read_contract(root));
    assert!(
        !defined.is_empty(),
        "{CONTRACT} defines no rule ids (bullets starting with `- **ID**`)"
    );
    defined
}

/// The rule ids cited on one line, in order of appearance.
fn citations_in_line(line: &str, prefixes: &BTreeSet<char>, rust: bool) -> Vec<String> {
    let chars: Vec<char> = line.chars().collect();
    let before = |i: usize| if i == 0 { None } else { Some(chars[i - 1]) };
    let mut found = Vec::new();
    for (i, &c) in chars.iter().enumerate() {
        // An uppercase id token.
        if prefixes.contains(&c) && !before(i).is_some_and(is_word_char) {
            let digits = chars[i + 1..]
                .iter()
                .take_while(|d| d.is_ascii_digit())
                .count();
            let after = chars.get(i + 1 + digits).copied();
            // A string literal that is nothing but an id is test data, not a citation: in
            // host/core/src/assembly_tests.rs, `.context("a", 0, "A2")` gives a context the
            // text "A2".
            let whole_string_literal = before(i) == Some('"') && after == Some('"');
            if (1..=2).contains(&digits)
                && !after.is_some_and(is_word_char)
                && !whole_string_literal
            {
                found.push(chars[i..=i + digits].iter().collect());
            }
        }
        // A Rust function named after rules: `fn a3_…`, `fn q3_q4_…`, `fn q1_to_q5_…`.
        if rust
            && c == 'f'
            && chars.get(i + 1) == Some(&'n')
            && chars.get(i + 2) == Some(&' ')
            && !before(i).is_some_and(is_word_char)
        {
            let name: String = chars[i + 3..]
                .iter()
                .skip_while(|c| **c == ' ')
                .take_while(|c| is_word_char(**c))
                .collect();
            let mut cited_any = false;
            for segment in name.split('_') {
                let upper = segment.to_ascii_uppercase();
                let lower_prefix = segment
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_lowercase());
                if lower_prefix
                    && is_rule_id(&upper)
                    && upper.chars().next().is_some_and(|p| prefixes.contains(&p))
                {
                    found.push(upper);
                    cited_any = true;
                } else if !(cited_any && segment == "to") {
                    break;
                }
            }
        }
    }
    found
}

/// Where an id is cited: path relative to the root (with `/`) and 1-based line.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Place {
    file: String,
    line: usize,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

fn relative(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap_or(path);
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    parts.join("/")
}

/// `file!()` without leading `.` / `..` components, so a copy of this file elsewhere in the
/// tree is recognised as well as `tests/contract.rs`.
fn is_this_file(rel: &str) -> bool {
    let me: Vec<String> = Path::new(file!())
        .components()
        .skip_while(|c| matches!(c, Component::CurDir | Component::ParentDir))
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    rel == THIS_FILE || (!me.is_empty() && rel == me.join("/"))
}

/// Every text file under `dir`, depth first, in sorted order (so "first use" is stable).
fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // symlink_metadata: symlinks are neither followed nor read.
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if !name.starts_with('.') && !SKIPPED_DIRS.contains(&name.as_str()) {
                collect_files(&path, out);
            }
        } else if meta.is_file()
            && path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| TEXT_EXTENSIONS.contains(&e))
        {
            out.push(path);
        }
    }
}

/// Every citation in the scanned folders: id → places, in scan order.
fn citations(root: &Path, prefixes: &BTreeSet<char>) -> BTreeMap<String, Vec<Place>> {
    let mut files = Vec::new();
    for dir in SCANNED {
        collect_files(&root.join(dir), &mut files);
    }
    assert!(
        !files.is_empty(),
        "found no files to scan under {}",
        SCANNED.join(", ")
    );
    let mut cited: BTreeMap<String, Vec<Place>> = BTreeMap::new();
    for path in files {
        let rel = relative(root, &path);
        if is_this_file(&rel) {
            continue;
        }
        let Ok(bytes) = fs::read(&path) else {
            continue;
        };
        // Binary content (a NUL byte, or not UTF-8) is not text, whatever its extension.
        if bytes.contains(&0) {
            continue;
        }
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        let rust = rel.ends_with(".rs");
        for (i, line) in text.lines().enumerate() {
            for id in citations_in_line(line, prefixes, rust) {
                cited.entry(id).or_default().push(Place {
                    file: rel.clone(),
                    line: i + 1,
                });
            }
        }
    }
    cited
}

fn prefixes_of<'a>(ids: impl Iterator<Item = &'a String>) -> BTreeSet<char> {
    ids.filter_map(|id| id.chars().next()).collect()
}

#[test]
fn the_contract_defines_each_rule_id_once() {
    let root = repo_root();
    let twice: Vec<String> = defined_ids(&root)
        .into_iter()
        .filter(|(_, lines)| lines.len() > 1)
        .map(|(id, lines)| {
            let lines: Vec<String> = lines.iter().map(usize::to_string).collect();
            format!("  {id} on lines {}", lines.join(", "))
        })
        .collect();
    assert!(
        twice.is_empty(),
        "{CONTRACT} defines these rule ids more than once (a new rule takes a new id):\n{}",
        twice.join("\n")
    );
}

#[test]
fn every_cited_rule_id_is_defined_in_the_contract() {
    let root = repo_root();
    let defined = defined_ids(&root);
    let cited = citations(&root, &prefixes_of(defined.keys()));
    let undefined: Vec<String> = cited
        .iter()
        .filter(|(id, _)| !defined.contains_key(*id))
        .map(|(id, places)| {
            format!(
                "  {id}, first cited at {} ({} citation(s))",
                places[0],
                places.len()
            )
        })
        .collect();
    assert!(
        undefined.is_empty(),
        "rule ids cited in the tree but not defined in {CONTRACT}; define each there (a new rule \
         takes the next unused id of its area) or fix the citation:\n{}",
        undefined.join("\n")
    );
}

#[test]
fn every_defined_rule_id_is_cited() {
    let root = repo_root();
    let defined = defined_ids(&root);
    let cited = citations(&root, &prefixes_of(defined.keys()));
    let unused: Vec<&str> = defined
        .keys()
        .filter(|id| !cited.contains_key(*id))
        .map(String::as_str)
        .collect();
    assert!(
        unused.is_empty(),
        "rule ids defined in {CONTRACT} but cited nowhere under {}: {}\ncite each where it is \
         implemented or tested (a test `fn x1_…` counts), or retire the rule (its id is never \
         reused)",
        SCANNED
            .iter()
            .map(|d| format!("{d}/"))
            .collect::<Vec<_>>()
            .join(", "),
        unused.join(", ")
    );
}

#[test]
fn the_readme_links_the_contract() {
    let root = repo_root();
    let readme = fs::read_to_string(root.join("README.md"))
        .unwrap_or_else(|e| panic!("cannot read README.md: {e}"));
    assert!(
        readme.contains(CONTRACT),
        "README.md should link the rule ids' definitions, {CONTRACT}"
    );
}

/// The hand-written scanner on the cases it must tell apart.
#[test]
fn the_scanner_finds_rule_ids_only_where_they_are_cited() {
    let prefixes: BTreeSet<char> = "ACHLQRT".chars().collect();
    let scan = |line: &str, rust: bool| citations_in_line(line, &prefixes, rust).join(" ");
    assert_eq!(scan("//! (SPEC A1–A10, T5, T6).", false), "A1 A10 T5 T6");
    assert_eq!(
        scan("Sessions as logs (Q1–Q6): R4 + Q3", false),
        "Q1 Q6 R4 Q3"
    );
    assert_eq!(scan("A1, L5.", false), "A1 L5");
    // Word boundaries, digit count, prefixes.
    assert_eq!(scan("0xA1 fooT1 T1_bar T123 A0x U8 S1 -O2", false), "");
    assert_eq!(
        scan("`^[a-zA-Z0-9_-]{1,64}$` and \"[A-Z0-9]{1,3}\"", false),
        ""
    );
    // A string literal that is only an id is data.
    assert_eq!(scan(".context(\"a\", 0, \"A2\")", true), "");
    // Test names, in Rust only, from the start of the name.
    assert_eq!(scan("fn a3_more_than_one_complete_section() {", true), "A3");
    assert_eq!(scan("fn q3_q4_a_restart_resumes() {", true), "Q3 Q4");
    assert_eq!(scan("fn q1_to_q5_a_scripted_session() {", true), "Q1 Q5");
    assert_eq!(scan("fn c4_a8_unlisted_marker() {", true), "C4 A8");
    assert_eq!(
        scan("fn t4_constructor_is_an_ordinary_name() {", true),
        "T4"
    );
    assert_eq!(scan("fn helper_a3() { let v1_marker = 1; }", true), "");
    assert_eq!(scan("fn a3_x() {", false), "");
    assert_eq!(scan("fn z9_x() { fn a123_y() {} }", true), "");
}
