//! A step's two requests compared, measured and priced.

use super::difference::{common_prefix, differing_settings, first_differing_part};
use super::report::{signed, Counted, Difference, Figures, StepReplay, Tokens};
use super::run::{Entry, Group, Run};
use super::view::{Sent, View};
use crate::assembly::Assembly;
use crate::cache::{Block, Rules};
use crate::error::Result;
use crate::formats::replies::ProviderUsage;
use crate::formats::Format;
use crate::ledger::Pricing;
use crate::session::log::{Body, Recorded};
use crate::ErrorBody;

impl Run<'_> {
    /// Step `g`'s requests compared, measured and priced.
    pub(super) fn compare(
        &mut self,
        g: &Group,
        error: Option<ErrorBody>,
        assembly: Option<&Assembly>,
    ) -> Result<StepReplay> {
        let (step, reply, at_ms) = recorded_step(self.log, g);
        let usage = reply.and_then(|r| r.usage);
        let format = self.format;
        let rec = self.recorded.view()?;
        // While the logs agree, one side stands for both: the same request.
        let own = match &mut self.replayed {
            Some(side) => Some(side.view()?),
            None => None,
        };
        let shared = own.is_none();
        let cand = own.as_ref().unwrap_or(&rec);

        // Leading closed fragments equal on both sides stay equal: compared once.
        if !shared {
            verify(&mut self.verified, &rec, cand);
        }
        let first = match shared {
            true => None,
            false => first_differing_part(&rec, cand, self.verified),
        };
        let settings_differ = !shared && rec.settings != cand.settings;
        let differs = first.is_some() || settings_differ || error.is_some();
        let (mut rec_blocks, mut cand_blocks) = (
            std::mem::take(&mut self.buffers.0),
            std::mem::take(&mut self.buffers.1),
        );
        rec.blocks_into(&mut rec_blocks);
        if !shared {
            cand.blocks_into(&mut cand_blocks);
        }
        let first_difference = match first {
            Some(p) => {
                let before = bytes_before(&rec, &rec_blocks, p);
                let common = match (p < rec.len(), p < cand.len()) {
                    (true, true) => common_prefix(rec.part(p).text, cand.part(p).text),
                    _ => 0,
                };
                let label = cand
                    .label(p)
                    .or_else(|| rec.label(p))
                    .unwrap_or_else(|| "end".into());
                let (causes, plugin) = self.causes.of_part(&rec, cand, p, &label, assembly, format);
                Some(Difference {
                    offset: before + common as u64,
                    part: label,
                    plugin,
                    cause: causes.first().cloned().unwrap_or_default(),
                    causes,
                })
            }
            None if settings_differ => Some(settings_difference(&rec, cand, &cand_blocks)),
            None => None,
        };

        let reported = usage.and_then(|u| u.input_tokens);
        let (counted, rec_total, cand_total) = count(
            &mut self.per_byte,
            reported,
            shared,
            &mut rec_blocks,
            &mut cand_blocks,
        );
        let (rec_model, rec_key) = (rec.model.to_string(), rec.said());
        let (cand_model, cand_key) = (cand.model.to_string(), cand.said());
        // The views borrow the sides: no longer used from here on.
        let output = usage.and_then(|u| u.output_tokens).unwrap_or(0);
        let pricing = self.candidate.pricing;
        let sent = Sent {
            at_ms,
            output,
            pricing,
            format,
        };
        let recorded = self
            .recorded
            .serve(&rec_model, rec_key, &mut rec_blocks, sent);
        let candidate = match &mut self.replayed {
            Some(side) => side.serve(&cand_model, cand_key, &mut cand_blocks, sent),
            None => recorded.clone(),
        };
        self.buffers = (rec_blocks, cand_blocks);
        let reported = usage
            .filter(|u| u.input_tokens.is_some())
            .map(|u| reported_figures(&u, reply, &rec_model, pricing, format));
        Ok(StepReplay {
            step,
            differs,
            first_difference,
            error,
            tokens: Tokens {
                recorded: rec_total,
                candidate: cand_total,
                delta: signed(cand_total, rec_total),
                counted,
            },
            recorded,
            candidate,
            reported,
        })
    }
}

/// Step `g`'s number, the recorded reply that answered it, and when its request was sent.
fn recorded_step<'a>(log: &'a [Entry], g: &Group) -> (u64, Option<&'a Recorded>, u64) {
    let step = match &log[g.marker].body {
        Body::Step(m) => m.step,
        _ => 0,
    };
    let reply = g.reply.and_then(|r| match &log[r].body {
        Body::AssistantMessage(rec) => Some(rec),
        _ => None,
    });
    let at_ms = reply
        .and_then(|r| r.cache.as_ref())
        .map_or(log[g.marker].at_ms, |o| o.sent_at_ms);
    (step, reply, at_ms)
}

