//! A body written as pieces in order rather than one contiguous buffer: the large fragments a
//! session keeps (a tool result, a long message, the system prompt and tools) are shared, not
//! copied, so an edge can hand them to the socket as they are (issue 31: a 4 MB body used to
//! be copied whole each step). Small text (separators, envelopes, short messages) goes into
//! one owned buffer that the pieces refer to by range.
//!
//! ```
//! use std::sync::Arc;
//! use promptd_core::formats::pieces::{Piece, Pieces, Sink};
//!
//! let big: Arc<str> = Arc::from("x".repeat(Pieces::SHARE_FROM));
//! let mut body = Pieces::default();
//! body.text("[");
//! body.kept(&big);
//! body.text("]");
//! assert_eq!(body.len(), Pieces::SHARE_FROM + 2);
//! let (small, pieces) = body.clone().into_parts();
//! assert_eq!(small, "[]");
//! assert!(matches!(&pieces[1], Piece::Shared(s) if Arc::ptr_eq(s, &big)));
//! assert_eq!(body.into_string(), format!("[{big}]"));
//! ```

use std::ops::Range;
use std::sync::Arc;

/// Where written text goes: a `String` copies everything, [`Pieces`] shares what is kept.
pub trait Sink {
    /// Appends text made for this body.
    fn text(&mut self, text: &str);
    /// Appends a fragment kept elsewhere (shared when large enough to be worth it).
    fn kept(&mut self, kept: &Arc<str>);
    /// Appends text made for this body and handed over (moved in, not copied, when large
    /// enough to be worth a piece of its own).
    fn made(&mut self, made: String) {
        self.text(&made);
    }
    /// Room for about `bytes` more (a body's size is known before it is written).
    fn reserve(&mut self, bytes: usize) {
        let _ = bytes;
    }
}

impl Sink for String {
    fn text(&mut self, text: &str) {
        self.push_str(text);
    }

    fn kept(&mut self, kept: &Arc<str>) {
        self.push_str(kept);
    }

    fn reserve(&mut self, bytes: usize) {
        String::reserve(self, bytes);
    }
}

/// One piece of a [`Pieces`] body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// A range of the owned small-text buffer.
    Small(Range<usize>),
    /// A kept fragment, shared.
    Shared(Arc<str>),
    /// Large text made for this body, handed over whole (the open turn holding a long
    /// message is not copied again into the small-text buffer).
    Owned(String),
}

/// A body as pieces in order; see the module's documentation.
#[derive(Clone, Debug)]
pub struct Pieces {
    small: String,
    pieces: Vec<Piece>,
    len: usize,
    /// Kept fragments this long or longer are shared ([`Pieces::SHARE_FROM`], or never in a
    /// body announced short by [`Sink::reserve`]).
    share_from: usize,
    /// Whether `share_from` was set by [`Pieces::sharing_from`] (an announced size leaves it).
    fixed: bool,
}

impl Default for Pieces {
    fn default() -> Self {
        Self {
            small: String::new(),
            pieces: Vec::new(),
            len: 0,
            share_from: Self::SHARE_FROM,
            fixed: false,
        }
    }
}

impl Pieces {
    /// The smallest kept fragment shared rather than copied: below it an extra piece (an I/O
    /// vector entry, a reference count) costs more than the copy.
    pub const SHARE_FROM: usize = 1024;

    /// Room kept beyond a body announced ([`Sink::reserve`]) for what a reply adds after it
    /// (a step's number and usage), so the buffer is not grown again for it.
    pub const TAIL: usize = 1024;

    /// A body announced ([`Sink::reserve`]) shorter than this is written whole into one
    /// buffer: the copy costs less than a piece per fragment (a short step's body is a few
    /// KiB).
    pub const WHOLE_BELOW: usize = 64 * 1024;

    /// A body that shares every kept fragment of `bytes` or more, whatever its size (the
    /// tests use it to write every shape of body in pieces).
    pub fn sharing_from(bytes: usize) -> Self {
        Self {
            share_from: bytes,
            fixed: true,
            ..Self::default()
        }
    }

