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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Size {
    pub chars: usize,
    pub tokens: usize,
}

impl Size {
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Part {
    pub name: String,
    #[serde(flatten)]
    pub size: Size,
}

/// What a step's request costs, returned beside it and recorded with the step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Usage {
    pub tokenizer: String,
    /// The agent's window in tokens, when it has a budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    /// Tokens kept free for the model's answer.
    pub reserve: u64,
    pub tools: Size,
    pub system: Size,
    pub sections: Vec<Part>,
    pub contexts: Vec<Part>,
    /// This step's runtime context snapshot (also counted in `messages` once appended).
    pub snapshot: Size,
    /// Every message of the request, this step's input and snapshot included.
    pub messages: Size,
    pub message_count: usize,
    /// tools + system + messages.
    pub total: Size,
    /// What this step left out of the history to fit (already taken off `messages`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped: Option<Dropped>,
}

/// Messages a step dropped from the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Dropped {
    pub messages: usize,
    #[serde(flatten)]
    pub size: Size,
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
    pub reserve: u64,
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
    pub tools: Size,
    pub system: Size,
}

impl Fixed {
    pub fn measure(
        counter: &dyn Counter,
        header: &crate::conversation::Header,
        format: crate::formats::Format,
        shown: Option<&[String]>,
    ) -> Self {
        let tools = crate::formats::tools_value(header, format, shown)
            .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
            .map(|t| Size::of(&t.to_string(), counter))
            .unwrap_or_default();
        Self {
            tools,
            system: Size::of(&header.system, counter),
        }
    }
}

/// Measures one request: the fixed parts from the header and assembly, the messages as
/// measured by the caller (the session keeps them summed as they are appended).
#[allow(clippy::too_many_arguments)]
pub fn usage(
    budget: &Budget,
    counter: &dyn Counter,
    header: &crate::conversation::Header,
    assembly: &crate::assembly::Assembly,
    format: crate::formats::Format,
    shown: Option<&[String]>,
    messages: Size,
    message_count: usize,
) -> Usage {
    let fixed = Fixed::measure(counter, header, format, shown);
    usage_with(budget, counter, fixed, assembly, messages, message_count)
}

/// [`usage`] with the fixed parts measured earlier ([`Fixed::measure`]).
pub fn usage_with(
    budget: &Budget,
    counter: &dyn Counter,
    fixed: Fixed,
    assembly: &crate::assembly::Assembly,
    messages: Size,
    message_count: usize,
) -> Usage {
    let Fixed { tools, system } = fixed;
    let parts = |list: &[(String, String)]| {
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
    }
}

#[cfg(test)]
mod tests {
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
