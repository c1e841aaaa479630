//! A reply's cache outcome from the session (issue 29): the request the reply answers and the
//! session's previous replied request, as the cache model's blocks, with the usage the
//! provider reported for each; the prefix diff only when they differ.

use std::sync::Arc;

use super::*;
use crate::cache::outcome::{self, Change, Outcome, Seen};
use crate::cache::{Block, Rules, RulesConfig};
use crate::formats::replies::ProviderUsage;

/// The session's last replied request, as the next reply's outcome compares with it.
#[derive(Clone, Debug)]
pub(super) struct Replied {
    pub(super) step: u64,
    pub(super) format: Format,
    pub(super) at_ms: u64,
    pub(super) usage: ProviderUsage,
    /// Its blocks, when this process computed them (else rebuilt from the log on demand).
    pub(super) blocks: Option<Arc<[Block]>>,
}

/// The blocks of one format's head and kept fragments, so a reply hashes only what its step
/// added. A kept fragment never changes once made, so its address and length name it.
#[derive(Clone, Debug, Default)]
pub(super) struct BlockMemo {
    format: Option<Format>,
    /// The head's blocks (model, tools, system) and the model; dropped with the header.
    pub(super) head: Option<(Vec<Block>, String)>,
    /// Per list item: (address, length, block) when the item is a kept fragment.
    items: Vec<Option<(usize, usize, Block)>>,
}

/// What the state keeps for cache outcomes.
#[derive(Clone, Debug, Default)]
pub(super) struct Track {
    pub(super) memo: BlockMemo,
    /// The seq of the last step marker: a reply answers that step's request, which the state
    /// renders as long as nothing was appended after the marker.
    pub(super) step_seq: u64,
    /// History was dropped or compacted since the last replied request.
    pub(super) compacted: bool,
    pub(super) last: Option<Replied>,
}

impl SessionState {
    /// The cache outcome of a reply to the session's last step, sent in `format` at
    /// `sent_at_ms`, for which the provider reported `usage`; `None` when there is nothing to
    /// say (no step yet, the neutral format, no input count). `events` gives the log when a
    /// request must be rebuilt (a restart, a message after the marker, a changed prefix); it
    /// is called at most once. Returns the blocks of the request too: the caller hands them
    /// back with [`SessionState::remember_blocks`] once the reply is appended.
    pub fn cache_outcome(
        &mut self,
        format: Format,
        sent_at_ms: u64,
        usage: &ProviderUsage,
        rules: &RulesConfig,
        events: &mut dyn FnMut() -> Result<Vec<Event>>,
    ) -> Result<Option<(Outcome, Arc<[Block]>)>> {
        if format == Format::Neutral || usage.input_tokens.is_none() || self.steps == 0 {
            return Ok(None);
        }
        let n = self.steps;
        let mut log: Option<Vec<Event>> = None;
        let mut log_of = |log: &mut Option<Vec<Event>>| -> Result<()> {
            if log.is_none() {
                *log = Some(events()?);
            }
            Ok(())
        };
        let fast = if self.last_seq == self.cache.step_seq {
            self.fast_blocks(format)
        } else {
            None
        };
        let (now_blocks, model) = if let Some(fast) = fast {
            fast
        } else if self.last_seq == self.cache.step_seq {
            let body: serde_json::Value =
                serde_json::from_str(&self.render(format)?).map_err(|e| {
                    Error::Store(StoreError::Corrupt {
                        session: self.session.clone(),
                        seq: self.last_seq,
                        problem: format!("step {n}'s request does not render as JSON: {e}"),
                    })
                })?;
            let model = crate::formats::model_of_body(&body).to_string();
            (crate::cache::blocks_of_body(&body, format), model)
        } else {
            log_of(&mut log)?;
            let request = rebuild(&self.session, log.as_deref().unwrap_or(&[]), n)?;
            let model = crate::formats::model_of_body(&crate::formats::render(&request, format))
                .to_string();
            (crate::cache::blocks(&request, format), model)
        };
        // A gateway request's model is the client's.
        let model = match &self.gateway_model {
            Some(m) => m.clone(),
            None => model,
        };
        let Some(rules) = Rules::of(format, &model, rules) else {
            return Ok(None);
        };
        // OpenAI's retention is a model setting the header records (K11).
        let rules = match (&self.header, rules.family) {
            (Some((header, _)), crate::cache::Family::Automatic) => {
                let settings = crate::formats::settings(&header.model, format);
                let asked = settings
                    .get("prompt_cache_retention")
                    .and_then(|r| r.as_str());
                rules.asked(&model, asked)
            }
            _ => rules,
        };
        let prev = match self.cache.last.clone() {
            // A second reply to the same step (a retried call) is judged against the first.
            Some(p) if p.step <= n && p.format == format => {
                let blocks = match p.blocks {
                    Some(b) => b.to_vec(),
                    None => {
                        log_of(&mut log)?;
                        let request =
                            rebuild(&self.session, log.as_deref().unwrap_or(&[]), p.step)?;
                        crate::cache::blocks(&request, format)
                    }
                };
                Some((
                    p.step,
                    Seen {
                        at_ms: p.at_ms,
                        blocks,
                        usage: p.usage,
                    },
                ))
            }
            _ => None,
        };
        let now = Seen {
            at_ms: sent_at_ms,
            blocks: now_blocks,
            usage: *usage,
        };
        let session = self.session.clone();
        let change = || -> Option<Change> {
            let (m, _) = prev.as_ref()?;
            log_of(&mut log).ok()?;
            let events = log.as_deref()?;
            let before = rebuild(&session, events, *m).ok()?;
            let after = rebuild(&session, events, n).ok()?;
            let (from_a, from_b) = (
                provenance_at(&session, events, *m).ok()?,
                provenance_at(&session, events, n).ok()?,
            );
            let d = crate::prefix::diff(&before, from_a.as_ref(), &after, from_b.as_ref(), format);
            let part = d.first_divergence?.part;
            Some(Change {
                plugin: crate::prefix::culprit(&part, from_a.as_ref(), from_b.as_ref()),
                cause: d.causes.into_iter().next(),
                part,
            })
        };
        let mut outcome = outcome::classify(
            &rules,
            format,
            prev.as_ref().map(|(_, s)| s),
            &now,
            self.cache.compacted,
            change,
        );
        outcome.model = model;
        Ok(Some((outcome, now.blocks.into())))
    }