    /// The body's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends what `write` appends to a `String` (text made for this body, written in
    /// place), and returns what it returns.
    pub fn text_with<R>(&mut self, write: impl FnOnce(&mut String) -> R) -> R {
        let start = self.small.len();
        let result = write(&mut self.small);
        let end = self.small.len();
        if end > start {
            self.len += end - start;
            match self.pieces.last_mut() {
                Some(Piece::Small(r)) if r.end == start => r.end = end,
                _ => self.pieces.push(Piece::Small(start..end)),
            }
        }
        result
    }

    /// The small-text buffer and the pieces in order (each `Small` range is of the buffer).
    pub fn into_parts(self) -> (String, Vec<Piece>) {
        (self.small, self.pieces)
    }

    /// Whether any piece is not of the small-text buffer (else that buffer is the whole
    /// body).
    pub fn shares(&self) -> bool {
        (self.pieces.iter()).any(|p| matches!(p, Piece::Shared(_) | Piece::Owned(_)))
    }

    /// The body in one string (for callers that want it whole, and tests); without a copy
    /// when nothing was shared.
    pub fn into_string(self) -> String {
        if !self.shares() {
            return self.small;
        }
        let mut out = String::with_capacity(self.len);
        for piece in &self.pieces {
            match piece {
                Piece::Small(r) => out.push_str(&self.small[r.clone()]),
                Piece::Shared(s) => out.push_str(s),
                Piece::Owned(s) => out.push_str(s),
            }
        }
        out
    }
}

impl Sink for Pieces {
    fn text(&mut self, text: &str) {
        self.text_with(|small| small.push_str(text));
    }

    fn kept(&mut self, kept: &Arc<str>) {
        if kept.len() < self.share_from {
            self.text(kept);
        } else {
            self.len += kept.len();
            self.pieces.push(Piece::Shared(kept.clone()));
        }
    }

    fn made(&mut self, made: String) {
        // A body announced short may still end with a long open turn (the announcement does
        // not count it): past the whole-body size it is handed over, not copied.
        if made.len() < self.share_from.min(Self::WHOLE_BELOW) {
            self.text(&made);
        } else {
            self.len += made.len();
            self.pieces.push(Piece::Owned(made));
        }
    }

    fn reserve(&mut self, bytes: usize) {
        if !self.fixed && self.len + bytes < Self::WHOLE_BELOW {
            self.share_from = usize::MAX;
            self.small.reserve(bytes + Self::TAIL);
        }
    }
}

impl std::fmt::Write for Pieces {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.text(s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_text_merges_and_large_fragments_are_shared_in_order() {
        let big: Arc<str> = Arc::from("b".repeat(Pieces::SHARE_FROM + 5));
        let little: Arc<str> = Arc::from("l");
        let mut p = Pieces::default();
        p.text("{");
        p.kept(&little);
        p.text("");
        p.kept(&big);
        p.text(",");
        p.kept(&big);
        p.text_with(|s| s.push('}'));
        let whole = format!("{{l{big},{big}}}");
        assert_eq!(p.len(), whole.len());
        let (small, pieces) = p.clone().into_parts();
        assert_eq!(small, "{l,}");
        assert_eq!(
            pieces,
            vec![
                Piece::Small(0..2),
                Piece::Shared(big.clone()),
                Piece::Small(2..3),
                Piece::Shared(big.clone()),
                Piece::Small(3..4),
            ]
        );
        assert_eq!(p.into_string(), whole);
    }

    #[test]
    fn a_body_announced_short_is_one_buffer() {
        let big: Arc<str> = Arc::from("b".repeat(Pieces::SHARE_FROM));
        let mut p = Pieces::default();
        p.reserve(Pieces::SHARE_FROM + 2);
        p.text("[");
        p.kept(&big);
        p.text("]");
        let (small, pieces) = p.clone().into_parts();
        assert_eq!(pieces, vec![Piece::Small(0..Pieces::SHARE_FROM + 2)]);
        assert_eq!(small, format!("[{big}]"));
        assert_eq!(p.into_string(), format!("[{big}]"));
        // Announced long, the same fragment is shared.
        let mut p = Pieces::default();
        p.reserve(Pieces::WHOLE_BELOW);
        p.kept(&big);
        assert!(matches!(&p.into_parts().1[0], Piece::Shared(_)));
    }

    #[test]
    fn a_string_sink_copies_everything() {
        let big: Arc<str> = Arc::from("b".repeat(2000));
        let mut s = String::new();
        s.text("[");
        s.kept(&big);
        s.text("]");
        assert_eq!(s, format!("[{big}]"));
    }
}
