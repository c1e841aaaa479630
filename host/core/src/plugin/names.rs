//! Name rules shared by validation and rendering (SPEC C3, C4, C5).

/// C5: section and context names (and scope keys) are non-empty printable ASCII without
/// whitespace, so ordering by name is the same in every language.
pub fn is_item_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic())
}

/// C3: `^[a-z][a-z0-9_]*$`.
pub fn is_variable_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
}

/// C4: `^[a-zA-Z0-9_-]{1,64}$`, the strictest provider convention.
pub fn is_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// At most `max` characters of an untrusted name, for an error message (the full name may be
/// kilobytes long); control characters are escaped.
pub fn shortened(name: &str, max: usize) -> String {
    let mut out: String = name
        .chars()
        .take(max)
        .flat_map(char::escape_debug)
        .collect();
    if name.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}

/// The tool_order marker that stands for every tool not listed (A7). Never a tool name.
pub const UNLISTED_TOOLS: &str = "<unlisted-tools>";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortened_names_are_bounded_and_escaped() {
        assert_eq!(shortened("abc", 5), "abc");
        assert_eq!(shortened("abcdef", 3), "abc…");
        assert_eq!(shortened("a\nb\u{1b}[31m", 10), "a\\nb\\u{1b}[31m");
    }

    #[test]
    fn c5_item_names() {
        assert!(is_item_name("deployment:persona"));
        assert!(!is_item_name(""));
        assert!(!is_item_name("a b"));
        assert!(!is_item_name("tab\there"));
        assert!(!is_item_name("é"));
    }

    #[test]
    fn c3_variable_names() {
        assert!(is_variable_name("model_2"));
        for bad in ["", "Model", "2x", "a-b", "a b", "_a"] {
            assert!(!is_variable_name(bad), "{bad}");
        }
    }

    #[test]
    fn c4_tool_names() {
        assert!(is_tool_name("read_file"));
        assert!(is_tool_name("a-B_9"));
        assert!(is_tool_name(&"x".repeat(64)));
        assert!(!is_tool_name(&"x".repeat(65)));
        for bad in ["", "a.b", "a b", UNLISTED_TOOLS] {
            assert!(!is_tool_name(bad), "{bad}");
        }
    }
}
