//! How a step's lookups hash what they look up: contributions by [`CallKey`] and variables
//! by name, in maps that are only looked up, never iterated (so no order depends on them).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::plugin::model::Kind;

/// A contribution: its plugin (by the address of its shared entry, the same in every layout of
/// one snapshot), kind and index in the declaration. Only ever looked up, never iterated.
pub(super) type CallKey = (usize, Kind, usize);

/// A map keyed by [`CallKey`]s.
pub(super) type KeyMap<V> = HashMap<CallKey, V, BuildHasherDefault<KeyHasher>>;

/// Hashes [`CallKey`]s (addresses and small indices) and variable names: keys no client
/// chooses, in maps whose size the plugin limits bound, so the std hasher's resistance to
/// chosen keys buys nothing and costs a tenth of a step.
#[derive(Default)]
pub(super) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
        let mut last = [0u8; 8];
        last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        self.write_u64(u64::from_le_bytes(last));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn write_isize(&mut self, n: isize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
