//! One side of a replay: its session state, its requests as parts and blocks, its caches.

use serde_json::{Map, Value};

use super::report::Figures;
use super::scan::{marked_value, values_of};
use crate::cache::{self, Block, Cache, Rules, Ttl};
use crate::conversation::{FrozenRequest, Header};
use crate::error::Result;
use crate::formats::replies::ProviderUsage;
use crate::formats::{self, Format};
use crate::ledger::Pricing;
use crate::prefix::{self, Part};
use crate::session::{RequestView, SessionState};

/// One side of a replay: the session's state as that side's log builds it, what was worked
/// out of its requests so far (each closed fragment's values once), and its prompt caches
/// (one per model).
#[derive(Clone)]
pub(super) struct Side {
    pub(super) state: SessionState,
    pub(super) format: Format,
    pub(super) head: Option<HeadMemo>,
    /// Every closed fragment's values, in order.
    pub(super) items: Vec<Item>,
    /// Where each closed fragment's first value is in `items`.
    pub(super) fragment_starts: Vec<usize>,
    /// `items` as the cache model's blocks (bytes for tokens).
    pub(super) closed_blocks: Vec<Block>,
    /// The open end's values, worked out per step.
    pub(super) tail: Vec<Owned>,
    /// The request of what is kept, once history is left out, worked out per step.
    pub(super) kept: Option<Kept>,
    pub(super) caches: Vec<(String, Option<String>, Cache)>,
    pub(super) last_ms: u64,
}

/// The header's parts in one format, worked out once per header and tools shown.
#[derive(Clone)]
pub(super) struct HeadMemo {
    pub(super) header_seq: u64,
    pub(super) shown: Option<Vec<String>>,
    pub(super) parts: Vec<Owned>,
    /// `parts`, then `lead_items`, as blocks.
    pub(super) blocks: Vec<Block>,
    /// The body's settings (every key but the stream's), as JSON text.
    pub(super) settings: String,
    pub(super) model: String,
    pub(super) key: Option<String>,
    pub(super) retention: Option<String>,
    /// OpenAI's system message, the first of the list.
    pub(super) lead: String,
    pub(super) lead_items: Vec<Item>,
}

/// A request of what is kept, worked out whole.
#[derive(Clone)]
pub(super) struct Kept {
    pub(super) request: FrozenRequest,
    pub(super) parts: Vec<Owned>,
    pub(super) settings: String,
    pub(super) model: String,
    pub(super) key: Option<String>,
    pub(super) retention: Option<String>,
    pub(super) head: usize,
    pub(super) lead_from: usize,
}

/// One value of a fragment: where it is, its hash and breakpoint.
#[derive(Clone)]
pub(super) struct Item {
    pub(super) fragment: usize,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) hash: u64,
    /// When the value held a `cache_control`: its text without it, and the breakpoint.
    pub(super) marked: Option<(String, Option<Ttl>)>,
}

/// A part with its own text.
#[derive(Clone)]
pub(super) struct Owned {
    pub(super) label: String,
    pub(super) text: String,
    pub(super) hash: u64,
    pub(super) mark: Option<Ttl>,
}

impl Owned {
    pub(super) fn of((part, mark): (Part, Option<Ttl>)) -> Owned {
        Owned {
            hash: cache::fnv(part.text.as_bytes()),
            label: part.label,
            text: part.text,
            mark,
        }
    }

    pub(super) fn block(&self) -> Block {
        let tokens = if self.label == "model" {
            0
        } else {
            self.text.len() as u64
        };
        Block::new(self.hash, tokens, self.mark)
    }
}

/// One part of a request as the provider reads it.
#[derive(Clone, Copy)]
pub(super) struct PartRef<'a> {
    pub(super) text: &'a str,
    pub(super) hash: u64,
    pub(super) mark: Option<Ttl>,
    pub(super) label: Option<&'a str>,
}

/// One side's request at a step: the header's parts, the message list's values (borrowed from
/// the state's fragments and what was worked out of them), the open end.
pub(super) struct View<'a> {
    /// Spliced: model, tools, system; kept: every part.
    pub(super) head: &'a [Owned],
    pub(super) lead: &'a str,
    pub(super) lead_items: &'a [Item],
    pub(super) fragments: &'a [std::sync::Arc<str>],
    pub(super) items: &'a [Item],
    pub(super) fragment_starts: &'a [usize],
    pub(super) tail: &'a [Owned],
    /// Spliced: the blocks of `head` and `lead_items`.
    pub(super) head_blocks: &'a [Block],
    pub(super) closed_blocks: &'a [Block],
    pub(super) spliced: bool,
    /// Parts that come from the header (OpenAI's system message included).
    pub(super) header_parts: usize,
    /// Where the message list starts.
    pub(super) lead_from: usize,
    pub(super) settings: &'a str,
    pub(super) model: &'a str,
    pub(super) key: Option<&'a str>,
    /// OpenAI's `prompt_cache_retention`, when the body says.
    pub(super) retention: Option<&'a str>,
    pub(super) header: &'a Header,
    /// The seq of the `request/header` event that recorded `header`.
    pub(super) header_seq: u64,
    pub(super) shown: Option<&'a [String]>,
    pub(super) closed: Option<&'a [std::sync::Arc<str>]>,
    pub(super) provenance: Option<&'a crate::provenance::Provenance>,
    pub(super) snapshot: Option<&'a str>,
    pub(super) left_out: usize,
}

