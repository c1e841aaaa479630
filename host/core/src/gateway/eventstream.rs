//! The AWS event-stream binary framing Bedrock's `converse-stream` answers in (G5): each
//! frame is a prelude (total length and headers length, u32 big-endian, then the prelude's
//! CRC32), its headers, its payload and the CRC32 of all before it. Both CRCs are checked as
//! frames are read: a frame that fails one makes the stream invalid, named by its place.

/// The largest frame taken: AWS's own limit on an event-stream message (16 MiB).
pub const MAX_FRAME: usize = 16 << 20;
/// Prelude (12) and message CRC (4).
const OVERHEAD: usize = 16;

/// A header's value; only strings carry what Bedrock says (`:event-type`, `:message-type`,
/// `:exception-type`, `:content-type`), the other types are read past and kept as bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderValue {
    /// Type 7.
    String(String),
    /// Any other type, its value's bytes.
    Other(u8, Vec<u8>),
}

/// One frame, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Its headers, in order.
    pub headers: Vec<(String, HeaderValue)>,
    /// Its payload (JSON for Bedrock's events).
    pub payload: Vec<u8>,
    /// The frame's bytes as they came, for the client.
    pub raw: Vec<u8>,
}

impl Message {
    /// A string header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find_map(|(n, v)| match v {
            HeaderValue::String(s) if n == name => Some(s.as_str()),
            _ => None,
        })
    }
}

/// Why the bytes are no event stream.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The prelude's CRC32 does not match its 8 bytes.
    #[error("event-stream frame {frame}: prelude CRC32 {found:#010x} where its bytes give {computed:#010x}")]
    PreludeCrc {
        /// The frame's place in the stream, from 0.
        frame: usize,
        /// The CRC the frame carries.
        found: u32,
        /// The CRC of its bytes.
        computed: u32,
    },
    /// The frame's closing CRC32 does not match its bytes.
    #[error("event-stream frame {frame}: message CRC32 {found:#010x} where its bytes give {computed:#010x}")]
    MessageCrc {
        /// The frame's place in the stream, from 0.
        frame: usize,
        /// The CRC the frame carries.
        found: u32,
        /// The CRC of its bytes.
        computed: u32,
    },
    /// The lengths cannot be a frame.
    #[error("event-stream frame {frame}: {why}")]
    Length {
        /// The frame's place in the stream, from 0.
        frame: usize,
        /// What is wrong with them.
        why: String,
    },
    /// A header does not read.
    #[error("event-stream frame {frame}: headers: {why}")]
    Header {
        /// The frame's place in the stream, from 0.
        frame: usize,
        /// What is wrong with them.
        why: String,
    },
}

impl FrameError {
    /// The stable code of the error.
    pub fn code(&self) -> &'static str {
        match self {
            FrameError::PreludeCrc { .. } => "eventstream_prelude_crc",
            FrameError::MessageCrc { .. } => "eventstream_message_crc",
            FrameError::Length { .. } => "eventstream_length",
            FrameError::Header { .. } => "eventstream_header",
        }
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Reads frames out of the bytes as they come; memory: one frame.
#[derive(Debug, Default)]
pub struct Decoder {
    buffer: Vec<u8>,
    frames: usize,
}

impl Decoder {
    /// Takes `data`; returns the frames it completed. An error ends the stream.
    pub fn push(&mut self, data: &[u8]) -> Result<Vec<Message>, FrameError> {
        self.buffer.extend_from_slice(data);
        let mut out = Vec::new();
        loop {
            if self.buffer.len() < 12 {
                return Ok(out);
            }
            let frame = self.frames;
            let total = be32(&self.buffer[0..4]) as usize;
            let headers_len = be32(&self.buffer[4..8]) as usize;
            let found = be32(&self.buffer[8..12]);
            let computed = crc32fast::hash(&self.buffer[0..8]);
            if found != computed {
                return Err(FrameError::PreludeCrc {
                    frame,
                    found,
                    computed,
                });
            }
            if !(OVERHEAD..=MAX_FRAME).contains(&total) || headers_len > total - OVERHEAD {
                return Err(FrameError::Length {
                    frame,
                    why: format!("total length {total} with headers of {headers_len} bytes"),
                });
            }
            if self.buffer.len() < total {
                return Ok(out);
            }
            let raw: Vec<u8> = self.buffer.drain(..total).collect();
            let found = be32(&raw[total - 4..]);
            let computed = crc32fast::hash(&raw[..total - 4]);
            if found != computed {
                return Err(FrameError::MessageCrc {
                    frame,
                    found,
                    computed,
                });
            }
            let headers = headers(&raw[12..12 + headers_len])
                .map_err(|why| FrameError::Header { frame, why })?;
            let payload = raw[12 + headers_len..total - 4].to_vec();
            self.frames += 1;
            out.push(Message {
                headers,
                payload,
                raw,
            });
        }
    }

    /// The bytes of a frame not complete yet.
    pub fn rest(&self) -> &[u8] {
        &self.buffer
    }
}

fn headers(mut b: &[u8]) -> Result<Vec<(String, HeaderValue)>, String> {
    let mut out = Vec::new();
    let take = |b: &mut &[u8], n: usize| -> Result<Vec<u8>, String> {
        if b.len() < n {
            return Err("a header runs past the headers".into());
        }
        let (head, tail) = b.split_at(n);
        *b = tail;
        Ok(head.to_vec())
    };
    while !b.is_empty() {
        let n = take(&mut b, 1)?[0] as usize;
        let name = String::from_utf8(take(&mut b, n)?).map_err(|_| "a name is not UTF-8")?;
        let kind = take(&mut b, 1)?[0];
        let len = match kind {
            0 | 1 => 0,
            2 => 1,
            3 => 2,
            4 => 4,
            5 | 8 => 8,
            9 => 16,
            6 | 7 => {
                let l = take(&mut b, 2)?;
                u16::from_be_bytes([l[0], l[1]]) as usize
            }
            other => return Err(format!("header `{name}` has unknown type {other}")),
        };
        let value = take(&mut b, len)?;
        let value = match kind {
            7 => HeaderValue::String(
                String::from_utf8(value).map_err(|_| format!("header `{name}` is not UTF-8"))?,
            ),
            _ => HeaderValue::Other(kind, value),
        };
        out.push((name, value));
    }
    Ok(out)
}

/// One frame with string headers and `payload`, its CRCs computed (the stub's and tests'
/// writer, and the shape Bedrock sends).
pub fn encode(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut head = Vec::new();
    for (name, value) in headers {
        head.push(name.len() as u8);
        head.extend_from_slice(name.as_bytes());
        head.push(7);
        head.extend_from_slice(&(value.len() as u16).to_be_bytes());
        head.extend_from_slice(value.as_bytes());
    }
    let total = OVERHEAD + head.len() + payload.len();
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&(total as u32).to_be_bytes());
    out.extend_from_slice(&(head.len() as u32).to_be_bytes());
    let prelude = crc32fast::hash(&out);
    out.extend_from_slice(&prelude.to_be_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// An event frame as Bedrock sends one: `:event-type`, JSON content, message type `event`.
pub fn event(kind: &str, payload: &str) -> Vec<u8> {
    encode(
        &[
            (":event-type", kind),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.as_bytes(),
    )
}
