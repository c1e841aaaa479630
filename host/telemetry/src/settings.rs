//! `[telemetry]` and the standard `OTEL_*` environment variables, resolved once at start.
//! A key the config sets wins; else its environment variable; else the OTLP default.

use std::collections::BTreeMap;
use std::time::Duration;

use promptd_core::config::telemetry::{
    check_endpoint, Protocol, TelemetryConfig, DEFAULT_REPLY_WAIT_MS,
};

use crate::TelemetryError;

/// What the exporter does, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The transport.
    pub protocol: Protocol,
    /// Where spans go (for OTLP/HTTP, the whole URL with `/v1/traces`).
    pub traces_endpoint: String,
    /// Where metrics go (for OTLP/HTTP, with `/v1/metrics`).
    pub metrics_endpoint: String,
    /// The config's headers (the metrics exporter adds `OTEL_EXPORTER_OTLP_HEADERS` itself).
    pub headers: BTreeMap<String, String>,
    /// The headers on every trace export: `OTEL_EXPORTER_OTLP_HEADERS`, then
    /// `OTEL_EXPORTER_OTLP_TRACES_HEADERS`, then the config's; a later one of a name wins.
    pub trace_headers: BTreeMap<String, String>,
    /// `service.name`.
    pub service_name: String,
    /// More resource attributes from the config (the SDK adds `OTEL_RESOURCE_ATTRIBUTES`).
    pub resource: BTreeMap<String, String>,
    /// The share of sessions traced.
    pub sample_ratio: f64,
    /// Most spans per export.
    pub batch_size: usize,
    /// Most spans waiting.
    pub queue_size: usize,
    /// Longest a span waits for its batch.
    pub batch_delay: Duration,
    /// Longest one export may take.
    pub timeout: Duration,
    /// Whether message and system texts go into spans.
    pub capture_content: bool,
    /// Whether the counters are exported as metrics.
    pub metrics: bool,
    /// How often metrics are exported.
    pub metrics_interval: Duration,
    /// How long a step's span waits for its reply.
    pub reply_wait: Duration,
    /// The daemon's base URL, for the rebuild route's link.
    pub public_url: String,
    /// Each plugin call, the budget and the store append as a span of its own (else an
    /// event on its parent).
    pub call_spans: bool,
}

