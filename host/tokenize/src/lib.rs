//! Token counters for budgets ([`promptd_core::budget::Counter`]): `chars`, and OpenAI's
//! `o200k` and `cl100k` BPE vocabularies through `tiktoken-rs`, embedded in the binary, so
//! nothing is downloaded. A vocabulary is loaded the first time it is asked for.
//!
//! ```
//! let counter = promptd_tokenize::counter("chars").unwrap();
//! assert_eq!(counter.count("héllo"), 5);
//! assert!(promptd_tokenize::counter("gpt-2").is_none());
//! ```

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use promptd_core::budget::{Chars, Counter};
use promptd_core::sync::lock;
use tiktoken_rs::CoreBPE;

/// The counter for a tokenizer name (see [`promptd_core::config::TOKENIZERS`]).
pub fn counter(name: &str) -> Option<Arc<dyn Counter>> {
    match name {
        "chars" => Some(Arc::new(Chars)),
        "o200k" => Some(Arc::new(Bpe::new(
            "o200k",
            tiktoken_rs::o200k_base_singleton,
        ))),
        "cl100k" => Some(Arc::new(Bpe::new(
            "cl100k",
            tiktoken_rs::cl100k_base_singleton,
        ))),
        _ => None,
    }
}

/// Texts remembered per counter: system prompts and tool lists repeat every step.
const MEMO_ENTRIES: usize = 4096;

/// A BPE counter with a small memo of recent texts (by hash and length).
struct Bpe {
    name: &'static str,
    bpe: fn() -> &'static CoreBPE,
    memo: Mutex<HashMap<(u64, usize), usize>>,
}

impl Bpe {
    fn new(name: &'static str, bpe: fn() -> &'static CoreBPE) -> Self {
        Self {
            name,
            bpe,
            memo: Mutex::new(HashMap::new()),
        }
    }
}

impl Counter for Bpe {
    fn name(&self) -> &str {
        self.name
    }

    fn count(&self, text: &str) -> usize {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut hasher);
        let key = (hasher.finish(), text.len());
        if let Some(n) = lock(&self.memo).get(&key) {
            return *n;
        }
        let n = (self.bpe)().encode_ordinary(text).len();
        let mut memo = lock(&self.memo);
        if memo.len() >= MEMO_ENTRIES {
            memo.clear();
        }
        memo.insert(key, n);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_match_the_tokenizer_library() {
        let text = "The context window is a budget: measure every part. 日本語も 🙂";
        for (name, bpe) in [
            ("o200k", tiktoken_rs::o200k_base_singleton()),
            ("cl100k", tiktoken_rs::cl100k_base_singleton()),
        ] {
            let c = counter(name).unwrap();
            assert_eq!(c.count(text), bpe.encode_ordinary(text).len(), "{name}");
            assert_eq!(c.count(text), c.count(text), "memoised");
            assert_eq!(c.name(), name);
        }
        assert_eq!(counter("o200k").unwrap().count("hello world"), 2);
        assert_eq!(counter("chars").unwrap().count("漢字🙂"), 3);
    }
}
