//! A message's content: one text (the shape of 0.1.0, still accepted and stored byte for byte)
//! or a list of typed blocks — text, image (base64 with its media type, or a URL) and document
//! (a PDF, base64 or URL). Checked against [`ContentLimits`] when it arrives, measured for
//! budgets by [`measure`].
//!
//! ```
//! use promptd_core::conversation::content::Content;
//! let text: Content = serde_json::from_str(r#""hello""#).unwrap();
//! assert_eq!(serde_json::to_string(&text).unwrap(), r#""hello""#);
//! let blocks: Content = serde_json::from_str(
//!     r#"[{"type": "text", "text": "see"}, {"type": "image", "url": "https://x/a.png"}]"#,
//! ).unwrap();
//! assert_eq!(blocks.text(), "see");
//! ```

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};

/// The content of a user message or a tool result.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// A list of text, image and document blocks.
    Blocks(Vec<Block>),
}

/// One block of [`Content::Blocks`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum Block {
    /// A text block.
    Text {
        /// The text.
        text: String,
    },
    /// Base64 `data` with its `media_type`, or a `url`.
    Image {
        /// The image's media type, with `data`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        media_type: Option<String>,
        /// The image as base64.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<String>,
        /// The image's URL, instead of `data`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        url: Option<String>,
    },
    /// A PDF: base64 `data` (media type `application/pdf`) or a `url`; `name` is shown to the
    /// model where the format has a place for it.
    Document {
        /// The document's media type, with `data` (`application/pdf`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        media_type: Option<String>,
        /// The document as base64.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<String>,
        /// The document's URL, instead of `data`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        url: Option<String>,
        /// The document's name, for formats that have a place for it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        match Value::deserialize(d)? {
            Value::String(text) => Ok(Content::Text(text)),
            blocks @ Value::Array(_) => serde_json::from_value(blocks)
                .map(Content::Blocks)
                .map_err(|e| D::Error::custom(format!("content block: {e}"))),
            _ => Err(D::Error::custom(
                "content must be a string or a list of blocks",
            )),
        }
    }
}

impl From<String> for Content {
    fn from(text: String) -> Self {
        Content::Text(text)
    }
}

impl From<&str> for Content {
    fn from(text: &str) -> Self {
        Content::Text(text.to_string())
    }
}

impl Default for Content {
    fn default() -> Self {
        Content::Text(String::new())
    }
}

impl Content {
    /// The text blocks, joined (the whole text of a [`Content::Text`]).
    pub fn text(&self) -> String {
        match self {
            Content::Text(text) => text.clone(),
            Content::Blocks(blocks) => blocks
                .iter()
                .filter_map(|b| match b {
                    Block::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// Whether there is nothing for the model to read or see: no non-blank text, no media.
    pub fn is_blank(&self) -> bool {
        match self {
            Content::Text(text) => text.trim().is_empty(),
            Content::Blocks(blocks) => blocks.iter().all(|b| match b {
                Block::Text { text } => text.trim().is_empty(),
                _ => false,
            }),
        }
    }

    /// The blocks; none for plain text.
    pub fn blocks(&self) -> &[Block] {
        match self {
            Content::Text(_) => &[],
            Content::Blocks(blocks) => blocks,
        }
    }

    /// Checks every block against `limits` (and the rules of its type).
    pub fn check(&self, limits: &ContentLimits) -> Result<()> {
        for (i, block) in self.blocks().iter().enumerate() {
            block.check(limits).map_err(|cause| Error::InvalidBlock {
                index: i,
                kind: block.kind(),
                cause,
            })?;
        }
        Ok(())
    }
}

/// Media types the providers take.
pub const IMAGE_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];
/// Document media types the providers take.
pub const DOCUMENT_TYPES: [&str; 1] = ["application/pdf"];

/// How large a block may be (`[limits] max_block_kb`, of the base64 text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentLimits {
    /// The largest base64 text of one block, in bytes.
    pub max_block_bytes: usize,
}

impl Default for ContentLimits {
    fn default() -> Self {
        Self {
            max_block_bytes: (crate::limits::defaults::MAX_BLOCK_KB << 10) as usize,
        }
    }
}

impl Block {
    /// The block's type as written: `text`, `image`, `document`.
    pub fn kind(&self) -> &'static str {
        match self {
            Block::Text { .. } => "text",
            Block::Image { .. } => "image",
            Block::Document { .. } => "document",
        }
    }

    fn check(&self, limits: &ContentLimits) -> std::result::Result<(), String> {
        let (media_type, data, url, allowed) = match self {
            Block::Text { .. } => return Ok(()),
            Block::Image {
                media_type,
                data,
                url,
            } => (media_type, data, url, &IMAGE_TYPES[..]),
            Block::Document {
                media_type,
                data,
                url,
                ..
            } => (media_type, data, url, &DOCUMENT_TYPES[..]),
        };
        match (data, url) {
            (Some(data), None) => {
                let media_type = media_type
                    .as_deref()
                    .ok_or("base64 `data` needs its `media_type`")?;
                if !allowed.contains(&media_type) {
                    return Err(format!(
                        "media type `{media_type}` is not one of {}",
                        allowed.join(", ")
                    ));
                }
                if data.len() > limits.max_block_bytes {
                    return Err(format!(
                        "{} KiB of data, over the limit of {} KiB (limits.max_block_kb)",
                        data.len().div_ceil(1024),
                        limits.max_block_bytes >> 10
                    ));
                }
                base64_decode(data).ok_or("`data` is not valid base64")?;
                Ok(())
            }
            (None, Some(url)) => {
                if media_type.is_some() {
                    return Err("a `url` block has no `media_type` (the server says it)".into());
                }
                if !(url.starts_with("https://") || url.starts_with("http://")) {
                    return Err("`url` must be an http(s) URL".into());
                }
                if url.len() > 8192 {
                    return Err("`url` is longer than 8192 bytes".into());
                }
                Ok(())
            }
            _ => Err("give either base64 `data` (with `media_type`) or a `url`".into()),
        }
    }

    /// `data:MEDIA;base64,DATA`, for formats that take media as URLs.
    pub fn data_url(&self) -> Option<String> {
        match self {
            Block::Image {
                media_type: Some(m),
                data: Some(d),
                ..
            }
            | Block::Document {
                media_type: Some(m),
                data: Some(d),
                ..
            } => Some(format!("data:{m};base64,{d}")),
            _ => None,
        }
    }
}

/// Decodes standard base64 (padding optional); `None` if it is not base64.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.trim_end_matches('=').as_bytes();
    if text.len() - bytes.len() > 2 || bytes.len() % 4 == 1 {
        return None;
    }
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        let take = chunk.len() - 1;
        out.extend_from_slice(&n.to_be_bytes()[1..1 + take]);
    }
    Some(out)
}

