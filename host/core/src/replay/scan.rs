//! The hand-written scanner of a message list's JSON text: its top-level values, and a value
//! without its cache markers.

use serde_json::Value;

use crate::cache::Ttl;
use crate::formats::{self, Format};
use crate::prefix;

/// The byte ranges of the top-level values of `text`: compact JSON values joined by commas.
pub(super) fn values_of(text: &str) -> Vec<(usize, usize)> {
    let (mut out, mut depth, mut in_string, mut escaped, mut start) =
        (Vec::new(), 0i64, false, false, 0);
    for (i, &c) in text.as_bytes().iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                in_string = false;
            }
            continue;
        }
        match c {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth -= 1,
            b',' if depth == 0 => {
                out.push((start, i));
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < text.len() {
        out.push((start, text.len()));
    }
    out
}

/// A value of the message list as [`prefix::marked_parts`] reads it: without its cache
/// markers, and the breakpoint they set.
pub(super) fn marked_value(text: &str, format: Format) -> Option<(String, Option<Ttl>)> {
    // The marker promptd writes (Q8), the first key of a block (it sorts first): its bytes
    // cut out are the block without it, as serialized. It cannot be inside a string, whose
    // quotes are escaped; anything else is read as JSON.
    const MARK: &str = "\"cache_control\":{\"type\":\"ephemeral\"},";
    if let Some(at) = text.find(MARK) {
        let (before, after) = (&text[..at], &text[at + MARK.len()..]);
        if before.ends_with('{')
            && !before.contains("cache_control")
            && !after.contains("cache_control")
        {
            return Some(([before, after].concat(), Some(Ttl::Minutes5)));
        }
    }
    let value: Value = serde_json::from_str(text).ok()?;
    let body = serde_json::json!({ formats::list_key(format): [value] });
    let (part, mark) = prefix::marked_parts(&body, format).into_iter().next()?;
    Some((part.text, mark))
}
