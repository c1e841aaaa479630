//! Forwarding to an upstream (G2): one pooled HTTP client, the client's headers passed on
//! unchanged but the hop-by-hop ones (RFC 9110 §7.6.1), promptd's own (`x-promptd-*`) and,
//! when the config supplies a key, the client's credential.

use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use promptd_core::config::gateway::{GatewayConfig, UpstreamConfig};
use promptd_core::config::gateway::{DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_RESPONSE_TIMEOUT_MS};
use promptd_core::gateway::Provider;

use super::errors::GatewayRefusal;

/// Headers that belong to one connection (RFC 9110 §7.6.1), and `host` and `content-length`,
/// which the forwarded request sets for itself.
const HOP_BY_HOP: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// Whether the gateway keeps `name` from the upstream (requests) or the client (replies).
pub(crate) fn hop_by_hop(name: &HeaderName, connection: &HeaderMap) -> bool {
    let n = name.as_str();
    HOP_BY_HOP.contains(&n)
        || n == "content-length"
        // Headers the `Connection` header names are this hop's too.
        || connection
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|v| v.trim().eq_ignore_ascii_case(n))
}

/// The pooled client the gateway forwards with.
pub(crate) struct Upstreams {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    response_timeout: Duration,
}

/// Why the upstream gave no reply.
pub(crate) enum Failure {
    /// No connection (refused, reset, unreachable, or no status line).
    Unreachable(String),
    /// No status line within the response timeout.
    TimedOut(Duration),
}

impl Upstreams {
    /// A client with `config`'s timeouts (read at start).
    pub(crate) fn new(config: &GatewayConfig) -> Upstreams {
        let mut connector = HttpConnector::new();
        connector.enforce_http(false); // https:// goes through the TLS layer below
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_millis(
            config
                .connect_timeout_ms
                .unwrap_or(DEFAULT_CONNECT_TIMEOUT_MS),
        )));
        // https:// upstreams over TLS (rustls, the Mozilla roots compiled in); http:// as is.
        let connector = HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(64)
            .build(connector);
        Upstreams {
            client,
            response_timeout: Duration::from_millis(
                config
                    .response_timeout_ms
                    .unwrap_or(DEFAULT_RESPONSE_TIMEOUT_MS),
            ),
        }
    }

    /// Sends `body` to `upstream` at `path_and_query` with the client's `headers`; a
    /// connection that fails before any byte of the request went out is tried once more.
    pub(crate) async fn send(
        &self,
        upstream: &UpstreamConfig,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<hyper::Response<Incoming>, Failure> {
        let uri: Uri = format!(
            "{}{path_and_query}",
            upstream.base_url.trim_end_matches('/')
        )
        .parse()
        .map_err(|e| Failure::Unreachable(format!("its URL is not valid: {e}")))?;
        let forwarded = forwarded_headers(upstream, headers);
        let mut tries = 0;
        loop {
            tries += 1;
            let mut request = Request::builder()
                .method(Method::POST)
                .uri(uri.clone())
                .body(Full::new(body.clone()))
                .map_err(|e| Failure::Unreachable(e.to_string()))?;
            *request.headers_mut() = forwarded.clone();
            let sent = tokio::time::timeout(self.response_timeout, self.client.request(request));
            match sent.await {
                Err(_) => return Err(Failure::TimedOut(self.response_timeout)),
                Ok(Ok(response)) => return Ok(response),
                Ok(Err(e)) if e.is_connect() && tries < 2 => continue,
                Ok(Err(e)) => return Err(Failure::Unreachable(describe(&e))),
            }
        }
    }
}

/// A client error's chain of causes in one line (hyper's own message says little).
fn describe(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The client's headers as they go upstream.
fn forwarded_headers(upstream: &UpstreamConfig, headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len() + 1);
    let key = upstream
        .api_key_env
        .as_deref()
        .and_then(|var| std::env::var(var).ok())
        .filter(|k| !k.is_empty());
    for (name, value) in headers {
        let n = name.as_str();
        if hop_by_hop(name, headers) || n.starts_with("x-promptd-") {
            continue;
        }
        if key.is_some()
            && (name == header::AUTHORIZATION || n == "x-api-key" || n == "x-goog-api-key")
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    if let Some(key) = key {
        let (name, value) = match upstream.provider {
            Provider::Anthropic => (HeaderName::from_static("x-api-key"), key),
            Provider::Gemini => (HeaderName::from_static("x-goog-api-key"), key),
            Provider::Openai => (header::AUTHORIZATION, format!("Bearer {key}")),
        };
        if let Ok(mut value) = HeaderValue::from_str(&value) {
            value.set_sensitive(true);
            out.insert(name, value);
        }
    }
    out
}

impl Failure {
    /// The provider-shaped answer a proxy gives: 502, or 504 for a time-out.
    pub(crate) fn refusal(&self, provider: Provider, name: &str) -> GatewayRefusal {
        match self {
            Failure::Unreachable(why) => GatewayRefusal::new(
                provider,
                StatusCode::BAD_GATEWAY,
                "upstream_unreachable",
                format!("upstream `{name}` gave no reply: {why}"),
            ),
            Failure::TimedOut(after) => GatewayRefusal::new(
                provider,
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                format!(
                    "upstream `{name}` sent no status line within {} ms ([gateway] response_timeout_ms)",
                    after.as_millis()
                ),
            ),
        }
    }
}
