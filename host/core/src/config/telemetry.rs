//! `[telemetry]`: OpenTelemetry export of steps as traces and of the daemon's counters as
//! metrics (docs/telemetry.md). Off unless `enabled = true`. Read when the daemon starts: a
//! reload that changes it is logged and waits for a restart.
//!
//! Every key is optional; a key left out falls back to the standard `OTEL_*` environment
//! variable that says the same (the telemetry crate reads them, not core), then to the OTLP
//! default.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::error::{Error, Result};

/// The OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies (`POST {endpoint}/v1/traces`), port 4318 by default.
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// OTLP/gRPC, port 4317 by default.
    #[serde(rename = "grpc")]
    Grpc,
}

impl Protocol {
    /// The name `OTEL_EXPORTER_OTLP_PROTOCOL` and the config use.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::Grpc => "grpc",
        }
    }

    /// The protocol named `name`, as `OTEL_EXPORTER_OTLP_PROTOCOL` spells it.
    pub fn parse(name: &str) -> Option<Protocol> {
        match name.trim() {
            "http/protobuf" => Some(Protocol::HttpProtobuf),
            "grpc" => Some(Protocol::Grpc),
            _ => None,
        }
    }
}

/// `[telemetry]`, as written (see the module docs for what a missing key means).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Export at all (default false).
    #[serde(default)]
    pub enabled: bool,
    /// The collector's base URL (`http://host:port`); for OTLP/HTTP, `/v1/traces` and
    /// `/v1/metrics` are appended. `OTEL_EXPORTER_OTLP_ENDPOINT` otherwise.
    pub endpoint: Option<String>,
    /// `http/protobuf` or `grpc`. `OTEL_EXPORTER_OTLP_PROTOCOL` otherwise, else
    /// `http/protobuf`.
    pub protocol: Option<Protocol>,
    /// Headers sent with every export (an API key, a tenant); added to
    /// `OTEL_EXPORTER_OTLP_HEADERS`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// `service.name` of the resource. `OTEL_SERVICE_NAME` otherwise, else `promptd`.
    pub service_name: Option<String>,
    /// More resource attributes (`openinference.project.name` picks a Phoenix project); added
    /// to `OTEL_RESOURCE_ATTRIBUTES`.
    #[serde(default)]
    pub resource: BTreeMap<String, String>,
    /// The share of sessions traced, 0 to 1 (default 1). A client's trace context decides
    /// for its own trace.
    pub sample_ratio: Option<f64>,
    /// Most spans in one export (default 512, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`).
    pub batch_size: Option<usize>,
    /// Most spans waiting for export; past it, spans are dropped and counted (default 2048,
    /// `OTEL_BSP_MAX_QUEUE_SIZE`).
    pub queue_size: Option<usize>,
    /// Longest a span waits for its batch, in ms (default 1000; `OTEL_BSP_SCHEDULE_DELAY`).
    pub batch_delay_ms: Option<u64>,
    /// Longest one export may take, in ms (default 10000, `OTEL_EXPORTER_OTLP_TIMEOUT`).
    pub timeout_ms: Option<u64>,
    /// Put message and system texts in spans (default false;
    /// `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`). A `data` plugin's text never is.
    pub capture_content: Option<bool>,
    /// Export the daemon's counters as OTLP metrics too (default true).
    pub metrics: Option<bool>,
    /// How often metrics are exported, in ms (default 60000, `OTEL_METRIC_EXPORT_INTERVAL`).
    pub metrics_interval_ms: Option<u64>,
    /// How long a step's span waits for its reply to be recorded before it is exported
    /// without one, in ms (default 30000).
    pub reply_wait_ms: Option<u64>,
    /// The daemon's address as span readers reach it, for the link to a step's rebuild route
    /// (default: the address it listens on).
    pub public_url: Option<String>,
    /// Each plugin call, review hook, budget and store append as a span of its own (default
    /// false: an event on its parent, a third of the spans to export).
    pub call_spans: Option<bool>,
}

/// Default of `[telemetry] reply_wait_ms`.
pub const DEFAULT_REPLY_WAIT_MS: u64 = 30_000;

impl TelemetryConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        let invalid = |m: String| Err(Error::ConfigInvalid(format!("[telemetry] {m}")));
        if let Some(endpoint) = &self.endpoint {
            check_endpoint(endpoint).or_else(|m| invalid(format!("endpoint: {m}")))?;
        }
        if let Some(r) = self.sample_ratio {
            if !(0.0..=1.0).contains(&r) {
                return invalid(format!("sample_ratio must be between 0 and 1, not {r}"));
            }
        }
        for (key, value) in [
            ("batch_size", self.batch_size),
            ("queue_size", self.queue_size),
        ] {
            if value == Some(0) {
                return invalid(format!("{key} must be at least 1"));
            }
        }
        if let (Some(batch), Some(queue)) = (self.batch_size, self.queue_size) {
            if batch > queue {
                return invalid(format!(
                    "batch_size ({batch}) must not exceed queue_size ({queue})"
                ));
            }
        }
        if self.timeout_ms == Some(0) || self.metrics_interval_ms == Some(0) {
            return invalid("timeout_ms and metrics_interval_ms must be at least 1".into());
        }
        for name in self.headers.keys() {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return invalid(format!("headers: `{name}` is not a header name"));
            }
        }
        if let Some(url) = &self.public_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return invalid(format!(
                    "public_url `{url}` must start with http:// or https://"
                ));
            }
        }
        Ok(())
    }
}

/// Why `endpoint` cannot be exported to, if it cannot: an `http://` URL with a host. Export
/// is plain HTTP (no TLS in this build): send to a collector on the host or a sidecar, which
/// forwards over TLS.
pub fn check_endpoint(endpoint: &str) -> std::result::Result<(), String> {
    if endpoint.starts_with("https://") {
        return Err(format!(
            "`{endpoint}` needs TLS, which this build does not include: export to a collector \
             on the host or a sidecar over http://, and let it forward over TLS"
        ));
    }
    match endpoint.strip_prefix("http://") {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(()),
        _ => Err(format!("`{endpoint}` is not an http:// URL with a host")),
    }
}
