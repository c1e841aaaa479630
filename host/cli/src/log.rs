//! The daemon's log sink: one event is one line (L9). Plugin messages, plugin and file names
//! and client-supplied ids reach the log inside events; whatever they contain, control
//! characters (newlines, carriage returns, ANSI escapes) are written escaped, so no input can
//! forge a line that looks like the host's.

use std::io::Write;

use tracing_subscriber::fmt::MakeWriter;

/// Writes each event to stderr as one line, escaping what would break it.
pub struct OneLineStderr;

impl<'a> MakeWriter<'a> for OneLineStderr {
    type Writer = Record;

    fn make_writer(&'a self) -> Record {
        Record(Vec::new())
    }
}

/// One event, buffered until the formatter is done with it.
pub struct Record(Vec<u8>);

impl Write for Record {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let line = one_line(&String::from_utf8_lossy(&self.0));
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// `text` as one line ending in `\n`: every control character (ASCII and Latin-1 controls,
/// DEL) and the Unicode line and paragraph separators escaped as `\n`, `\u{1b}` and so on.
pub fn one_line(text: &str) -> String {
    let body = text.strip_suffix('\n').unwrap_or(text);
    let mut out = String::with_capacity(body.len() + 1);
    for c in body.chars() {
        if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn l9_control_characters_cannot_start_a_line() {
        assert_eq!(one_line("plain\n"), "plain\n");
        assert_eq!(
            one_line("a\n2030-01-01T00:00:00Z ERROR promptd: forged\r\u{1b}[31m\u{2028}x\n"),
            "a\\n2030-01-01T00:00:00Z ERROR promptd: forged\\r\\u{1b}[31m\\u{2028}x\n"
        );
        assert_eq!(one_line("tab\there"), "tab\\there\n");
    }
}
