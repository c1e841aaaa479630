//! Shared by the end-to-end tests and the `hot_swap` bench.

/// The same component with a custom section appended: a new file hash, the same behaviour.
pub fn with_custom_section(bytes: &[u8], n: u64) -> Vec<u8> {
    fn leb(mut v: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let name = b"promptd-test";
    let mut content = Vec::new();
    leb(name.len(), &mut content);
    content.extend_from_slice(name);
    content.extend_from_slice(&n.to_le_bytes());
    let mut out = bytes.to_vec();
    out.push(0);
    leb(content.len(), &mut out);
    out.extend_from_slice(&content);
    out
}
