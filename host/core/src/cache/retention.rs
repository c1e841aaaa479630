//! OpenAI's prompt cache retention: how long an idle cached prefix lives.
//!
//! OpenAI documents two policies, chosen per request with `prompt_cache_retention`
//! (Chat Completions and Responses; "Prompt caching", 2026-12):
//!
//! - `in_memory`: the prefix stays in GPU memory, usually 5 to 10 minutes idle, at most an hour;
//! - `24h`: extended retention offloads it to GPU-local storage, up to 24 hours. Same price.
//!
//! Which models take which, and what a request that does not say gets:
//!
//! | models | offer | not said |
//! |---|---|---|
//! | `gpt-5.5` and later, `gpt-6…` | `24h` only (`in_memory` is refused) | `24h` |
//! | `gpt-5.4`, `gpt-5.3-codex`, `gpt-5.2`, `gpt-5.1` (`-codex`, `-codex-mini`, `-codex-max`, `-chat-latest`), `gpt-5`, `gpt-5-codex`, `gpt-4.1` | both | the organisation's default: `24h` without Zero Data Retention, `in_memory` with it |
//! | the others (`gpt-4o`, `gpt-5-mini`, `o3`, …) | `in_memory` only (`24h` is refused) | `in_memory` |
//!
//! A dated snapshot (`gpt-4.1-2025-04-14`) is its model. The organisation's default is the
//! config's `[cache.openai] retention` (default `24h`, as OpenAI's is for an organisation
//! without Zero Data Retention).
//!
//! ```
//! use promptd_core::cache::retention::{check, served, Retention};
//!
//! assert_eq!(served("gpt-4.1-2025-04-14", None, Retention::Hours24), Retention::Hours24);
//! assert_eq!(served("gpt-4.1", None, Retention::InMemory), Retention::InMemory);
//! assert_eq!(served("gpt-4o", None, Retention::Hours24), Retention::InMemory);
//! assert_eq!(served("gpt-5.5", Some(Retention::InMemory), Retention::InMemory), Retention::Hours24);
//! assert!(check("gpt-4o", "24h").unwrap_err().contains("gpt-4o"));
//! assert!(check("gpt-5.1", "1h").unwrap_err().contains("in_memory"));
//! ```

use serde::{Deserialize, Serialize};

/// A retention policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Retention {
    /// `in_memory`: minutes idle (the model's `ttl_ms`).
    #[serde(rename = "in_memory")]
    InMemory,
    /// `24h`: extended retention (the model's `ttl_long_ms`).
    #[serde(rename = "24h")]
    Hours24,
}

impl Retention {
    /// The word the API takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Retention::InMemory => "in_memory",
            Retention::Hours24 => "24h",
        }
    }

    /// The policy `word` names, if any.
    pub fn parse(word: &str) -> Option<Retention> {
        match word {
            "in_memory" => Some(Retention::InMemory),
            "24h" => Some(Retention::Hours24),
            _ => None,
        }
    }
}

/// The policies a model takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offer {
    /// `in_memory` only.
    InMemory,
    /// Both; the organisation's default when a request does not say.
    Both,
    /// `24h` only.
    Hours24,
}

/// The models that take both, as OpenAI lists them.
const BOTH: [&str; 12] = [
    "gpt-5.4",
    "gpt-5.3-codex",
    "gpt-5.2",
    "gpt-5.1-codex-max",
    "gpt-5.1",
    "gpt-5.1-codex",
    "gpt-5.1-codex-mini",
    "gpt-5.1-chat-latest",
    "gpt-5",
    "gpt-5-codex",
    "gpt-4.1",
    "gpt-5.1-chat",
];

/// `model` without a dated snapshot suffix (`-2025-04-14`).
fn family(model: &str) -> &str {
    let m = model.trim();
    if let Some(tail) = m.len().checked_sub(11).and_then(|at| m.get(at..)) {
        let t = tail.as_bytes();
        let dated = t[0] == b'-'
            && t[5] == b'-'
            && t[8] == b'-'
            && [1, 2, 3, 4, 6, 7, 9, 10]
                .iter()
                .all(|&i| t[i].is_ascii_digit());
        if dated && m.len() > 11 {
            return &m[..m.len() - 11];
        }
    }
    m
}

