//! The context window as a budget: what each part of a request costs, and whether it fits.
//!
//! A request has a fixed part — tools (as the chosen format serializes them), the system
//! prompt, the output reserve — and a variable part: the conversation (its messages, as their
//! neutral JSON, which over-counts slightly: the safe side for a budget). Every part is
//! measured in characters (Unicode scalar values) and in tokens of the agent's [`Counter`];
//! sections and contexts are also reported one by one. A request whose parts do not fit the
//! window is `context_overflow`, never a silent truncation.
//!
//! ```
//! use promptd_core::budget::{Chars, Counter};
//! assert_eq!(Chars.count("日本語 🙂"), 5);
//! ```

use serde::Serialize;

use crate::error::{Error, Result};

/// Counts tokens of a text for one tokenizer.
pub trait Counter: Send + Sync {
    /// The tokenizer's name as configured (`chars`, `o200k`, `cl100k`).
    fn name(&self) -> &str;
    /// How many tokens `text` is.
    fn count(&self, text: &str) -> usize;
}

/// `chars`: one token per Unicode scalar value, the same for every provider.
#[derive(Clone, Copy, Debug, Default)]
pub struct Chars;

impl Counter for Chars {
    fn name(&self) -> &str {
        "chars"
    }

    fn count(&self, text: &str) -> usize {
        text.chars().count()
    }
}

/// The size of one part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Size {
    /// Unicode scalar values.
    pub chars: usize,
    /// Tokens of the agent's counter.
    pub tokens: usize,
}

impl Size {
    /// The size of `text`, counted by `counter`.
    pub fn of(text: &str, counter: &dyn Counter) -> Size {
        Size {
            chars: text.chars().count(),
            tokens: counter.count(text),
        }
    }

    fn add(self, other: Size) -> Size {
        Size {
            chars: self.chars + other.chars,
            tokens: self.tokens + other.tokens,
        }
    }
}

impl std::ops::AddAssign for Size {
    fn add_assign(&mut self, other: Size) {
        *self = self.add(other);
    }
}

/// One named section or context.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Part {
    /// The section's or context's name.
    // Shared with the assembly's (no copy per step).
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub name: std::sync::Arc<str>,
    /// Its size.
    #[serde(flatten)]
    pub size: Size,
}

/// Fields in sorted order, as a JSON value would hold them: the step reply writes the usage
/// straight from the struct, in the same bytes as before it stopped going through a value.
impl Serialize for Part {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut m = s.serialize_struct("Part", 3)?;
        m.serialize_field("chars", &self.size.chars)?;
        m.serialize_field("name", &self.name)?;
        m.serialize_field("tokens", &self.size.tokens)?;
        m.end()
    }
}

/// What a step's request costs, returned beside it and recorded with the step.
#[derive(Clone, Default, Debug, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Usage {
    /// The tokenizer that counted the tokens.
    pub tokenizer: String,
    /// The agent's window in tokens, when it has a budget.
    #[serde(default)]
    pub window: Option<u64>,
    /// Tokens kept free for the model's answer.
    pub reserve: u64,
    /// The tools, as the format serializes them.
    pub tools: Size,
    /// The system prompt.
    pub system: Size,
    /// Each section of the system prompt.
    pub sections: Vec<Part>,
    /// Each context of the runtime context.
    pub contexts: Vec<Part>,
    /// This step's runtime context snapshot (also counted in `messages` once appended).
    pub snapshot: Size,
    /// Every message of the request, this step's input and snapshot included.
    pub messages: Size,
    /// How many messages the request holds.
    pub message_count: usize,
    /// tools + system + messages.
    pub total: Size,
    /// What this step left out of the history to fit (already taken off `messages`).
    #[serde(default)]
    pub dropped: Option<Dropped>,
    /// K9: the deferred tools a format leaves out of the prompt (found by the provider's tool
    /// search), not in `tools` nor `total`; zero, and not written, when none is.
    #[serde(default)]
    pub deferred_tools: Size,
}

/// Sorted fields, as [`Part`]'s; `window`, `dropped` and `deferred_tools` only when set.
impl Serialize for Usage {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut m = s.serialize_struct("Usage", 12)?;
        m.serialize_field("contexts", &self.contexts)?;
        if self.deferred_tools != Size::default() {
            m.serialize_field("deferred_tools", &self.deferred_tools)?;
        }
        if let Some(dropped) = &self.dropped {
            m.serialize_field("dropped", dropped)?;
        }
        m.serialize_field("message_count", &self.message_count)?;
        m.serialize_field("messages", &self.messages)?;
        m.serialize_field("reserve", &self.reserve)?;
        m.serialize_field("sections", &self.sections)?;
        m.serialize_field("snapshot", &self.snapshot)?;
        m.serialize_field("system", &self.system)?;
        m.serialize_field("tokenizer", &self.tokenizer)?;
        m.serialize_field("tools", &self.tools)?;
        m.serialize_field("total", &self.total)?;
        if let Some(window) = &self.window {
            m.serialize_field("window", window)?;
        }
        m.end()
    }
}

