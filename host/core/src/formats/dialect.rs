//! Dialects of Chat Completions: servers that take its shape but not all of it
//! (`[model.openai] dialect = "vllm"`). Each adjustment below is one the server's own docs
//! call for; docs/formats.md#dialects lists them with their sources. The default is the OpenAI
//! API itself, unchanged.
//!
//! ```
//! use promptd_core::formats::dialect::Dialect;
//! assert_eq!("ollama".parse::<Dialect>(), Ok(Dialect::Ollama));
//! assert!("tgi".parse::<Dialect>().unwrap_err().contains("openai, vllm, llamacpp, ollama"));
//! ```

use serde_json::{Map, Value};

/// The server a Chat Completions body is for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dialect {
    /// The OpenAI API: the body as it is.
    #[default]
    Openai,
    /// vLLM's OpenAI-compatible server.
    Vllm,
    /// llama.cpp's `llama-server`.
    Llamacpp,
    /// Ollama's OpenAI compatibility (`/v1/chat/completions`).
    Ollama,
}

impl Dialect {
    /// Every dialect, in a fixed order.
    pub const ALL: [Dialect; 4] = [
        Dialect::Openai,
        Dialect::Vllm,
        Dialect::Llamacpp,
        Dialect::Ollama,
    ];

    /// Its name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Openai => "openai",
            Dialect::Vllm => "vllm",
            Dialect::Llamacpp => "llamacpp",
            Dialect::Ollama => "ollama",
        }
    }

    /// The dialect an agent's model settings name for Chat Completions (`dialect`, in
    /// `[model.openai]` or `[model]`), the OpenAI API when none is named (an unknown name is
    /// refused when the config loads: [`check`]).
    pub fn of(model: &Map<String, Value>) -> Dialect {
        super::setting(model, super::Format::Openai, "dialect")
            .and_then(Value::as_str)
            .and_then(|d| d.parse().ok())
            .unwrap_or_default()
    }

    /// Whether the server takes `tool_choice: {"type": "allowed_tools"}` (only OpenAI does:
    /// the others take `none`, `auto`, `required` or one named function).
    pub fn allowed_tools(self) -> bool {
        self == Dialect::Openai
    }

    /// Whether the server takes PDFs as `file` content parts (only OpenAI documents it).
    pub fn takes_files(self) -> bool {
        self == Dialect::Openai
    }

    /// Adjusts a body's settings (everything but `messages` and `tools`) to what the server
    /// documents it accepts.
    pub fn adjust(self, body: &mut Map<String, Value>) {
        body.remove("dialect");
        if self == Dialect::Openai {
            return;
        }
        // OpenAI's prompt-cache routing key: the others cache by prefix on the one server and
        // do not list it.
        body.remove("prompt_cache_key");
        // llama.cpp and Ollama document `max_tokens`, not its newer name.
        if matches!(self, Dialect::Llamacpp | Dialect::Ollama) {
            if let Some(max) = body.remove("max_completion_tokens") {
                body.entry("max_tokens").or_insert(max);
            }
        }
    }
}

impl std::str::FromStr for Dialect {
    type Err = String;

    fn from_str(s: &str) -> Result<Dialect, String> {
        Dialect::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Dialect::ALL.iter().map(|d| d.as_str()).collect();
                format!("unknown dialect `{s}`; use {}", names.join(", "))
            })
    }
}

/// Refuses a `dialect` setting that names no dialect (or is not a string).
pub fn check(settings: &Map<String, Value>) -> Result<(), String> {
    match settings.get("dialect") {
        None => Ok(()),
        Some(Value::String(name)) => name.parse::<Dialect>().map(|_| ()),
        Some(other) => Err(format!("`dialect` must be a string, not {other}")),
    }
}
