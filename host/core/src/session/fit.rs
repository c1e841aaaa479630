//! Measuring a step's request against the agent's budget, and trimming the history to fit
//! (Q14).

use super::*;

/// Each message's size by one counter, and the sum of those kept.
#[derive(Clone, Debug, Default)]
pub(super) struct Measured {
    pub(super) counter: String,
    pub(super) sizes: Vec<crate::budget::Size>,
    pub(super) kept: crate::budget::Size,
    pub(super) kept_count: usize,
    /// How many messages were dropped when `kept` was summed.
    pub(super) dropped: usize,
}

/// What a message costs a budget: its neutral JSON, with each image and document counted by
/// [`crate::conversation::content::measure`] (the provider's image rule, or an estimate) instead of its
/// base64 text.
pub fn message_size(
    message: &Message,
    counter: &dyn crate::budget::Counter,
) -> crate::budget::Size {
    use crate::budget::Size;
    use crate::conversation::content::{measure, Block, Content, Measure, MeasureRules};
    let (Message::User {
        content: Content::Blocks(blocks),
        ..
    }
    | Message::Tool {
        content: Content::Blocks(blocks),
        ..
    }) = message
    else {
        return Size::of(&crate::formats::neutral_text(message), counter);
    };
    let rules = MeasureRules::default();
    let mut media = 0usize;
    let mut bare = message.clone();
    if let Message::User {
        content: Content::Blocks(b),
        ..
    }
    | Message::Tool {
        content: Content::Blocks(b),
        ..
    } = &mut bare
    {
        for (block, original) in b.iter_mut().zip(blocks) {
            if let Measure::Tokens { tokens, .. } = measure(original, &rules) {
                media += tokens as usize;
            }
            match block {
                Block::Image { data, url, .. } | Block::Document { data, url, .. } => {
                    *data = None;
                    *url = None;
                }
                Block::Text { .. } => {}
            }
        }
    }
    let mut size = Size::of(&crate::formats::neutral_text(&bare), counter);
    size.tokens += media;
    size
}

impl SessionState {
    /// The size of every kept message so far plus `new` (a step's input and snapshot), by
    /// `counter`; and how many there are. Messages are measured as their neutral JSON, each
    /// once, and the kept ones are summed as they come (re-summed only after a trim).
    pub fn measure_messages(
        &mut self,
        counter: &dyn crate::budget::Counter,
        new: &[&Message],
    ) -> (crate::budget::Size, usize) {
        use crate::budget::Size;
        self.measure(counter);
        let (mut total, mut count) = match &self.measured {
            Some(m) => (m.kept, m.kept_count),
            None => (Size::default(), 0),
        };
        for summary in self.summaries.values() {
            let m = Message::user(summary.clone());
            total += Size::of(&crate::formats::neutral_text(&m), counter);
            count += 1;
        }
        for m in new {
            total += message_size(m, counter);
        }
        (total, count + new.len())
    }

    /// Measures the messages not measured yet by `counter` (all of them for a new counter).
    pub(super) fn measure(&mut self, counter: &dyn crate::budget::Counter) {
        use crate::budget::Size;
        let fragments = self.transcript.neutral();
        let mut m = match self.measured.take() {
            Some(m) if m.counter == counter.name() && m.sizes.len() <= fragments.len() => m,
            _ => Measured {
                counter: counter.name().to_string(),
                ..Measured::default()
            },
        };
        if m.dropped != self.dropped.len() {
            // A trim or compaction since: sum the kept ones again (rare).
            m.kept = Size::default();
            m.kept_count = 0;
            for (i, size) in m.sizes.iter().enumerate() {
                if !self.dropped.contains(&i) {
                    m.kept += *size;
                    m.kept_count += 1;
                }
            }
            m.dropped = self.dropped.len();
        }
        for (i, fragment) in fragments.iter().enumerate().skip(m.sizes.len()) {
            // Only messages with media need decoding: their data is not text.
            let size = if fragment.contains("\"media_type\"") || fragment.contains("\"url\"") {
                serde_json::from_str::<Message>(fragment)
                    .map(|msg| message_size(&msg, counter))
                    .unwrap_or_else(|_| Size::of(fragment, counter))
            } else {
                Size::of(fragment, counter)
            };
            m.sizes.push(size);
            if !self.dropped.contains(&i) {
                m.kept += size;
                m.kept_count += 1;
            }
        }
        self.measured = Some(m);
    }

    /// Measures the request a step will send — this state, the step's `new` messages and
    /// snapshot, in `format` — and, when its messages do not fit what `budget` leaves them,
    /// trims the history by [`SessionState::trim`]: returns the usage (less what was dropped)
    /// and the `history/dropped` event to append. Whether it then fits is
    /// [`crate::budget::Usage::check`]'s to say.
    pub fn fit(
        &mut self,
        budget: &crate::budget::Budget,
        counter: &dyn crate::budget::Counter,
        header: Option<&Header>,
        assembly: &Assembly,
        format: crate::formats::Format,
        new: &[&Message],
    ) -> (crate::budget::Usage, Option<Body>) {
        let (measured, count) = self.measure_messages(counter, new);
        let fixed = self.fixed(counter, header, format, assembly.shown_tools.as_deref());
        let mut usage = crate::budget::usage_with(
            budget,
            counter,
            fixed,
            assembly,
            crate::budget::Measured {
                size: measured,
                count,
            },
        );
        let fixed = usage.tools.tokens + usage.system.tokens + budget.reserve as usize;
        let room = match (budget.window.map(|w| w as usize), budget.history_max) {
            (Some(w), cap) if fixed <= w => {
                Some(cap.map_or(w - fixed, |c| (w - fixed).min(c as usize)))
            }
            (None, Some(cap)) => Some(cap as usize),
            _ => None,
        };
        let Some(room) = room.filter(|room| usage.messages.tokens > *room) else {
            return (usage, None);
        };
        match self.trim(counter, new, room, budget.keep_turns) {
            Ok((seqs, size)) if !seqs.is_empty() => {
                usage.leave_out(seqs.len(), size);
                (usage, Some(Body::HistoryDropped(log::Dropped { seqs })))
            }
            _ => (usage, None),
        }
    }

