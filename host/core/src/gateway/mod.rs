//! The gateway's pure side (docs/gateway.md): what a client sent in a provider's own shape
//! ([`body`]), where promptd's contributions go into it ([`splice`]), and how a streamed reply
//! is read back into the one reply it stands for ([`stream`]).
//!
//! ```
//! use promptd_core::gateway::{body::ClientBody, splice, Ingress};
//!
//! let client = br#"{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}"#;
//! let body = ClientBody::parse(client).unwrap();
//! let added = splice::Contributions { system: "You are Ada.".into(), runtime_context: None, tools: vec![] };
//! let plan = splice::plan(Ingress::Messages, &body, &added, &Default::default()).unwrap();
//! let upstream = String::from_utf8(plan.apply(client)).unwrap();
//! assert!(upstream.starts_with(r#"{"system":[{"type":"text","text":"You are Ada.","#));
//! assert!(upstream.ends_with(r#""model":"m","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}"#));
//! ```

pub mod bedrock;
#[cfg(test)]
mod bedrock_tests;
pub mod body;
mod edits;
pub mod eventstream;
pub mod gemini;
#[cfg(test)]
mod gemini_tests;
pub mod keys;
pub mod messages;
pub mod own_tools;
pub mod record;
pub mod redact;
pub mod sigv4;
pub mod splice;
pub mod stream;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use crate::formats::Format;

/// A provider endpoint the gateway serves (G1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ingress {
    /// OpenAI `POST /v1/chat/completions`.
    ChatCompletions,
    /// OpenAI `POST /v1/responses`.
    Responses,
    /// Anthropic `POST /v1/messages`.
    Messages,
    /// Anthropic `POST /v1/messages/count_tokens`.
    CountTokens,
    /// Gemini `POST /v1beta/models/{model}:generateContent` (or `/v1/…`, which google-genai
    /// calls by default): the model is named by the path ([`gemini::GeminiPath`]).
    GenerateContent,
    /// Gemini `POST /v1beta/models/{model}:streamGenerateContent?alt=sse`: the reply as
    /// server-sent events, each a `GenerateContentResponse`.
    StreamGenerateContent,
    /// Bedrock Runtime `POST /model/{modelId}/converse`: the model is named by the path
    /// ([`bedrock::BedrockPath`]).
    Converse,
    /// Bedrock Runtime `POST /model/{modelId}/converse-stream`: the reply in AWS's binary
    /// event-stream framing ([`eventstream`]).
    ConverseStream,
}

impl Ingress {
    /// Every endpoint, in a fixed order.
    pub const ALL: [Ingress; 8] = [
        Ingress::ChatCompletions,
        Ingress::Responses,
        Ingress::Messages,
        Ingress::CountTokens,
        Ingress::GenerateContent,
        Ingress::StreamGenerateContent,
        Ingress::Converse,
        Ingress::ConverseStream,
    ];

    /// The endpoint's path, after the gateway's prefix (Gemini's as a template: its path
    /// names the model).
    pub fn path(self) -> &'static str {
        match self {
            Ingress::ChatCompletions => "/v1/chat/completions",
            Ingress::Responses => "/v1/responses",
            Ingress::Messages => "/v1/messages",
            Ingress::CountTokens => "/v1/messages/count_tokens",
            Ingress::GenerateContent => "/v1beta/models/{model}:generateContent",
            Ingress::StreamGenerateContent => "/v1beta/models/{model}:streamGenerateContent",
            Ingress::Converse => "/model/{modelId}/converse",
            Ingress::ConverseStream => "/model/{modelId}/converse-stream",
        }
    }

    /// The endpoint of `path` (after the gateway's prefix), for the fixed paths.
    pub fn of_path(path: &str) -> Option<Ingress> {
        Ingress::ALL
            .into_iter()
            .filter(|i| i.fixed_path())
            .find(|i| i.path() == path)
    }

    /// Whether its path is fixed (not a template naming the model).
    pub fn fixed_path(self) -> bool {
        !matches!(self.provider(), Provider::Gemini | Provider::Bedrock)
    }

    /// The body format promptd renders and reads for it.
    pub fn format(self) -> Format {
        match self {
            Ingress::ChatCompletions => Format::Openai,
            Ingress::Responses => Format::OpenaiResponses,
            Ingress::Messages | Ingress::CountTokens => Format::Anthropic,
            Ingress::GenerateContent | Ingress::StreamGenerateContent => Format::Gemini,
            Ingress::Converse | Ingress::ConverseStream => Format::Bedrock,
        }
    }

    /// The provider whose API it is.
    pub fn provider(self) -> Provider {
        match self {
            Ingress::ChatCompletions | Ingress::Responses => Provider::Openai,
            Ingress::Messages | Ingress::CountTokens => Provider::Anthropic,
            Ingress::GenerateContent | Ingress::StreamGenerateContent => Provider::Gemini,
            Ingress::Converse | Ingress::ConverseStream => Provider::Bedrock,
        }
    }

    /// Whether the endpoint itself asks for a streamed reply (Gemini's and Bedrock's
    /// streaming methods; the others say it in the body's `stream`).
    pub fn streams(self) -> bool {
        matches!(
            self,
            Ingress::StreamGenerateContent | Ingress::ConverseStream
        )
    }
}

/// A provider an upstream speaks for (`[gateway.upstream.NAME] provider`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// OpenAI (Chat Completions and Responses).
    Openai,
    /// Anthropic (Messages).
    Anthropic,
    /// Google Gemini (`generateContent`, `streamGenerateContent`).
    Gemini,
    /// Amazon Bedrock Runtime (`converse`, `converse-stream`), signed with SigV4 (G9).
    Bedrock,
}

impl Provider {
    /// Every provider, in a fixed order.
    pub const ALL: [Provider; 4] = [
        Provider::Openai,
        Provider::Anthropic,
        Provider::Gemini,
        Provider::Bedrock,
    ];

    /// The provider's name as the config writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Openai => "openai",
            Provider::Anthropic => "anthropic",
            Provider::Gemini => "gemini",
            Provider::Bedrock => "bedrock",
        }
    }
}

/// Why the gateway's pure side refused a client's body or an upstream's stream; the daemon
/// answers it in the provider's own error shape.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GatewayError {
    /// The client's body is not what the endpoint takes.
    #[error("invalid request body: {0}")]
    InvalidBody(String),
    /// The upstream's stream broke the provider's framing.
    #[error("invalid stream from the upstream: {0}")]
    InvalidStream(String),
    /// A review hook's redaction cannot be applied to the client's body.
    #[error("a review hook's redaction cannot be applied to the client's body: {0}")]
    Redaction(String),
}

impl GatewayError {
    /// The stable code of the error.
    pub fn code(&self) -> &'static str {
        match self {
            GatewayError::InvalidBody(_) => "invalid_body",
            GatewayError::InvalidStream(_) => "invalid_stream",
            GatewayError::Redaction(_) => "redaction",
        }
    }
}