impl<'a> View<'a> {
    /// What the body says that routes and keeps it: `prompt_cache_key`, `prompt_cache_retention`.
    pub(super) fn said(&self) -> (Option<String>, Option<String>) {
        (
            self.key.map(str::to_string),
            self.retention.map(str::to_string),
        )
    }

    pub(super) fn len(&self) -> usize {
        self.head.len() + self.lead_items.len() + self.items.len() + self.tail.len()
    }

    /// The parts before the closed fragments' values.
    pub(super) fn pre(&self) -> usize {
        self.head.len() + self.lead_items.len()
    }

    /// How many values the first `fragments` closed fragments hold.
    pub(super) fn values_before(&self, fragments: usize) -> usize {
        self.fragment_starts
            .get(fragments)
            .copied()
            .unwrap_or(self.items.len())
    }

    pub(super) fn part(&self, i: usize) -> PartRef<'a> {
        let owned = |o: &'a Owned, label: bool| PartRef {
            text: &o.text,
            hash: o.hash,
            mark: o.mark,
            label: label.then_some(o.label.as_str()),
        };
        if let Some(o) = self.head.get(i) {
            return owned(o, true);
        }
        let i = i - self.head.len();
        if let Some(it) = self.lead_items.get(i) {
            return value_of(self.lead, it);
        }
        let i = i - self.lead_items.len();
        if let Some(it) = self.items.get(i) {
            return value_of(&self.fragments[it.fragment], it);
        }
        owned(&self.tail[i - self.items.len()], false)
    }

    pub(super) fn label(&self, i: usize) -> Option<String> {
        (i < self.len()).then(|| match self.part(i).label {
            Some(l) => l.to_string(),
            // The lead is Chat Completions' system message: the part `system` (Q16).
            None if i < self.lead_from => "system".to_string(),
            None => format!("message {}", i + 1 - self.lead_from),
        })
    }

    /// The cache model's blocks, into `out`: a hash and the bytes of each part (none for the
    /// model).
    pub(super) fn blocks_into(&self, out: &mut Vec<Block>) {
        out.clear();
        if self.spliced {
            out.extend_from_slice(self.head_blocks);
            out.extend_from_slice(self.closed_blocks);
        } else {
            out.extend(self.head.iter().map(Owned::block));
        }
        out.extend(self.tail.iter().map(Owned::block));
    }
}

/// The part a fragment's value stands for.
pub(super) fn value_of<'a>(fragment: &'a str, it: &'a Item) -> PartRef<'a> {
    let (text, mark) = match &it.marked {
        Some((stripped, mark)) => (stripped.as_str(), *mark),
        None => (&fragment[it.start..it.end], None),
    };
    PartRef {
        text,
        hash: it.hash,
        mark,
        label: None,
    }
}

pub(super) fn items_of(text: &str, fragment: usize, format: Format) -> Vec<Item> {
    values_of(text)
        .into_iter()
        .map(|(start, end)| {
            let value = &text[start..end];
            // Only a value holding a marker is read as JSON.
            let marker = match format {
                Format::Bedrock => "\"cachePoint\"",
                _ => "\"cache_control\"",
            };
            let marked = value
                .contains(marker)
                .then(|| marked_value(value, format))
                .flatten();
            let hash = match &marked {
                Some((stripped, _)) => cache::fnv(stripped.as_bytes()),
                None => cache::fnv(value.as_bytes()),
            };
            Item {
                fragment,
                start,
                end,
                hash,
                marked,
            }
        })
        .collect()
}

/// `body`'s settings: every key but those the provider's stream reads (Gemini's `config`
/// holds the system instruction and the tools beside the settings; Bedrock's `toolConfig` the
/// tools).
pub(super) fn settings_of(body: &Map<String, Value>, format: Format) -> String {
    let mut rest = body.clone();
    for key in [
        "tools",
        "system",
        "instructions",
        "toolConfig",
        formats::list_key(format),
    ] {
        rest.remove(key);
    }
    if let (Format::Gemini, Some(Value::Object(config))) = (format, rest.get_mut("config")) {
        config.remove("systemInstruction");
        config.remove("tools");
    }
    Value::Object(rest).to_string()
}

