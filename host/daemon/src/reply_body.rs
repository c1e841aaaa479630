//! A response body written from [`Pieces`]: the session's kept fragments go to the socket as
//! shared buffers (hyper writes them with vectored writes), so a long session's 4 MB request
//! is not copied into one buffer per step (issue 31). Its length is known, so the response
//! carries `Content-Length` as one built whole would.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Bytes;
use http_body::{Frame, SizeHint};
use promptd_core::formats::pieces::{Piece, Pieces};

/// A kept fragment as bytes, without a copy.
struct Shared(Arc<str>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// The frames of one body, in order: a body written whole is its one frame, with no list.
pub struct PiecesBody {
    first: Option<Bytes>,
    frames: VecDeque<Bytes>,
    left: u64,
}

impl From<Pieces> for PiecesBody {
    fn from(pieces: Pieces) -> Self {
        let left = pieces.len() as u64;
        // Nothing shared (a body announced short, `Sink::reserve`): the buffer is the body.
        if !pieces.shares() {
            return Self {
                first: Some(Bytes::from(pieces.into_string())),
                frames: VecDeque::new(),
                left,
            };
        }
        let (small, pieces) = pieces.into_parts();
        let small = Bytes::from(small);
        let frames = pieces
            .into_iter()
            .map(|piece| match piece {
                Piece::Small(range) => small.slice(range),
                Piece::Shared(text) => Bytes::from_owner(Shared(text)),
                Piece::Owned(text) => Bytes::from(text),
            })
            .collect();
        Self {
            first: None,
            frames,
            left,
        }
    }
}

impl http_body::Body for PiecesBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let next = this.first.take().or_else(|| this.frames.pop_front());
        Poll::Ready(next.map(|bytes| {
            this.left -= bytes.len() as u64;
            Ok(Frame::data(bytes))
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.frames.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use promptd_core::formats::pieces::Sink;

    #[tokio::test]
    async fn the_frames_are_the_pieces_in_order_and_the_length_is_exact() {
        let big: Arc<str> = Arc::from("b".repeat(Pieces::WHOLE_BELOW));
        let mut pieces = Pieces::default();
        pieces.text("{\"request\":[");
        pieces.kept(&big);
        pieces.text(",");
        pieces.kept(&big);
        pieces.text("]}");
        let whole = pieces.clone().into_string();
        let body = PiecesBody::from(pieces);
        assert_eq!(
            body.frames.len(),
            5,
            "the shared pieces are frames of their own"
        );
        assert_eq!(
            http_body::Body::size_hint(&body).exact(),
            Some(whole.len() as u64)
        );
        let collected = axum::body::to_bytes(axum::body::Body::new(body), usize::MAX).await;
        assert_eq!(collected.ok().as_deref(), Some(whole.as_bytes()));
    }

    #[tokio::test]
    async fn a_short_body_is_one_frame() {
        let mut pieces = Pieces::default();
        pieces.text("{\"request\":");
        // As the transcript announces a body before writing it.
        pieces.reserve(Pieces::SHARE_FROM + 1);
        pieces.kept(&Arc::from("k".repeat(Pieces::SHARE_FROM)));
        pieces.text("}");
        let whole = pieces.clone().into_string();
        let body = PiecesBody::from(pieces);
        assert!(body.first.is_some() && body.frames.is_empty());
        let collected = axum::body::to_bytes(axum::body::Body::new(body), usize::MAX).await;
        assert_eq!(collected.ok().as_deref(), Some(whole.as_bytes()));
    }
}
