//! The `gateway/request` event (docs/log-format.md): what a gateway client sent, how its
//! request joined its session, and what promptd spliced in. The upstream body is
//! [`GatewayRecord::upstream_body`]: the client's bytes with the recorded edits, byte for byte.

use serde::{Deserialize, Serialize};

use super::splice::Splice;
use super::Ingress;

/// How a gateway request found its session (G3), in the order they are tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JoinedBy {
    /// The client's `x-promptd-session` header.
    Header,
    /// Responses' `previous_response_id`: a reply recorded in this session.
    PreviousResponse,
    /// The session whose recorded messages the request's messages start with.
    Prefix,
    /// None matched: the request started the session.
    New,
}

/// One `gateway/request` event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayRecord {
    /// The endpoint the client called.
    pub ingress: Ingress,
    /// The upstream it went to (`[gateway.upstream.NAME]`).
    pub upstream: String,
    /// The model the client named (its body's `model`, or Gemini's and Bedrock's path): the
    /// reply's cache outcome and cost are that model's, whatever promptd's own config names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The gateway key that sent it (`[gateway.keys.NAME]`, G12); none without keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// How the request joined the session.
    pub joined_by: JoinedBy,
    /// The client's body as it sent it (with a review's redactions applied: `redacted`).
    pub client_body: String,
    /// What promptd changed in it.
    pub splice: Splice,
    /// The client's messages promptd read (system messages aside).
    pub messages: usize,
    /// The chained digest over them (gateway::messages).
    pub digest: String,
    /// The first of them new to the log: the ones before were recorded earlier.
    pub new_from: usize,
    /// When the client's messages do not continue what the log holds, the first message
    /// where they part: the client rewrote its history (compacted, edited, dropped a turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrote_at: Option<usize>,
    /// Why promptd's contributions were left out (`on_plugin_failure = "forward"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<String>,
    /// How many strings of the client's texts a review hook's redaction replaced (G6): when
    /// not 0, `client_body` is the client's body with them replaced, so text a hook redacted
    /// is in neither the log nor the upstream body.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub redacted: usize,
    /// The redactions behind them: every one the session's hooks made so far, in order, so a
    /// secret redacted once stays out of every later request that resends it. Held in memory
    /// only, never written: each rule's `find` is the text it hides.
    #[serde(skip)]
    pub redactions: Vec<crate::assembly::review::Redaction>,
    /// The plugin versions the request's sections were built from (G11): each plugin of the
    /// header it sent, id → sha256 of its file. A session that pins its plugins keeps its
    /// header's versions while a newer one serves; absent for a degraded request (no plugins)
    /// and in logs written before it was recorded.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub plugins: std::collections::BTreeMap<String, String>,
    /// G13: 0 for a client's request; `n` for the n-th round of promptd's own tool calls
    /// within it, whose `client_body` is the client's body with the model's turns and
    /// promptd's results appended.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub round: u32,
    /// G13: promptd's own calls and results put back into the client's body at their place
    /// (the client's history lacks them): `client_body` holds them; taking these insertions
    /// out (each at `at` in the client's own bytes) gives the bytes the client sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restored: Vec<super::splice::Edit>,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl GatewayRecord {
    /// The body that went upstream.
    pub fn upstream_body(&self) -> Vec<u8> {
        self.splice.apply(self.client_body.as_bytes())
    }
}