/// Counts the leading closed fragments equal on both sides from `verified` on.
fn verify(verified: &mut usize, rec: &View<'_>, cand: &View<'_>) {
    if let (Some(a), Some(b)) = (rec.closed, cand.closed) {
        while *verified < a.len().min(b.len()) && a[*verified] == b[*verified] {
            *verified += 1;
        }
    }
}

/// Bytes of a stream's first `n` parts: the blocks' (the model's part counts none there).
fn bytes_before(v: &View<'_>, blocks: &[Block], n: usize) -> u64 {
    let model = match v.part(0) {
        p if n > 0 && p.label == Some("model") => p.text.len() as u64,
        _ => 0,
    };
    blocks[..n.min(blocks.len())]
        .iter()
        .map(|b| b.tokens)
        .sum::<u64>()
        + model
}

/// The difference of requests that differ only in settings the stream does not hold.
fn settings_difference(rec: &View<'_>, cand: &View<'_>, cand_blocks: &[Block]) -> Difference {
    let cause = format!(
        "model settings differ (not read by the prompt cache): {}",
        differing_settings(rec.settings, cand.settings)
    );
    Difference {
        offset: bytes_before(cand, cand_blocks, cand.len()),
        part: "settings".into(),
        plugin: None,
        cause: cause.clone(),
        causes: vec![cause],
    }
}

/// Tokens: the recorded request scaled to what the provider `reported`, the candidate's
/// bytes at the same tokens per byte (`per_byte`, kept from the latest step with a count).
/// Scales both sides' blocks to them; returns how they were counted and both totals.
fn count(
    per_byte: &mut (u64, u64),
    reported: Option<u64>,
    shared: bool,
    rec_blocks: &mut [Block],
    cand_blocks: &mut Vec<Block>,
) -> (Counted, u64, u64) {
    let bytes = |b: &[Block]| b.iter().map(|x| x.tokens).sum::<u64>();
    let rec_bytes = bytes(rec_blocks);
    let counted = match reported {
        Some(t) if rec_bytes > 0 => {
            *per_byte = (t, rec_bytes);
            Counted::Provider
        }
        _ => Counted::Estimate,
    };
    let (num, den) = *per_byte;
    let at_rate = |b: u64| -> u64 {
        let t = (u128::from(b) * u128::from(num) + u128::from(den) / 2) / u128::from(den);
        u64::try_from(t).unwrap_or(u64::MAX)
    };
    let rec_total = match (counted, reported) {
        (Counted::Provider, Some(t)) => t,
        _ => at_rate(rec_bytes),
    };
    let same = shared || *rec_blocks == **cand_blocks;
    let cand_total = match same {
        true => rec_total,
        false => at_rate(bytes(cand_blocks)),
    };
    scale(rec_blocks, rec_total);
    if shared {
        // The recorded side's figures stand for both.
    } else if same {
        cand_blocks.clear();
        cand_blocks.extend_from_slice(rec_blocks);
    } else {
        scale(cand_blocks, cand_total);
    }
    (counted, rec_total, cand_total)
}

/// What the provider reported for a recorded reply, as [`Figures`].
fn reported_figures(
    usage: &ProviderUsage,
    reply: Option<&Recorded>,
    model: &str,
    pricing: Pricing<'_>,
    format: Format,
) -> Figures {
    let input = usage.input_tokens.unwrap_or(0);
    let read = usage.cached_tokens.unwrap_or(0).min(input);
    let written = usage.cache_write_tokens.unwrap_or(0).min(input - read);
    let written_1h = usage.cache_write_1h_tokens.unwrap_or(0).min(written);
    let outcome = reply.and_then(|r| r.cache.as_ref());
    let model = outcome
        .map(|o| o.model.as_str())
        .filter(|m| !m.is_empty())
        .unwrap_or(model);
    let format = outcome.map_or(format, |o| o.format);
    let cost = pricing.prices.get(model).and_then(|price| {
        Rules::of(format, model, pricing.rules).map(|rules| price.cost(&rules, usage, 0).total)
    });
    Figures {
        model: model.to_string(),
        read,
        written: written - written_1h,
        written_1h,
        uncached: input - read - written,
        cost,
    }
}

/// Scales `blocks`' tokens (bytes) in place so they add up to `total`, in proportion, each
/// block's share rounded down from the running sum and the last taking what rounding left.
fn scale(blocks: &mut [Block], total: u64) {
    let ours: u64 = blocks.iter().map(|b| b.tokens).sum();
    if ours == 0 || ours == total {
        return;
    }
    let per = total as f64 / ours as f64;
    let (mut seen, mut given) = (0u64, 0u64);
    for b in blocks.iter_mut() {
        seen += b.tokens;
        let end = ((seen as f64 * per) as u64).clamp(given, total);
        b.tokens = end - given;
        given = end;
    }
    if let Some(last) = blocks.last_mut() {
        last.tokens += total - given;
    }
}