impl Settings {
    /// `config` with what it leaves out read from `env` (`std::env::var`, in the daemon);
    /// `None` when telemetry is off (`enabled` unset or false, or `OTEL_SDK_DISABLED=true`).
    /// `listen` is the daemon's address, for `public_url`'s default.
    pub fn resolve(
        config: &TelemetryConfig,
        env: &dyn Fn(&str) -> Option<String>,
        listen: &str,
    ) -> Result<Option<Settings>, TelemetryError> {
        let var = |name: &str| {
            env(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if !config.enabled
            || var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        {
            return Ok(None);
        }
        let bad = |name: &str, value: &str, why: &str| {
            TelemetryError::Config(format!("{name}=`{value}`: {why}"))
        };
        let protocol = protocol(config, &var)?;
        let signal = |path: &str, specific: &str| -> Result<String, TelemetryError> {
            let base = |e: &str| match protocol {
                Protocol::HttpProtobuf => format!("{}{path}", e.trim_end_matches('/')),
                Protocol::Grpc => e.to_string(),
            };
            let (name, url) = match (
                &config.endpoint,
                var(specific),
                var("OTEL_EXPORTER_OTLP_ENDPOINT"),
            ) {
                (Some(e), _, _) => ("[telemetry] endpoint", base(e)),
                (None, Some(e), _) => (specific, e),
                (None, None, Some(e)) => ("OTEL_EXPORTER_OTLP_ENDPOINT", base(&e)),
                (None, None, None) => match protocol {
                    Protocol::HttpProtobuf => ("default", format!("http://localhost:4318{path}")),
                    Protocol::Grpc => ("default", "http://localhost:4317".to_string()),
                },
            };
            check_endpoint(&url).map_err(|why| bad(name, &url, &why))?;
            Ok(url)
        };
        let traces_endpoint = signal("/v1/traces", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")?;
        let metrics_endpoint = signal("/v1/metrics", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")?;
        let number = |name: &str| -> Result<Option<u64>, TelemetryError> {
            var(name)
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| bad(name, &v, "not a whole number"))
                })
                .transpose()
        };
        let batch_size = match config.batch_size {
            Some(n) => n,
            None => number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")?.map_or(512, |n| n.max(1) as usize),
        };
        let queue_size = match config.queue_size {
            Some(n) => n,
            None => number("OTEL_BSP_MAX_QUEUE_SIZE")?.map_or(2048, |n| n.max(1) as usize),
        }
        .max(batch_size);
        let ms = |set: Option<u64>, name: &str, default: u64| -> Result<Duration, TelemetryError> {
            Ok(Duration::from_millis(match set {
                Some(v) => v,
                None => number(name)?.unwrap_or(default).max(1),
            }))
        };
        let capture_content = match config.capture_content {
            Some(c) => c,
            None => var("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        };
        let public_url = match &config.public_url {
            Some(url) => url.trim_end_matches('/').to_string(),
            None => format!("http://{listen}"),
        };
        let trace_headers = trace_headers(config, &var)?;
        Ok(Some(Settings {
            protocol,
            traces_endpoint,
            metrics_endpoint,
            headers: config.headers.clone(),
            trace_headers,
            service_name: config
                .service_name
                .clone()
                .or_else(|| var("OTEL_SERVICE_NAME"))
                .unwrap_or_else(|| "promptd".into()),
            resource: config.resource.clone(),
            sample_ratio: config.sample_ratio.unwrap_or(1.0),
            batch_size,
            queue_size,
            batch_delay: ms(config.batch_delay_ms, "OTEL_BSP_SCHEDULE_DELAY", 1000)?,
            timeout: ms(config.timeout_ms, "OTEL_EXPORTER_OTLP_TIMEOUT", 10_000)?,
            capture_content,
            metrics: config.metrics.unwrap_or(true),
            metrics_interval: ms(
                config.metrics_interval_ms,
                "OTEL_METRIC_EXPORT_INTERVAL",
                60_000,
            )?,
            reply_wait: Duration::from_millis(
                config.reply_wait_ms.unwrap_or(DEFAULT_REPLY_WAIT_MS),
            ),
            public_url,
            call_spans: config.call_spans.unwrap_or(false),
        }))
    }
}

/// The export protocol: `[telemetry] protocol`, else `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else
/// `OTEL_EXPORTER_OTLP_PROTOCOL`, else OTLP/HTTP with protobuf.
fn protocol(
    config: &TelemetryConfig,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Protocol, TelemetryError> {
    Ok(match config.protocol {
        Some(p) => p,
        None => match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        {
            None => Protocol::HttpProtobuf,
            Some(v) => Protocol::parse(&v).ok_or_else(|| {
                TelemetryError::Config(format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL=`{v}`: promptd exports `http/protobuf` or `grpc`"
                ))
            })?,
        },
    })
}

/// The headers trace exports carry: `OTEL_EXPORTER_OTLP_HEADERS`, then
/// `OTEL_EXPORTER_OTLP_TRACES_HEADERS`, then `[telemetry] headers`, each later one winning.
fn trace_headers(
    config: &TelemetryConfig,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, String>, TelemetryError> {
    let mut headers = BTreeMap::new();
    for name in [
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    ] {
        if let Some(v) = var(name) {
            headers.extend(
                parse_headers(&v)
                    .map_err(|why| TelemetryError::Config(format!("{name}=`{v}`: {why}")))?,
            );
        }
    }
    headers.extend(config.headers.clone());
    Ok(headers)
}

/// `OTEL_EXPORTER_OTLP_HEADERS`'s form: `name=value` pairs split by commas, each value
/// percent-encoded (the OpenTelemetry environment specification).
fn parse_headers(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not name=value"))?;
            let name = name.trim();
            if name.is_empty() {
                return Err(format!("`{pair}` has no name"));
            }
            Ok((name.to_string(), percent_decoded(value.trim())?))
        })
        .collect()
}

fn percent_decoded(value: &str) -> Result<String, String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("`{value}` has a `%` not followed by two hex digits"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{value}` decodes to bytes that are not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(config: &str, env: &[(&str, &str)]) -> Result<Option<Settings>, TelemetryError> {
        let config: TelemetryConfig = toml_config(config);
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::resolve(&config, &|k| env.get(k).cloned(), "127.0.0.1:8417")
    }

    fn toml_config(text: &str) -> TelemetryConfig {
        let config = promptd_core::config::Config::parse(text, "test").expect("config");
        config.telemetry
    }

    #[test]
    fn off_unless_enabled_and_not_disabled_by_the_environment() {
        assert_eq!(resolve("", &[]).unwrap(), None);
        assert_eq!(
            resolve(
                "[telemetry]\nenabled = true\n",
                &[("OTEL_SDK_DISABLED", "true")]
            )
            .unwrap(),
            None
        );
        assert!(resolve("[telemetry]\nenabled = true\n", &[])
            .unwrap()
            .is_some());
    }

    #[test]
    fn the_config_wins_then_the_environment_then_the_default() {
        let s = resolve("[telemetry]\nenabled = true\n", &[])
            .unwrap()
            .unwrap();
        assert_eq!(s.traces_endpoint, "http://localhost:4318/v1/traces");
        assert_eq!(s.metrics_endpoint, "http://localhost:4318/v1/metrics");
        assert_eq!((s.batch_size, s.queue_size), (512, 2048));
        assert!(!s.capture_content);
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://traces:9999/custom",
            ),
            ("OTEL_SERVICE_NAME", "agents"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "64"),
            ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true"),
        ];
        let s = resolve("[telemetry]\nenabled = true\n", &env)
            .unwrap()
            .unwrap();
        assert_eq!(s.traces_endpoint, "http://traces:9999/custom");
        assert_eq!(s.metrics_endpoint, "http://collector:4318/v1/metrics");
        assert_eq!((s.service_name.as_str(), s.batch_size), ("agents", 64));
        assert!(s.capture_content);
        let s = resolve(
            "[telemetry]\nenabled = true\nendpoint = \"http://127.0.0.1:6006\"\nservice_name = \"mine\"\ncapture_content = false\n",
            &env,
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.traces_endpoint, "http://127.0.0.1:6006/v1/traces");
        assert_eq!(s.service_name, "mine");
        assert!(!s.capture_content);
        let s = resolve(
            "[telemetry]\nenabled = true\n",
            &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (s.protocol, s.traces_endpoint.as_str()),
            (Protocol::Grpc, "http://localhost:4317")
        );
    }

    #[test]
    fn bad_settings_are_refused_naming_the_key() {
        let e = resolve(
            "[telemetry]\nenabled = true\n",
            &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && e.contains("http/json"),
            "{e}"
        );
        let e = resolve(
            "[telemetry]\nenabled = true\n",
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://x:4318")],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("TLS"), "{e}");
        let e = resolve(
            "[telemetry]\nenabled = true\n",
            &[("OTEL_BSP_MAX_QUEUE_SIZE", "lots")],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("OTEL_BSP_MAX_QUEUE_SIZE"), "{e}");
        for (text, needle) in [
            ("sample_ratio = 1.5", "sample_ratio"),
            ("endpoint = \"https://api.example.com\"", "TLS"),
            ("endpoint = \"localhost:4318\"", "http:// URL"),
            ("batch_size = 10\nqueue_size = 5", "batch_size"),
            (
                "protocol = \"http/json\"",
                "expected `http/protobuf` or `grpc`",
            ),
            ("headers = { \"bad header\" = \"x\" }", "bad header"),
            ("colour = \"blue\"", "colour"),
        ] {
            let text = format!("[telemetry]\nenabled = true\n{text}\n");
            let e = promptd_core::config::Config::parse(&text, "test")
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn trace_headers_come_from_the_environment_then_the_config() {
        let s = resolve(
            "[telemetry]\nenabled = true\nheaders = { tenant = \"from-config\" }\n",
            &[
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    " api-key = a%20b%2Cc , tenant=env ,",
                ),
                ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "api-key=traces-only"),
            ],
        )
        .unwrap()
        .unwrap();
        let headers: Vec<(&str, &str)> = s
            .trace_headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            headers,
            [("api-key", "traces-only"), ("tenant", "from-config")]
        );
        let s = resolve(
            "[telemetry]\nenabled = true\n",
            &[("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b%2Cc")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            s.trace_headers.get("api-key").map(String::as_str),
            Some("a b,c")
        );
        for bad in ["novalue", "=x", "k=%zz", "k=%ff"] {
            let e = resolve(
                "[telemetry]\nenabled = true\n",
                &[("OTEL_EXPORTER_OTLP_HEADERS", bad)],
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{bad}: {e}");
        }
    }
}