impl Side {
    pub(super) fn new(session: &str, format: Format) -> Side {
        Side {
            state: SessionState::new(session),
            format,
            head: None,
            items: Vec::new(),
            fragment_starts: Vec::new(),
            closed_blocks: Vec::new(),
            tail: Vec::new(),
            kept: None,
            caches: Vec::new(),
            last_ms: 0,
        }
    }

    /// The last step's request, from the state's fragments (each worked out once) while no
    /// history is left out, else rendered whole.
    pub(super) fn view(&mut self) -> Result<View<'_>> {
        let format = self.format;
        self.state.activate(format)?;
        let Side {
            state,
            head,
            items,
            fragment_starts,
            closed_blocks,
            tail,
            kept,
            ..
        } = self;
        let state: &SessionState = state;
        let header_seq = state.header_seq();
        match state.request_view(format)? {
            RequestView::Spliced {
                header,
                shown_tools,
                fragments,
            } => {
                let stale = head.as_ref().is_none_or(|h| {
                    h.header_seq != header_seq || h.shown.as_deref() != shown_tools
                });
                if stale {
                    *head = Some(HeadMemo::of(
                        header,
                        header_seq,
                        shown_tools,
                        fragments.lead.clone(),
                        format,
                    ));
                }
                let known = fragment_starts.len().min(fragments.closed.len());
                for (f, fragment) in fragments.closed.iter().enumerate().skip(known) {
                    fragment_starts.push(items.len());
                    for it in items_of(fragment, f, format) {
                        closed_blocks.push(block_of(value_of(fragment, &it)));
                        items.push(it);
                    }
                }
                open_end(tail, fragments.tail.as_deref(), format);
                let Some(head) = head.as_ref() else {
                    unreachable!("the head was just worked out")
                };
                Ok(View {
                    head: &head.parts,
                    lead: &head.lead,
                    lead_items: &head.lead_items,
                    fragments: fragments.closed,
                    items,
                    fragment_starts,
                    tail,
                    head_blocks: &head.blocks,
                    closed_blocks,
                    spliced: true,
                    header_parts: head.parts.len() + head.lead_items.len(),
                    lead_from: head.parts.len() + head.lead_items.len(),
                    settings: &head.settings,
                    model: &head.model,
                    key: head.key.as_deref(),
                    retention: head.retention.as_deref(),
                    header,
                    header_seq,
                    shown: shown_tools,
                    closed: Some(fragments.closed),
                    provenance: state.provenance(),
                    snapshot: state.snapshot_text(),
                    left_out: state.left_out(),
                })
            }
            RequestView::Kept(request) => {
                *kept = Some(Kept::of(request, format));
                let Some(k) = kept.as_ref() else {
                    unreachable!("just kept")
                };
                tail.clear();
                Ok(k.view(state, header_seq))
            }
        }
    }

    /// Feeds this side's cache model one request (blocks already scaled to tokens; the
    /// buffer is handed back for the next one) and says what it read, wrote and missed, and
    /// what that costs.
    pub(super) fn serve(
        &mut self,
        model: &str,
        (key, retention): (Option<String>, Option<String>),
        blocks: &mut Vec<Block>,
        sent: Sent<'_>,
    ) -> Figures {
        let Sent {
            at_ms,
            output,
            pricing,
            format,
        } = sent;
        // One cache per model and retention: entries kept under one retention are not
        // lengthened by requests under another (a header that changes it is rare).
        let at = match self
            .caches
            .iter()
            .position(|(m, r, _)| m == model && *r == retention)
        {
            Some(at) => at,
            None => match Rules::of(format, model, pricing.rules) {
                Some(rules) => {
                    let rules = rules.asked(model, retention.as_deref());
                    self.caches
                        .push((model.to_string(), retention, Cache::new(rules)));
                    self.caches.len() - 1
                }
                None => return Figures::default(),
            },
        };
        let at_ms = at_ms.max(self.last_ms);
        self.last_ms = at_ms;
        let total: u64 = blocks.iter().map(|b| b.tokens).sum();
        let request = cache::Request {
            at_ms,
            blocks: std::mem::take(blocks),
            key,
        };
        let cache = &mut self.caches[at].2;
        let served = cache.serve(&request);
        *blocks = request.blocks;
        let usage = ProviderUsage {
            input_tokens: Some(total),
            output_tokens: Some(output),
            cached_tokens: Some(served.read),
            cache_write_tokens: Some(served.written + served.written_1h),
            cache_write_1h_tokens: Some(served.written_1h),
        };
        let cost = pricing
            .prices
            .get(model)
            .map(|price| price.cost(cache.rules(), &usage, 0).total);
        Figures {
            model: model.to_string(),
            read: served.read,
            written: served.written,
            written_1h: served.written_1h,
            uncached: served.uncached,
            cost,
        }
    }
}