/// Whether `family` is `gpt-5.N` with N ≥ 5, or a later generation.
fn newer_than_5_4(family: &str) -> bool {
    if let Some(rest) = family.strip_prefix("gpt-5.") {
        let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
        return minor.parse::<u32>().is_ok_and(|n| n >= 5);
    }
    family
        .strip_prefix("gpt-")
        .and_then(|rest| rest.split(['.', '-']).next())
        .and_then(|major| major.parse::<u32>().ok())
        .is_some_and(|major| major >= 6)
}

/// The policies `model` takes.
pub fn offer(model: &str) -> Offer {
    let lower = model.to_ascii_lowercase();
    let f = family(&lower);
    if BOTH.contains(&f) {
        Offer::Both
    } else if newer_than_5_4(f) {
        Offer::Hours24
    } else {
        Offer::InMemory
    }
}

/// The policy a request for `model` is served under: what it `asked`, else the organisation's
/// default where the model takes both, else the one the model takes. (A request asking for a
/// policy its model refuses is refused by the provider; [`check`] keeps promptd from sending
/// one, so the answer here is the policy the model offers.)
pub fn served(model: &str, asked: Option<Retention>, default: Retention) -> Retention {
    match offer(model) {
        Offer::InMemory => Retention::InMemory,
        Offer::Hours24 => Retention::Hours24,
        Offer::Both => asked.unwrap_or(default),
    }
}

