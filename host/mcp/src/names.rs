//! MCP tool names to provider tool names (M1). MCP allows up to 128 characters and `.`;
//! providers allow `^[a-zA-Z0-9_-]{1,64}$`. The mapping is a pure function of the prefix and
//! the name, so it never depends on listing order; two names that map alike are an error.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The longest provider tool name.
pub const MAX: usize = 64;

/// `prefix` + `name` with every character outside `[a-zA-Z0-9_-]` as `_`; a result over 64
/// bytes is cut to 55 and ends with `_` and 8 hex digits of the original name's SHA-256.
pub fn map(prefix: &str, name: &str) -> String {
    let mut out: String = prefix
        .chars()
        .chain(name.chars())
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() {
        out.push('_');
    }
    if out.len() > MAX {
        let digest = Sha256::digest(name.as_bytes());
        let hash: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        out.truncate(MAX - 9);
        out.push('_');
        out.push_str(&hash);
    }
    out
}

/// Maps every name: mapped → original, or an error naming both originals of a collision.
pub fn map_all(prefix: &str, names: &[&str]) -> Result<BTreeMap<String, String>, String> {
    let mut mapped = BTreeMap::new();
    for name in names {
        let to = map(prefix, name);
        if let Some(other) = mapped.insert(to.clone(), name.to_string()) {
            return Err(if other == *name {
                format!("lists the tool `{name}` twice")
            } else {
                format!("tools `{other}` and `{name}` both map to the tool name `{to}`")
            });
        }
    }
    Ok(mapped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_the_provider_alphabet() {
        assert_eq!(map("", "get_current_time"), "get_current_time");
        assert_eq!(map("t_", "files.read"), "t_files_read");
        assert_eq!(map("", "ünï code"), "_n__code");
        let long = "a.".repeat(64);
        let mapped = map("", &long);
        assert_eq!(mapped.len(), 64);
        assert!(mapped.starts_with(&"a_".repeat(27)), "{mapped}");
        // The hash suffix is of the original, so two long names with one prefix differ.
        assert_ne!(mapped, map("", &format!("{long}b")));
        assert_eq!(mapped, map("", &long), "deterministic");
    }

    #[test]
    fn a_collision_names_both_originals() {
        let err = map_all("", &["files.read", "files_read"]).unwrap_err();
        assert_eq!(
            err,
            "tools `files.read` and `files_read` both map to the tool name `files_read`"
        );
        let ok = map_all("x-", &["b", "a.b"]).unwrap();
        assert_eq!(ok.keys().collect::<Vec<_>>(), ["x-a_b", "x-b"]);
        assert_eq!(ok["x-a_b"], "a.b");
    }
}