/// Messages a step dropped from the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Dropped {
    /// How many messages.
    pub messages: usize,
    /// Their size.
    #[serde(flatten)]
    pub size: Size,
}

/// Sorted fields, as [`Part`]'s.
impl Serialize for Dropped {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut m = s.serialize_struct("Dropped", 3)?;
        m.serialize_field("chars", &self.size.chars)?;
        m.serialize_field("messages", &self.messages)?;
        m.serialize_field("tokens", &self.size.tokens)?;
        m.end()
    }
}

impl Usage {
    /// Takes `count` messages of `size` out of the messages (and the total), as dropped.
    pub fn leave_out(&mut self, count: usize, size: Size) {
        self.messages.chars -= size.chars;
        self.messages.tokens -= size.tokens;
        self.total.chars -= size.chars;
        self.total.tokens -= size.tokens;
        self.message_count -= count;
        self.dropped = Some(Dropped {
            messages: count,
            size,
        });
    }

    /// Refuses a request that does not fit: the runtime context over its cap, the fixed part
    /// alone, or the whole with the reserve, over the window, or the messages over their cap.
    pub fn check(&self, budget: &Budget) -> Result<()> {
        if let Some(cap) = budget.context_max {
            if self.snapshot.tokens as u64 > cap {
                let parts: Vec<String> = self
                    .contexts
                    .iter()
                    .filter(|c| c.size.tokens > 0)
                    .map(|c| format!("{} {}", c.name, c.size.tokens))
                    .collect();
                return Err(Error::ContextOverflow(format!(
                    "the runtime context needs {} {} against its cap of {cap} (budget.context_max): {}",
                    self.snapshot.tokens,
                    self.tokenizer_unit(),
                    parts.join(", ")
                )));
            }
        }
        if let Some(cap) = budget.history_max {
            if self.messages.tokens as u64 > cap {
                return Err(Error::ContextOverflow(format!(
                    "the messages need {} {} against their cap of {cap} (budget.history_max), {} messages",
                    self.messages.tokens,
                    self.tokenizer_unit(),
                    self.message_count
                )));
            }
        }
        let Some(window) = self.window else {
            return Ok(());
        };
        let fixed = (self.tools.tokens + self.system.tokens) as u64 + self.reserve;
        let whole = self.total.tokens as u64 + self.reserve;
        if fixed > window || whole > window {
            let what = if fixed > window {
                "the fixed part alone (tools + system + reserve)"
            } else {
                "the request (tools + system + messages + reserve)"
            };
            return Err(Error::ContextOverflow(format!(
                "{what} needs {} {tok} against a window of {window}: tools {}, system {}, messages {} ({} messages), reserve {}",
                if fixed > window { fixed } else { whole },
                self.tools.tokens,
                self.system.tokens,
                self.messages.tokens,
                self.message_count,
                self.reserve,
                tok = self.tokenizer_unit(),
            )));
        }
        Ok(())
    }

    fn tokenizer_unit(&self) -> String {
        format!("tokens ({})", self.tokenizer)
    }
}

/// An agent's budget (`[agents.NAME.budget]`, merged along the chain).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// `None`: measured, never refused.
    pub window: Option<u64>,
    /// Tokens kept free for the model's answer.
    pub reserve: u64,
    /// The tokenizer it counts in (`chars`, `o200k`, `cl100k`).
    pub tokenizer: String,
    /// Turns (from a user message on) never dropped when trimming.
    pub keep_turns: usize,
    /// A cap on the messages' tokens below what the window leaves.
    pub history_max: Option<u64>,
    /// A cap on the runtime context snapshot's tokens.
    pub context_max: Option<u64>,
}

/// Default of `budget.keep_turns`.
pub const DEFAULT_KEEP_TURNS: u64 = 2;

/// What a request's fixed parts take: the tools as the format shows them, and the system
/// prompt. They change only with the header, so a session measures them once per header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fixed {
    /// The tools, as the format serializes them, but what it defers.
    pub tools: Size,
    /// The system prompt.
    pub system: Size,
    /// The tools the format defers (K9).
    pub deferred_tools: Size,
}

/// A request's messages as the caller measured them (the session keeps them summed as they
/// are appended): their size, and how many they are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measured {
    /// The messages' size, summed.
    pub size: Size,
    /// How many messages.
    pub count: usize,
}

impl Fixed {
    /// Measures the fixed parts of a request with `header` in `format`; `shown` is the subset of its tools shown this step, if one is.
    pub fn measure(
        counter: &dyn Counter,
        header: &crate::conversation::Header,
        format: crate::formats::Format,
        shown: Option<&[String]>,
    ) -> Self {
        let value = crate::formats::tools_value(header, format, shown)
            .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()));
        let Some(value) = value else {
            return Self {
                system: Size::of(&header.system, counter),
                ..Self::default()
            };
        };
        // K9: what a deferring format keeps out of the prompt is measured apart.
        let deferring = matches!(
            format,
            crate::formats::Format::Anthropic | crate::formats::Format::OpenaiResponses
        ) && header.tools.iter().any(|t| t.defer.is_some());
        let (tools, deferred_tools) = if deferring {
            let prompt = crate::prefix::prompt_tools(&value);
            let all = Size::of(&value.to_string(), counter);
            let sent = Size::of(&prompt.to_string(), counter);
            (
                sent,
                Size {
                    chars: all.chars.saturating_sub(sent.chars),
                    tokens: all.tokens.saturating_sub(sent.tokens),
                },
            )
        } else {
            (Size::of(&value.to_string(), counter), Size::default())
        };
        Self {
            tools,
            system: Size::of(&header.system, counter),
            deferred_tools,
        }
    }
}