/// How a block counts toward a context budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// Text: its characters.
    Chars(usize),
    /// Media: estimated tokens, and whether from the image's own size (else the estimate).
    Tokens {
        /// The estimated tokens.
        tokens: u64,
        /// Whether the estimate comes from the image's own width and height.
        from_dimensions: bool,
    },
}

/// Estimates for what cannot be counted from the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeasureRules {
    /// An image whose size cannot be read (a URL, an unknown header): Anthropic's largest
    /// image costs about 1,600 tokens.
    pub image_tokens: u64,
    /// Per PDF page (Anthropic documents 1,500–3,000 text tokens per page, plus the image).
    pub document_tokens_per_page: u64,
}

impl Default for MeasureRules {
    fn default() -> Self {
        Self {
            image_tokens: 1600,
            document_tokens_per_page: 3000,
        }
    }
}

/// What `block` costs: text by its characters; an image by Anthropic's documented rule
/// (width × height / 750 after scaling to at most 1568 px on the long edge and 1.15
/// megapixels) when its header gives the size, else `rules.image_tokens`; a PDF by its pages.
pub fn measure(block: &Block, rules: &MeasureRules) -> Measure {
    match block {
        Block::Text { text } => Measure::Chars(text.chars().count()),
        Block::Image { data, .. } => {
            let size = data
                .as_deref()
                .and_then(base64_decode)
                .and_then(|b| image_size(&b));
            match size {
                Some((w, h)) => Measure::Tokens {
                    tokens: image_tokens(w, h),
                    from_dimensions: true,
                },
                None => Measure::Tokens {
                    tokens: rules.image_tokens,
                    from_dimensions: false,
                },
            }
        }
        Block::Document { data, .. } => {
            let pages = data
                .as_deref()
                .and_then(base64_decode)
                .map(|pdf| pdf_pages(&pdf));
            Measure::Tokens {
                tokens: pages.unwrap_or(1).max(1) * rules.document_tokens_per_page,
                from_dimensions: pages.is_some(),
            }
        }
    }
}

fn image_tokens(w: u32, h: u32) -> u64 {
    let (mut w, mut h) = (w as f64, h as f64);
    let long = w.max(h);
    if long > 1568.0 {
        (w, h) = (w * 1568.0 / long, h * 1568.0 / long);
    }
    let area = w * h;
    if area > 1_150_000.0 {
        let k = (1_150_000.0 / area).sqrt();
        (w, h) = (w * k, h * k);
    }
    ((w * h) / 750.0).ceil().max(1.0) as u64
}

/// Width and height from a PNG, GIF or JPEG header.
fn image_size(b: &[u8]) -> Option<(u32, u32)> {
    let be32 = |i: usize| Some(u32::from_be_bytes(b.get(i..i + 4)?.try_into().ok()?));
    let le16 = |i: usize| Some(u16::from_le_bytes(b.get(i..i + 2)?.try_into().ok()?) as u32);
    let be16 = |i: usize| Some(u16::from_be_bytes(b.get(i..i + 2)?.try_into().ok()?) as u32);
    if b.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Some((be32(16)?, be32(20)?));
    }
    if b.starts_with(b"GIF8") {
        return Some((le16(6)?, le16(8)?));
    }
    if b.starts_with(&[0xFF, 0xD8]) {
        let mut i = 2;
        while i + 9 < b.len() {
            if b[i] != 0xFF {
                return None;
            }
            let marker = b[i + 1];
            let len = be16(i + 2)? as usize;
            if matches!(marker, 0xC0..=0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF) {
                return Some((be16(i + 7)?, be16(i + 5)?));
            }
            i += 2 + len;
        }
    }
    None
}