    /// The fixed parts' measure for `header`, remembered while it is the session's header.
    /// `header` is a new header (measured once, before it is recorded), or `None` for the
    /// recorded one.
    pub(super) fn fixed(
        &mut self,
        counter: &dyn crate::budget::Counter,
        header: Option<&Header>,
        format: Format,
        shown: Option<&[String]>,
    ) -> crate::budget::Fixed {
        let recorded = match (header, &self.header) {
            (Some(new), _) => return crate::budget::Fixed::measure(counter, new, format, shown),
            (None, Some((h, _))) => h,
            (None, None) => {
                return crate::budget::Fixed::measure(counter, &Header::default(), format, shown)
            }
        };
        let measure = || crate::budget::Fixed::measure(counter, recorded, format, shown);
        let known = self
            .memo
            .fixed
            .iter()
            .find(|(f, t, s, _)| *f == format && t == counter.name() && s.as_deref() == shown);
        if let Some((_, _, _, fixed)) = known {
            return *fixed;
        }
        let fixed = measure();
        let key = (
            format,
            counter.name().to_string(),
            shown.map(<[String]>::to_vec),
        );
        remember(&mut self.memo.fixed, (key.0, key.1, key.2, fixed));
        fixed
    }

    /// Which earlier messages to leave out so the messages fit in `room` tokens (Q14): never
    /// the session's first user message (the goal), nor the latest `keep_turns` turns (a turn
    /// starts at a user message), nor the active snapshot; an assistant message and the tool
    /// results after it go together; older snapshots go first, then the oldest units. `new`
    /// is this step's input (always kept). Returns the seqs to drop (empty: it already fits),
    /// or the tokens still over when even that is not enough.
    pub fn trim(
        &mut self,
        counter: &dyn crate::budget::Counter,
        new: &[&Message],
        room: usize,
        keep_turns: usize,
    ) -> std::result::Result<(Vec<u64>, crate::budget::Size), usize> {
        let (total, _) = self.measure_messages(counter, new);
        let mut over = total.tokens.saturating_sub(room);
        if over == 0 {
            return Ok((Vec::new(), crate::budget::Size::default()));
        }
        self.measure(counter);
        let sizes = match &self.measured {
            Some(m) => &m.sizes,
            None => return Err(over),
        };
        let n = self.roles.len();
        let mut protected = vec![false; n];
        if let Some(goal) = self.roles.iter().position(|(_, r)| *r == Role::User) {
            protected[goal] = true;
        }
        // The latest `keep_turns` turns, counting this step's user messages first.
        let new_turns = new.iter().filter(|m| role(m) == Role::User).count();
        let mut turns = keep_turns.saturating_sub(new_turns);
        for i in (0..n).rev() {
            if turns == 0 {
                break;
            }
            protected[i] = true;
            if self.roles[i].1 == Role::User {
                turns -= 1;
            }
        }
        let new_snapshot = new.iter().any(|m| m.is_snapshot());
        if !new_snapshot {
            if let Some(last) = self.roles.iter().rposition(|(_, r)| *r == Role::Snapshot) {
                protected[last] = true;
            }
        }
        // Units: a message and the tool results right after it.
        let mut units: Vec<(usize, usize)> = Vec::new();
        for (i, (_, r)) in self.roles.iter().enumerate() {
            match (r, units.last_mut()) {
                (Role::Tool, Some((_, end))) if *end == i => *end = i + 1,
                _ => units.push((i, i + 1)),
            }
        }
        let droppable = |&(start, end): &(usize, usize)| {
            (start..end).all(|i| !protected[i] && !self.dropped.contains(&i))
        };
        let snapshots = units
            .iter()
            .filter(|(s, _)| self.roles[*s].1 == Role::Snapshot)
            .filter(|u| droppable(u));
        let others = units
            .iter()
            .filter(|(s, _)| self.roles[*s].1 != Role::Snapshot)
            .filter(|u| droppable(u));
        let mut drop = Vec::new();
        let mut dropped = crate::budget::Size::default();
        for &(start, end) in snapshots.chain(others) {
            if over == 0 {
                break;
            }
            for size in &sizes[start..end] {
                dropped += *size;
                over = over.saturating_sub(size.tokens);
            }
            drop.extend(start..end);
        }
        if over > 0 {
            return Err(over);
        }
        drop.sort_unstable();
        Ok((drop.into_iter().map(|i| self.roles[i].0).collect(), dropped))
    }
}