/// What a step's two requests share when each side's cache model serves its own: when it
/// was sent, the reply's output tokens, the prices and the format.
#[derive(Clone, Copy)]
pub(super) struct Sent<'a> {
    pub at_ms: u64,
    pub output: u64,
    pub pricing: Pricing<'a>,
    pub format: Format,
}

/// A part as the cache model's block.
pub(super) fn block_of(p: PartRef<'_>) -> Block {
    Block::new(p.hash, p.text.len() as u64, p.mark)
}

/// The string at `key` of a body.
pub(super) fn string_at(body: &Map<String, Value>, key: &str) -> Option<String> {
    body.get(key).and_then(Value::as_str).map(str::to_string)
}

impl HeadMemo {
    /// The header's parts in `format`, worked out for `header` (recorded at `header_seq`), the
    /// tools shown and the message list's `lead`.
    fn of(
        header: &Header,
        header_seq: u64,
        shown_tools: Option<&[String]>,
        lead: Option<String>,
        format: Format,
    ) -> HeadMemo {
        let map = formats::head(header, format, shown_tools);
        let parts: Vec<Owned> = prefix::marked_parts(&Value::Object(map.clone()), format)
            .into_iter()
            .map(Owned::of)
            .collect();
        let lead = lead.unwrap_or_default();
        let lead_items = items_of(&lead, 0, format);
        let mut blocks: Vec<Block> = parts.iter().map(Owned::block).collect();
        blocks.extend(lead_items.iter().map(|it| block_of(value_of(&lead, it))));
        HeadMemo {
            header_seq,
            shown: shown_tools.map(<[String]>::to_vec),
            parts,
            blocks,
            settings: settings_of(&map, format),
            model: string_at(&map, "model")
                .or_else(|| string_at(&map, "modelId"))
                .unwrap_or_default(),
            key: string_at(&map, "prompt_cache_key"),
            retention: string_at(&map, "prompt_cache_retention"),
            lead,
            lead_items,
        }
    }
}

/// The open end's values, worked out again into `tail` from the fragments' `open` text.
fn open_end(tail: &mut Vec<Owned>, open: Option<&str>, format: Format) {
    tail.clear();
    if let Some(t) = open {
        for (start, end) in values_of(t) {
            let (text, mark) = marked_value(&t[start..end], format)
                .unwrap_or_else(|| (t[start..end].to_string(), None));
            tail.push(Owned {
                label: String::new(),
                hash: cache::fnv(text.as_bytes()),
                text,
                mark,
            });
        }
    }
}

impl Kept {
    /// `request`, rendered whole in `format`, as parts.
    fn of(request: FrozenRequest, format: Format) -> Kept {
        let body = formats::render(&request, format);
        let map = body.as_object().cloned().unwrap_or_default();
        let parts: Vec<Owned> = prefix::marked_parts(&body, format)
            .into_iter()
            .map(Owned::of)
            .collect();
        let lead_from = parts
            .iter()
            .position(|p| p.label.starts_with("message"))
            .unwrap_or(parts.len());
        Kept {
            settings: settings_of(&map, format),
            model: string_at(&map, "model")
                .or_else(|| string_at(&map, "modelId"))
                .unwrap_or_default(),
            key: string_at(&map, "prompt_cache_key"),
            retention: string_at(&map, "prompt_cache_retention"),
            head: lead_from,
            lead_from,
            parts,
            request,
        }
    }

    /// The request as a view: every part its own, none from fragments.
    fn view<'a>(&'a self, state: &'a SessionState, header_seq: u64) -> View<'a> {
        View {
            head: &self.parts,
            lead: "",
            lead_items: &[],
            fragments: &[],
            items: &[],
            fragment_starts: &[],
            tail: &[],
            head_blocks: &[],
            closed_blocks: &[],
            spliced: false,
            header_parts: self.head,
            lead_from: self.lead_from,
            settings: &self.settings,
            model: &self.model,
            key: self.key.as_deref(),
            retention: self.retention.as_deref(),
            header: &self.request.header,
            header_seq,
            shown: self.request.shown_tools.as_deref(),
            closed: None,
            provenance: state.provenance(),
            snapshot: state.snapshot_text(),
            left_out: state.left_out(),
        }
    }
}
