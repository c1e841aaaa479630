//! Images and documents kept once: the base64 `data` of an image or document block of a user
//! message or tool result, when larger than [`MIN_BYTES`], is stored in `blobs` under its
//! SHA-256 and the event body keeps `data_sha256` in its place. Reading puts the data back,
//! so a store hands out the bodies it was given (such a body as JSON with its keys sorted;
//! every other body byte for byte), and a session that sends the same
//! screenshot at every step stores it once. (Blocks refuse unknown fields, so no client can
//! send a `data_sha256` of its own.)

use rusqlite::{Connection, OptionalExtension};
use serde_json::Value;
use sha2::{Digest, Sha256};

use promptd_core::store::EventKind;

/// Smaller data stays inline: a row of its own would cost more than it saves.
pub const MIN_BYTES: usize = 1024;

/// The media blocks of a body, when its kind has content blocks.
fn blocks(
    kind: EventKind,
    body: &mut Value,
) -> impl Iterator<Item = &mut serde_json::Map<String, Value>> {
    let content = match kind {
        EventKind::UserMessage | EventKind::ToolResult => body.get_mut("content"),
        _ => None,
    };
    content
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
        .filter(|b| {
            matches!(
                b.get("type").and_then(Value::as_str),
                Some("image" | "document")
            )
        })
}

/// The body text to store (`None`: as given) and the blobs it refers to, `(sha256, data)`.
/// Only a message body long enough to hold a large block is parsed at all.
pub fn deflate(kind: EventKind, text: &str) -> (Option<String>, Vec<(String, String)>) {
    if !matches!(kind, EventKind::UserMessage | EventKind::ToolResult) || text.len() < MIN_BYTES {
        return (None, Vec::new());
    }
    // Not JSON: stored as given (the store keeps bytes; readers of the log judge them).
    let Ok(body) = serde_json::from_str::<Value>(text) else {
        return (None, Vec::new());
    };
    let (stored, found) = deflate_value(kind, &body);
    (stored.map(|v| v.to_string()), found)
}

/// [`deflate`] on a parsed body.
fn deflate_value(kind: EventKind, body: &Value) -> (Option<Value>, Vec<(String, String)>) {
    // Most events hold no large media: look before copying the body (a header is big).
    let large = |b: &Value| {
        matches!(
            b.get("type").and_then(Value::as_str),
            Some("image" | "document")
        ) && b
            .get("data")
            .and_then(Value::as_str)
            .is_some_and(|d| d.len() >= MIN_BYTES)
    };
    let has_media = matches!(kind, EventKind::UserMessage | EventKind::ToolResult)
        && body
            .get("content")
            .and_then(Value::as_array)
            .is_some_and(|c| c.iter().any(large));
    if !has_media {
        return (None, Vec::new());
    }
    let mut stored = body.clone();
    let mut found = Vec::new();
    for block in blocks(kind, &mut stored) {
        let Some(Value::String(data)) = block.get("data") else {
            continue;
        };
        if data.len() < MIN_BYTES {
            continue;
        }
        let sha: String = Sha256::digest(data.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if let Some(Value::String(data)) = block.remove("data") {
            block.insert("data_sha256".into(), Value::String(sha.clone()));
            found.push((sha, data));
        }
    }
    if found.is_empty() {
        (None, found)
    } else {
        (Some(stored), found)
    }
}

/// The stored body text with the data of every `data_sha256` put back (as given when it
/// refers to no blob).
pub fn inflate(conn: &Connection, kind: EventKind, text: String) -> Result<String, String> {
    if !matches!(kind, EventKind::UserMessage | EventKind::ToolResult)
        || !text.contains("\"data_sha256\"")
    {
        return Ok(text);
    }
    let mut body: Value =
        serde_json::from_str(&text).map_err(|e| format!("{kind} body is not JSON: {e}"))?;
    inflate_value(conn, kind, &mut body)?;
    Ok(body.to_string())
}

/// [`inflate`] on a parsed body.
fn inflate_value(conn: &Connection, kind: EventKind, body: &mut Value) -> Result<(), String> {
    let mut query = None;
    for block in blocks(kind, body) {
        let Some(Value::String(sha)) = block.remove("data_sha256") else {
            continue;
        };
        if query.is_none() {
            query = Some(
                conn.prepare_cached("SELECT data FROM blobs WHERE sha256 = ?1")
                    .map_err(|e| format!("preparing the blob read: {e}"))?,
            );
        }
        let Some(stmt) = query.as_mut() else { continue };
        let data: Option<String> = stmt
            .query_row([&sha], |r| r.get(0))
            .optional()
            .map_err(|e| format!("reading blob {sha}: {e}"))?;
        let data = data.ok_or_else(|| format!("blob {sha} is missing"))?;
        block.insert("data".into(), Value::String(data));
    }
    Ok(())
}
