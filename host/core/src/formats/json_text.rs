//! JSON text written into a buffer of exactly its size, counted first: a fragment a session
//! keeps lives as long as the session, and a buffer grown by doubling held up to twice a large
//! message at a step's peak (issue 32; the 20 MiB step in `tests/limits.rs`).

use serde_json::Value;

/// `value.to_string()`, in a buffer of exactly its size.
pub fn json_string(value: &Value) -> String {
    let mut out = Vec::with_capacity(json_len(value));
    write_json(&mut out, value);
    // serde_json writes UTF-8 only.
    String::from_utf8(out).unwrap_or_default()
}

/// Appends `value`'s JSON text to `out`.
pub(crate) fn write_json(out: &mut Vec<u8>, value: &impl serde::Serialize) {
    // Writing a `Value` (string keys, finite numbers) into a Vec cannot fail.
    let _ = serde_json::to_writer(out, value);
}

/// Appends `value`'s JSON text to the text `out`, as it is written (no buffer of its own);
/// on an error `out` is left as it was.
pub fn write_json_str<T: serde::Serialize + ?Sized>(
    out: &mut String,
    value: &T,
) -> serde_json::Result<()> {
    struct Into<'a>(&'a mut String);
    impl std::io::Write for Into<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            // serde_json writes whole characters at a time: every piece is UTF-8.
            let s = std::str::from_utf8(buf)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            self.0.push_str(s);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let start = out.len();
    let written = serde_json::to_writer(Into(&mut *out), value);
    if written.is_err() {
        out.truncate(start);
    }
    written
}

/// The most [`write_small_json_str`]'s buffer keeps between calls.
const KEPT: usize = 16 * 1024;

thread_local! {
    /// [`write_small_json_str`]'s buffer.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Appends a small value's JSON text to the text `out` (a step's usage): written first into
/// a buffer the thread keeps, then checked as UTF-8 and copied once. serde_json writes a value
/// of many fields in many small pieces, and [`write_json_str`] checks and appends each
/// piece on its own. The buffer is not kept once it has grown past 16 KiB, so a large value
/// costs an allocation rather than memory held for good; on an error `out` is left as it was.
pub fn write_small_json_str<T: serde::Serialize + ?Sized>(
    out: &mut String,
    value: &T,
) -> serde_json::Result<()> {
    SCRATCH.with(|scratch| {
        // A value whose serialization writes JSON the same way finds the buffer taken.
        let Ok(mut buf) = scratch.try_borrow_mut() else {
            return write_json_str(out, value);
        };
        buf.clear();
        let written = serde_json::to_writer(&mut *buf, value).and_then(|()| {
            let text = std::str::from_utf8(&buf).map_err(|e| {
                serde_json::Error::io(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
            })?;
            out.push_str(text);
            Ok(())
        });
        if buf.capacity() > KEPT {
            *buf = Vec::new();
        }
        written
    })
}

/// How many bytes `value` is as JSON, counted without writing them (a session's memory
/// estimate counts records so, too).
pub(crate) fn json_len(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Counting cannot fail; only a map keyed by something other than strings would stop the
    // count early, and none of what is counted has one.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_small_value_is_appended_as_serde_json_writes_it() {
        let usage = serde_json::json!({"total": {"chars": 12, "tokens": 3}, "name": "é\"\n", "list": [1, 2.5, null]});
        let mut out = String::from("{\"usage\":");
        write_small_json_str(&mut out, &usage).unwrap();
        assert_eq!(
            out,
            format!("{{\"usage\":{}", serde_json::to_string(&usage).unwrap())
        );
        // Again on the same thread (the buffer reused), and a value over the buffer's kept size.
        let big = "x".repeat(40_000);
        let mut out = String::new();
        write_small_json_str(&mut out, &big).unwrap();
        // Not kept past its bound once a large value went through it.
        assert!(SCRATCH.with(|s| s.borrow().capacity()) <= KEPT);
        write_small_json_str(&mut out, &usage).unwrap();
        assert_eq!(
            out,
            serde_json::to_string(&big).unwrap() + &serde_json::to_string(&usage).unwrap()
        );
    }

    #[test]
    fn a_value_json_cannot_write_leaves_the_text_as_it_was() {
        let mut keyed_by_pairs = BTreeMap::new();
        keyed_by_pairs.insert((1, 2), 3);
        let mut out = String::from("kept");
        assert!(write_small_json_str(&mut out, &keyed_by_pairs).is_err());
        assert_eq!(out, "kept");
    }
}
