//! Fuzz targets as proptest harnesses, so CI runs each for a bounded number of cases on every
//! change (SPEC A10, L5: bad input is an error, never a panic). For a longer run:
//!
//! ```sh
//! PROPTEST_CASES=200000 cargo test -p promptd-core --lib fuzz_
//! ```

use proptest::prelude::*;

use crate::config::Config;
use crate::conversation::Message;
use crate::plugin::interpolate::{interpolate, parse, Resolved};

/// 4096 cases per target in every test run; `PROPTEST_CASES` asks for more (or fewer).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096)
}

/// Text with plenty of braces, names and multi-byte characters.
fn template() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just("{{".to_string()),
            Just("}}".to_string()),
            Just("{".to_string()),
            Just("}".to_string()),
            Just(" ".to_string()),
            "[a-z_][a-z0-9_]{0,6}",
            "[A-Z0-9]{1,3}",
            Just("é✓".to_string()),
            any::<char>().prop_map(String::from),
        ],
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn fuzz_interpolation_never_panics_and_never_leaks_a_reference(text in template()) {
        let result = interpolate(&text, "section fuzz", &mut |name| {
            Ok(if name.len() % 2 == 0 {
                Resolved::Value(format!("<{name}>").into())
            } else {
                Resolved::Unknown { known: vec![] }
            })
        });
        if let Ok(out) = result {
            // Every reference was replaced: re-parsing the output's own references finds
            // only ones that came from literal text, never one the input had as a group.
            if let Ok(pieces) = parse(&text) {
                for piece in pieces {
                    if let crate::plugin::interpolate::Piece::Reference { name, .. } = piece {
                        let replaced = format!("<{name}>");
                        prop_assert!(out.contains(&replaced));
                    }
                }
            }
        }
    }

    #[test]
    fn fuzz_interpolation_is_the_identity_on_text_without_double_braces(text in "[^{]*") {
        let out = interpolate(&text, "section fuzz", &mut |_| Ok(Resolved::Unknown { known: vec![] }));
        prop_assert_eq!(out.unwrap(), text);
    }

    #[test]
    fn fuzz_config_parsing_never_panics(text in "(\\[[a-z._]{0,12}\\]\n|[a-z_]{1,10} = (\"[^\"\n]{0,8}\"|[0-9]{1,3}|\\[\"[a-z<>-]{0,8}\"(, \"[a-z<>-]{0,8}\")*\\]|true|\\{ [a-z]{1,4} = \"x\" \\})\n){0,8}") {
        let _ = Config::parse(&text, "fuzz.toml");
    }

    #[test]
    fn fuzz_config_arbitrary_bytes(text in any::<String>()) {
        let _ = Config::parse(&text, "fuzz.toml");
    }

    #[test]
    fn fuzz_json_shaped_messages_are_checked_without_panics(
        role in prop_oneof![
            Just("user".to_string()),
            Just("assistant".to_string()),
            Just("tool".to_string()),
            Just("system".to_string()),
            "[a-z]{0,5}",
        ],
        content in any::<String>(),
        id in "[a-z0-9_]{0,6}",
    ) {
        let body = serde_json::json!({"role": role, "content": content, "tool_call_id": id});
        if let Ok(message) = serde_json::from_value::<Message>(body) {
            let _ = crate::session::check_message("fuzz", &[], &message);
        }
    }
}