/// Page objects in a PDF (`/Type /Page`, not `/Pages`); 0 when they are compressed away.
fn pdf_pages(pdf: &[u8]) -> u64 {
    let mut count = 0;
    for pattern in [&b"/Type /Page"[..], b"/Type/Page"] {
        let mut i = 0;
        while let Some(at) = pdf[i..].windows(pattern.len()).position(|w| w == pattern) {
            let end = i + at + pattern.len();
            if pdf.get(end) != Some(&b's') {
                count += 1;
            }
            i = end;
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3x2 PNG's first 24 bytes (signature, IHDR length and type, width, height).
    const PNG_3X2: &str = "iVBORw0KGgoAAAANSUhEUgAAAAMAAAACCAYAAACddGYaAAAAE0lEQVR4nGP8z8Dwn4GBgZGBAQAYEAL/6k9J5wAAAABJRU5ErkJggg==";

    fn image(data: &str, media_type: &str) -> Block {
        Block::Image {
            media_type: Some(media_type.into()),
            data: Some(data.into()),
            url: None,
        }
    }

    #[test]
    fn strings_stay_strings_and_blocks_round_trip() {
        for text in [r#""plain""#, r#""""#] {
            let c: Content = serde_json::from_str(text).unwrap();
            assert_eq!(serde_json::to_string(&c).unwrap(), text);
        }
        let json = r#"[{"type":"text","text":"a"},{"data":"QQ==","media_type":"image/png","type":"image"},{"name":"s.pdf","type":"document","url":"https://x/s.pdf"}]"#;
        let c: Content = serde_json::from_str(json).unwrap();
        let back: Value = serde_json::to_value(&c).unwrap();
        assert_eq!(back, serde_json::from_str::<Value>(json).unwrap());
        let unknown = r#"[{"type":"audio","data":"x"}]"#;
        let e = serde_json::from_str::<Content>(unknown).unwrap_err();
        assert!(e.to_string().contains("audio"), "{e}");
        assert!(serde_json::from_str::<Content>("3").is_err());
    }

    #[test]
    fn blocks_are_checked_for_type_encoding_and_size() {
        let limits = ContentLimits {
            max_block_bytes: 200,
        };
        let check = |b: Block| Content::Blocks(vec![b]).check(&limits);
        assert!(check(image(PNG_3X2, "image/png")).is_ok());
        let e = check(image(PNG_3X2, "image/bmp")).unwrap_err();
        assert_eq!(e.code(), "invalid_block");
        assert!(e.to_string().contains("image/bmp"), "{e}");
        assert!(check(image("not base64!", "image/png"))
            .unwrap_err()
            .to_string()
            .contains("base64"));
        let big = "A".repeat(400);
        assert!(check(image(&big, "image/png"))
            .unwrap_err()
            .to_string()
            .contains("limits.max_block_kb"));
        let both = Block::Image {
            media_type: Some("image/png".into()),
            data: Some("QQ==".into()),
            url: Some("https://x".into()),
        };
        assert!(check(both).is_err());
        let doc = Block::Document {
            media_type: Some("application/pdf".into()),
            data: Some("JVBERi0=".into()),
            url: None,
            name: None,
        };
        assert!(check(doc).is_ok());
    }

    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(base64_decode("QQ==").unwrap(), b"A");
        assert_eq!(base64_decode("QUI").unwrap(), b"AB");
        assert_eq!(base64_decode("QUJD").unwrap(), b"ABC");
        assert!(base64_decode("Q").is_none());
        assert!(base64_decode("QU?D").is_none());
    }

    #[test]
    fn media_is_measured_from_its_size_or_estimated() {
        let rules = MeasureRules::default();
        assert_eq!(
            measure(&image(PNG_3X2, "image/png"), &rules),
            Measure::Tokens {
                tokens: 1,
                from_dimensions: true
            }
        );
        assert_eq!(image_tokens(1000, 1000), 1334);
        assert_eq!(image_tokens(4000, 3000), 1534, "scaled to 1.15 MP first");
        let url = Block::Image {
            media_type: None,
            data: None,
            url: Some("https://x/a.png".into()),
        };
        assert_eq!(
            measure(&url, &rules),
            Measure::Tokens {
                tokens: 1600,
                from_dimensions: false
            }
        );
        assert_eq!(
            pdf_pages(b"<< /Type /Pages >> << /Type /Page >> <</Type/Page>>"),
            2
        );
        assert_eq!(
            measure(
                &Block::Text {
                    text: "héllo".into()
                },
                &rules
            ),
            Measure::Chars(5)
        );
    }
}
