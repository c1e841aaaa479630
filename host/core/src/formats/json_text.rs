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