/// Measures one request: the fixed parts from the header and assembly, the messages as
/// measured by the caller ([`Measured`]).
pub fn usage(
    budget: &Budget,
    counter: &dyn Counter,
    header: &crate::conversation::Header,
    assembly: &crate::assembly::Assembly,
    format: crate::formats::Format,
    shown: Option<&[String]>,
    messages: Measured,
) -> Usage {
    let fixed = Fixed::measure(counter, header, format, shown);
    usage_with(budget, counter, fixed, assembly, messages)
}

/// [`usage`] with the fixed parts measured earlier ([`Fixed::measure`]).
pub fn usage_with(
    budget: &Budget,
    counter: &dyn Counter,
    fixed: Fixed,
    assembly: &crate::assembly::Assembly,
    messages: Measured,
) -> Usage {
    let Fixed {
        tools,
        system,
        deferred_tools,
    } = fixed;
    let Measured {
        size: messages,
        count: message_count,
    } = messages;
    let parts = |list: &[(std::sync::Arc<str>, std::sync::Arc<str>)]| {
        list.iter()
            .map(|(name, text)| Part {
                name: name.clone(),
                size: Size::of(text, counter),
            })
            .collect()
    };
    Usage {
        tokenizer: counter.name().to_string(),
        window: budget.window,
        reserve: budget.reserve,
        tools,
        system,
        sections: parts(&assembly.sections),
        contexts: parts(&assembly.contexts),
        snapshot: assembly
            .runtime_context
            .as_deref()
            .map(|t| Size::of(t, counter))
            .unwrap_or_default(),
        messages,
        message_count,
        total: tools.add(system).add(messages),
        dropped: None,
        deferred_tools,
    }
}

#[cfg(test)]
mod tests {
    /// The step reply writes `Usage` straight from the struct: its bytes are the ones a JSON
    /// value of it (keys sorted) gives, with and without the optional parts.
    #[test]
    fn usage_serialises_with_sorted_keys_as_a_json_value_would() {
        let part = |name: &str, n| Part {
            name: name.into(),
            size: Size {
                chars: n,
                tokens: n / 4,
            },
        };
        let mut usage = Usage {
            tokenizer: "o200k".into(),
            reserve: 7,
            sections: vec![part("persona", 40), part("tools", 8)],
            contexts: vec![part("workspace", 12)],
            message_count: 3,
            ..Usage::default()
        };
        for _ in 0..2 {
            let direct = serde_json::to_string(&usage).unwrap();
            let value = serde_json::to_value(&usage).unwrap().to_string();
            assert_eq!(direct, value);
            let back: Usage = serde_json::from_str(&direct).unwrap();
            assert_eq!(back, usage);
            usage.window = Some(1000);
            usage.leave_out(
                1,
                Size {
                    chars: 0,
                    tokens: 0,
                },
            );
        }
    }

    use super::*;

    #[test]
    fn chars_counts_unicode_scalar_values() {
        assert_eq!(Chars.count("abc"), 3);
        assert_eq!(Chars.count("漢字かな"), 4);
        assert_eq!(
            Chars.count("👍🏽"),
            2,
            "an emoji with a skin tone is two scalars"
        );
        assert_eq!(
            Size::of("é", &Chars),
            Size {
                chars: 1,
                tokens: 1
            }
        );
    }

    #[test]
    fn a_request_over_its_window_is_an_overflow_naming_its_parts() {
        let size = |tokens| Size {
            chars: tokens,
            tokens,
        };
        let usage = Usage {
            tokenizer: "chars".into(),
            window: Some(100),
            reserve: 20,
            tools: size(30),
            system: size(60),
            sections: vec![],
            contexts: vec![],
            snapshot: size(0),
            messages: size(5),
            message_count: 1,
            total: size(95),
            dropped: None,
            deferred_tools: Size::default(),
        };
        let budget = Budget::default();
        let e = usage.check(&budget).unwrap_err();
        assert_eq!(e.code(), "context_overflow");
        assert!(e.to_string().contains("fixed part alone"), "{e}");
        assert!(e.to_string().contains("system 60"), "{e}");
        let fits = Usage {
            reserve: 5,
            ..usage.clone()
        };
        assert!(fits.check(&budget).is_ok());
        let unbounded = Usage {
            window: None,
            ..usage
        };
        assert!(unbounded.check(&budget).is_ok());
    }
}