    /// The blocks of the last step's request in `format` from the head and the transcript's
    /// fragments, hashing only what the memo does not hold: the same blocks as
    /// [`crate::cache::blocks`] of the rebuilt request (a test checks it). `None` where the
    /// fragments are not one list item each (Responses joins a message's items) or history
    /// was left out (the body is then not the fragments joined).
    pub(super) fn fast_blocks(&mut self, format: Format) -> Option<(Vec<Block>, String)> {
        use std::borrow::Cow;
        if !matches!(format, Format::Openai | Format::Anthropic) || !self.dropped.is_empty() {
            return None;
        }
        let (header, _) = self.header.as_ref()?;
        self.transcript.activate(format).ok()?;
        let memo = &mut self.cache.memo;
        if memo.format != Some(format) {
            *memo = BlockMemo {
                format: Some(format),
                ..BlockMemo::default()
            };
        }
        if memo.head.is_none() {
            let head = serde_json::Value::Object(crate::formats::head(
                header,
                format,
                self.shown_tools.as_deref(),
            ));
            let model = head
                .get("model")
                .and_then(|m| m.as_str())
                .unwrap_or("")
                .to_string();
            memo.head = Some((crate::cache::blocks_of_body(&head, format), model));
        }
        let (mut blocks, model) = memo.head.clone()?;
        for (i, item) in self.transcript.list_items(header, format).enumerate() {
            let block = match &item {
                Cow::Borrowed(text) => {
                    let key = (text.as_ptr() as usize, text.len());
                    match memo.items.get(i) {
                        Some(Some((at, len, b))) if (*at, *len) == key => *b,
                        _ => {
                            let b = item_block(text);
                            if memo.items.len() <= i {
                                memo.items.resize(i + 1, None);
                            }
                            memo.items[i] = Some((key.0, key.1, b));
                            b
                        }
                    }
                }
                Cow::Owned(text) => item_block(text),
            };
            blocks.push(block);
        }
        Some((blocks, model))
    }

    /// What the kept blocks take, in bytes (the session cache counts it).
    pub(super) fn cache_bytes(&self) -> usize {
        self.cache
            .last
            .as_ref()
            .and_then(|l| l.blocks.as_ref())
            .map_or(0, |b| b.len() * std::mem::size_of::<Block>())
            + self.cache.memo.items.len() * std::mem::size_of::<Option<(usize, usize, Block)>>()
    }

    /// Keeps the blocks of the request the last recorded reply answered, so the next reply's
    /// outcome need not rebuild it.
    pub fn remember_blocks(&mut self, blocks: Arc<[Block]>) {
        if let Some(last) = &mut self.cache.last {
            last.blocks = Some(blocks);
        }
    }
}

/// One list item's block: its text as it is, or, when it carries a breakpoint, without it.
fn item_block(text: &str) -> Block {
    if text.contains("\"cache_control\"") {
        if let Ok(mut v) = serde_json::from_str::<serde_json::Value>(text) {
            let mark = crate::prefix::breakpoint(&v);
            crate::prefix::strip_cache_control(&mut v);
            return crate::cache::block_of("message", &v.to_string(), mark);
        }
    }
    crate::cache::block_of("message", text, None)
}
