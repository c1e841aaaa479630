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
use promptd_core::gateway::{sigv4, Provider};

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
        let mut forwarded = forwarded_headers(upstream, headers);
        if let Some(Ok((credentials, region))) = aws_credentials(upstream) {
            sign(&mut forwarded, &uri, &body, &credentials, &region);
        }
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

/// The headers of the client's own SigV4 signature (and what it signed with): never forwarded,
/// since the gateway changes what they sign (G9).
const AWS_SIGNATURE: [&str; 4] = [
    "authorization",
    "x-amz-date",
    "x-amz-security-token",
    "x-amz-content-sha256",
];

/// A Bedrock upstream's credentials and region read from the environment its config names:
/// `None` when it names none; an error naming the variable not set.
pub(crate) fn aws_credentials(
    upstream: &UpstreamConfig,
) -> Option<Result<(sigv4::Credentials, String), String>> {
    if upstream.provider != Provider::Bedrock {
        return None;
    }
    let (id, secret) = (
        upstream.aws_access_key_id_env.as_deref()?,
        upstream.aws_secret_access_key_env.as_deref()?,
    );
    let region = upstream.aws_region.clone()?;
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("the environment variable `{name}` is not set"))
    };
    let read = || -> Result<(sigv4::Credentials, String), String> {
        let token = match upstream.aws_session_token_env.as_deref() {
            Some(name) => Some(var(name)?),
            None => None,
        };
        Ok((
            sigv4::Credentials {
                access_key_id: var(id)?,
                secret_access_key: var(secret)?,
                session_token: token,
            },
            region,
        ))
    };
    Some(read())
}

/// Signs the request for Bedrock (service `bedrock`) with the gateway's credentials: the
/// headers signed are `host`, `content-type` and `x-amz-date` (and the session token's).
fn sign(
    headers: &mut HeaderMap,
    uri: &Uri,
    body: &[u8],
    credentials: &sigv4::Credentials,
    region: &str,
) {
    let host = uri
        .authority()
        .map(|a| a.as_str())
        .unwrap_or("")
        .to_string();
    let mut signed = vec![("host".to_string(), host.clone())];
    if let Some(kind) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    {
        signed.push(("content-type".into(), kind.to_string()));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let request = sigv4::Request {
        method: "POST",
        path: uri.path(),
        query: uri.query().unwrap_or(""),
        headers: signed,
        body,
    };
    let out = sigv4::sign(
        &request,
        credentials,
        region,
        "bedrock",
        &sigv4::amz_date(now),
    );
    let mut put = |name: &'static str, value: &str| {
        if let Ok(mut value) = HeaderValue::from_str(value) {
            value.set_sensitive(true);
            headers.insert(HeaderName::from_static(name), value);
        }
    };
    put("host", &host);
    put("x-amz-date", &out.amz_date);
    put("authorization", &out.authorization);
    if let Some(token) = &out.security_token {
        put("x-amz-security-token", token);
    }
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
        // The client's signature no longer matches what goes (G9): never forwarded.
        if upstream.provider == Provider::Bedrock && AWS_SIGNATURE.contains(&n) {
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
            // A Bedrock API key is a bearer token.
            Provider::Openai | Provider::Bedrock => {
                (header::AUTHORIZATION, format!("Bearer {key}"))
            }
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
