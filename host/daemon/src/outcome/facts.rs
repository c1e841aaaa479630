//! What a traced step says beyond its outcome: its header's facts (computed once per
//! header), how its request compares with the previous one, and what a reply says of itself.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use promptd_core::budget::{Counter, Size};
use promptd_core::conversation::Header;
use promptd_core::provenance::Provenance;
use promptd_core::sync::lock;

/// Most sessions whose header facts are kept (past it the map starts again).
const MAX_HEADER_FACTS: usize = 4096;

/// What a traced step says of its header and prefix.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepFacts {
    /// The header's prompt cache key.
    pub cache_key: Option<String>,
    /// The header's cache TTL (`5m`, `1h`).
    pub cache_ttl: Option<String>,
    /// The header's system prompt hash and tool groups.
    pub header: Option<Arc<HeaderFacts>>,
    /// The header's system prompt, when content is gathered.
    pub system: Option<String>,
    /// Against the previous step; `None` on the first.
    pub prefix: Option<PrefixFacts>,
}

/// How the step's request compares with the previous step's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefixFacts {
    /// Whether the previous request is a prefix of this one.
    pub kept: bool,
    /// Bytes of this step's compared stream, when a diff was computed.
    pub bytes: Option<usize>,
    /// Bytes the two streams share from their start, when a diff was computed.
    pub shared_bytes: Option<usize>,
    /// Where the streams first differ (`system`, ``tool `bash` ``…).
    pub first_difference: Option<String>,
    /// Why the prefix broke, first cause first (they name the plugin).
    pub causes: Vec<String>,
}

/// What a step's header is, computed once per header.
#[derive(Debug, Default, PartialEq)]
pub struct HeaderFacts {
    /// The system prompt's SHA-256 (hex) and bytes.
    pub system: (String, usize),
    /// Each plugin's tools (name, description, schema) in tokens, by plugin id, sorted.
    pub tool_groups: Arc<Vec<(Arc<str>, u64)>>,
}

impl HeaderFacts {
    fn of(header: &Header, provenance: Option<&Provenance>, counter: &dyn Counter) -> HeaderFacts {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(header.system.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let mut groups: BTreeMap<&str, u64> = BTreeMap::new();
        for tool in &header.tools {
            let plugin = provenance
                .and_then(|p| p.tools.iter().find(|g| g.name == tool.name))
                .map_or("unknown", |g| g.plugin.as_str());
            let schema = tool.parameters.to_string();
            let text = [tool.name.as_str(), &tool.description, &schema].join("\n");
            *groups.entry(plugin).or_default() += Size::of(&text, counter).tokens as u64;
        }
        HeaderFacts {
            system: (hex, header.system.len()),
            tool_groups: Arc::new(groups.into_iter().map(|(p, t)| (Arc::from(p), t)).collect()),
        }
    }
}

/// Each session's last header's facts.
#[derive(Default)]
pub(crate) struct HeaderFactsCache {
    by_session: Mutex<HashMap<String, Arc<HeaderFacts>>>,
}

impl HeaderFactsCache {
    /// The facts of session `id`'s header `header`: computed when it is new (`fresh`) or not
    /// known here, else the last one's.
    pub(crate) fn get(
        &self,
        id: &str,
        header: &Header,
        provenance: Option<&Provenance>,
        counter: &dyn Counter,
        fresh: bool,
    ) -> Arc<HeaderFacts> {
        if !fresh {
            if let Some(known) = lock(&self.by_session).get(id) {
                return known.clone();
            }
        }
        let known = Arc::new(HeaderFacts::of(header, provenance, counter));
        let mut all = lock(&self.by_session);
        if all.len() >= MAX_HEADER_FACTS && !all.contains_key(id) {
            all.clear();
        }
        all.insert(id.to_string(), known.clone());
        known
    }
}

/// What a reply says of itself, as each provider's reply spells it (OpenAI Chat and
/// Responses, Anthropic, Gemini, Bedrock).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplyFacts {
    /// The model that answered.
    pub model: Option<String>,
    /// The reply's id.
    pub id: Option<String>,
    /// Why the model stopped.
    pub finish_reasons: Vec<String>,
}

impl ReplyFacts {
    /// Read from `reply`; what it leaves out is `None` or empty.
    pub fn of(reply: &serde_json::Value) -> ReplyFacts {
        let text = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).map(str::to_string);
        let mut finish_reasons: Vec<String> = Vec::new();
        if let Some(choices) = reply.get("choices").and_then(|c| c.as_array()) {
            finish_reasons.extend(choices.iter().filter_map(|c| text(c.get("finish_reason"))));
        }
        if let Some(candidates) = reply.get("candidates").and_then(|c| c.as_array()) {
            finish_reasons.extend(
                candidates
                    .iter()
                    .filter_map(|c| text(c.get("finishReason"))),
            );
        }
        if let Some(r) = ["stop_reason", "stopReason", "status"]
            .iter()
            .find_map(|k| text(reply.get(*k)))
        {
            finish_reasons.push(r);
        }
        ReplyFacts {
            model: text(reply.get("model")).or_else(|| text(reply.get("modelVersion"))),
            id: text(reply.get("id")).or_else(|| text(reply.get("responseId"))),
            finish_reasons,
        }
    }
}