/// Refuses a `prompt_cache_retention` the API would refuse for `model`, naming both.
pub fn check(model: &str, asked: &str) -> Result<Retention, String> {
    let Some(r) = Retention::parse(asked) else {
        return Err(format!(
            "prompt_cache_retention must be \"in_memory\" or \"24h\", got {asked:?}"
        ));
    };
    match (offer(model), r) {
        (Offer::InMemory, Retention::Hours24) => Err(format!(
            "prompt_cache_retention \"24h\": model `{model}` offers only in_memory retention"
        )),
        (Offer::Hours24, Retention::InMemory) => Err(format!(
            "prompt_cache_retention \"in_memory\": model `{model}` offers only 24h retention"
        )),
        _ => Ok(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{Block, Cache, Cause, Request, Rules};
    use crate::formats::Format;

    #[test]
    fn k11_models_take_the_retention_openai_lists_for_them() {
        for (model, want) in [
            ("gpt-4.1", Offer::Both),
            ("gpt-4.1-2025-04-14", Offer::Both),
            ("GPT-5.1", Offer::Both),
            ("gpt-5.1-codex-max", Offer::Both),
            ("gpt-5.4", Offer::Both),
            ("gpt-5.5", Offer::Hours24),
            ("gpt-5.5-pro", Offer::Hours24),
            ("gpt-5.10", Offer::Hours24),
            ("gpt-6", Offer::Hours24),
            ("gpt-6.1-mini", Offer::Hours24),
            ("gpt-4o", Offer::InMemory),
            ("gpt-4.1-mini", Offer::InMemory),
            ("gpt-5-mini", Offer::InMemory),
            ("o3", Offer::InMemory),
            ("gpt-test", Offer::InMemory),
            ("", Offer::InMemory),
        ] {
            assert_eq!(offer(model), want, "{model}");
        }
        assert_eq!(
            served("gpt-5", Some(Retention::InMemory), Retention::Hours24),
            Retention::InMemory
        );
        assert_eq!(check("gpt-5.5", "24h"), Ok(Retention::Hours24));
        assert!(check("gpt-5.5", "in_memory")
            .unwrap_err()
            .contains("gpt-5.5"));
        assert!(check("gpt-4.1", "").is_err());
    }

    fn rules(config: &str, format: Format, model: &str) -> Rules {
        let config = crate::config::Config::parse(config, "t").unwrap();
        Rules::of(format, model, &config.cache).unwrap()
    }

    #[test]
    fn k11_an_idle_gap_expires_an_openai_prefix_only_under_in_memory_retention() {
        let blocks = |tail: u64| vec![Block::new(1, 3000, None), Block::new(tail, 100, None)];
        let gap = 20 * 60_000; // past in-memory's minutes, within 24 hours
        let served = |rules: Rules| {
            let mut cache = Cache::new(rules);
            cache.serve(&Request::new(0, blocks(7)));
            cache.serve(&Request::new(gap, blocks(8)))
        };
        // A model that offers both, the organisation's default (24h unless the config says).
        let o = served(rules("", Format::Openai, "gpt-4.1"));
        assert_eq!((o.read, o.cause), (2944, Cause::Partial));
        let zdr = "[cache.openai]\nretention = \"in_memory\"\n";
        let o = served(rules(zdr, Format::Openai, "gpt-4.1"));
        assert_eq!((o.read, o.cause), (0, Cause::Expired));
        // The body's own setting wins where the model offers both; not where it does not.
        let o = served(rules(zdr, Format::OpenaiResponses, "gpt-5").asked("gpt-5", Some("24h")));
        assert_eq!(o.read, 2944);
        let o = served(rules("", Format::Openai, "gpt-4.1").asked("gpt-4.1", Some("in_memory")));
        assert_eq!(o.cause, Cause::Expired);
        let o = served(rules("", Format::Openai, "gpt-4o").asked("gpt-4o", Some("24h")));
        assert_eq!(o.cause, Cause::Expired);
        // Past 24 hours even extended retention has let it go.
        let mut cache = Cache::new(rules("", Format::Openai, "gpt-5.5"));
        cache.serve(&Request::new(0, blocks(7)));
        let late = cache.serve(&Request::new(25 * 3_600_000, blocks(8)));
        assert_eq!(late.cause, Cause::Expired);
    }

    #[test]
    fn k11_the_config_refuses_a_retention_the_model_does_not_offer() {
        let base = "[model.openai]\nmodel = \"MODEL\"\nprompt_cache_retention = \"WORD\"\n";
        for (model, word, ok) in [
            ("gpt-4.1", "24h", true),
            ("gpt-4.1", "in_memory", true),
            ("gpt-4o", "24h", false),
            ("gpt-5.5", "in_memory", false),
            ("gpt-5", "1h", false),
        ] {
            let text = base.replace("MODEL", model).replace("WORD", word);
            match crate::config::Config::parse(&text, "t") {
                Ok(_) => assert!(ok, "{text}"),
                Err(e) => {
                    let e = e.to_string();
                    assert!(!ok, "{text}: {e}");
                    assert!(e.contains("prompt_cache_retention"), "{e}");
                    assert!(e.contains("model.openai"), "{e}");
                }
            }
        }
        let e = crate::config::Config::parse("[cache.anthropic]\nretention = \"24h\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("[cache.anthropic] retention"), "{e}");
        let e = crate::config::Config::parse("[cache.openai]\nretention = \"1h\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 2") && e.contains("`in_memory` or `24h`"),
            "{e}"
        );
    }

    #[test]
    fn k11_held_changes_wait_for_the_retention_the_agents_openai_model_gets() {
        let idle = |config: &str| {
            let config = crate::config::Config::parse(config, "t").unwrap();
            let plan = crate::config::AgentSettings::resolve(&config, "default", |_| None).unwrap();
            plan.idle_ttl_ms(Format::Openai, None)
        };
        let model = "[model.openai]\nmodel = \"gpt-4.1\"\n";
        assert_eq!(idle(model), 24 * 3_600_000);
        let asked = format!("{model}prompt_cache_retention = \"in_memory\"\n");
        assert_eq!(idle(&asked), 300_000);
        assert_eq!(idle("[model.openai]\nmodel = \"gpt-4o\"\n"), 300_000);
        let zdr = format!("{model}[cache.openai]\nretention = \"in_memory\"\nttl_s = 600\n");
        assert_eq!(idle(&zdr), 600_000);
        let longer = format!("{model}[cache.openai]\nttl_24h_s = 7200\n");
        assert_eq!(idle(&longer), 7_200_000);
    }
}
