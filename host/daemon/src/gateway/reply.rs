//! An upstream's reply on its way back to the client: answered whole or teed frame by frame
//! ([`super::tee`]), then recorded through [`crate::Daemon::record`] off the answer's path.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::sync::mpsc;

use promptd_core::gateway::Ingress;

use super::tee::{mark_partial, Tee};
use super::upstream::hop_by_hop;
use super::{Gateway, GatewayRefusal, Pending, Timing, MAX_REPLY_BYTES, SESSION_HEADER};
use crate::outcome::RecordRequest;
use crate::DaemonError;

/// An upstream's reply on its way back to the client.
pub(super) struct Reply {
    pub(super) gateway: Arc<Gateway>,
    pub(super) ingress: Ingress,
    pub(super) session: Option<String>,
    /// The index's scope of the request (its agent and key).
    pub(super) scope: String,
    /// The gateway key that sent it: the reply's cost is counted to it (G12).
    pub(super) key: Option<String>,
    pub(super) sent_at: u64,
    pub(super) degraded: Option<String>,
    /// Held until the reply is recorded.
    pub(super) _pending: Option<Pending>,
    pub(super) timing: Timing,
}

impl Reply {
    pub(super) async fn answer(
        self,
        response: hyper::Response<hyper::body::Incoming>,
        usage_added: bool,
    ) -> Response {
        let (parts, body) = response.into_parts();
        let event_stream = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut headers = HeaderMap::with_capacity(parts.headers.len() + 3);
        for (name, value) in &parts.headers {
            if !hop_by_hop(name, &parts.headers) {
                headers.append(name.clone(), value.clone());
            }
        }
        if let Some(session) = &self.session {
            if let Ok(v) = HeaderValue::from_str(session) {
                headers.insert(SESSION_HEADER, v);
            }
        }
        if let Some(code) = &self.degraded {
            if let Ok(code) = HeaderValue::from_str(code) {
                headers.insert("x-promptd-degraded", code);
            }
        }
        // Bedrock's stream comes in AWS's binary framing (application/vnd.amazon.eventstream).
        let event_stream = event_stream || self.ingress == Ingress::ConverseStream;
        if event_stream && parts.status.is_success() {
            headers.insert("server-timing", self.timing.header());
            return self.stream(parts.status, headers, body, usage_added);
        }
        let bytes = match tokio::time::timeout(
            self.gateway.idle,
            http_body_util::Limited::new(body, MAX_REPLY_BYTES).collect(),
        )
        .await
        {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(e)) => {
                return GatewayRefusal::new(
                    self.ingress.provider(),
                    StatusCode::BAD_GATEWAY,
                    "upstream_reply",
                    format!("the upstream's reply could not be read: {e}"),
                )
                .into_response()
            }
            Err(_) => {
                return GatewayRefusal::new(
                    self.ingress.provider(),
                    StatusCode::GATEWAY_TIMEOUT,
                    "upstream_timeout",
                    "the upstream's reply stalled ([gateway] idle_timeout_ms)",
                )
                .into_response()
            }
        };
        headers.insert("server-timing", self.timing.header());
        if parts.status.is_success() && self.ingress != Ingress::CountTokens {
            if let Ok(reply) = serde_json::from_slice::<Value>(&bytes) {
                // Recorded after the answer; the session's next step waits for it.
                tokio::spawn(async move { self.record(reply, None).await });
            }
        } else if self.ingress != Ingress::CountTokens {
            // The upstream's own refusal: the request's reply is recorded as missing, with its
            // status and error type — not its message, which may quote the client's key (an
            // OpenAI 401 shows part of it).
            // AWS says it in a header (`ValidationException:http://…`).
            let aws = (parts.headers.get("x-amzn-errortype"))
                .and_then(|v| v.to_str().ok())
                .map(|k| k.split(':').next().unwrap_or(k).chars().take(64).collect());
            let kind = aws.or_else(|| {
                serde_json::from_slice::<Value>(&bytes).ok().and_then(|v| {
                    let error = v.get("error")?;
                    // Google's shape says it in `status` (its `code` is the HTTP status).
                    let kind = (error.get("type").or_else(|| error.get("status")))
                        .or_else(|| error.get("code"))?;
                    kind.as_str()
                        .map(|k| k.chars().take(64).collect::<String>())
                })
            });
            let mut reason = format!("the upstream answered {}", parts.status.as_u16());
            if let Some(kind) = kind {
                reason.push_str(&format!(" ({kind})"));
            }
            tokio::spawn(async move { self.record(Value::Null, Some(&reason)).await });
        }
        let mut response = Response::new(Body::from(bytes));
        *response.status_mut() = parts.status;
        *response.headers_mut() = headers;
        response
    }

    /// Tees an event stream: frames to the client as they come, the folded reply recorded
    /// before the terminal frame goes.
    fn stream(
        self,
        status: StatusCode,
        headers: HeaderMap,
        body: hyper::body::Incoming,
        usage_added: bool,
    ) -> Response {
        let (tx, mut rx) = mpsc::channel::<Bytes>(16);
        let tee = Tee {
            ingress: self.ingress,
            usage_added,
            idle: self.gateway.idle,
            stall: self.gateway.stall,
        };
        tokio::spawn(async move {
            let ended = tee.run(body, &tx).await;
            drop(tx); // the client's stream ends here; the record follows
            let mut reply = ended.reply;
            if let Some(reason) = &ended.partial {
                mark_partial(self.ingress, &mut reply, reason);
            }
            self.record(reply, ended.partial.as_deref()).await;
        });
        let stream = futures_util::stream::poll_fn(move |cx| {
            rx.poll_recv(cx)
                .map(|b| b.map(Ok::<Bytes, std::convert::Infallible>))
        });
        let mut response = Response::new(Body::from_stream(stream));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }

    /// Records the reply in the request's session (not for a degraded request: its step
    /// was not recorded). The ids of its tool calls as the log names them (G13: a Gemini call
    /// that came without one is named by where it landed), none when it was not recorded.
    pub(super) async fn record(&self, reply: Value, partial: Option<&str>) -> Vec<String> {
        let Some(session) = self.session.clone() else {
            return Vec::new();
        };
        let id = reply.get("id").and_then(Value::as_str).map(str::to_string);
        let (format, sent_at) = (self.ingress.format(), self.sent_at);
        let gateway = self.gateway.clone();
        let (scope, key) = (self.scope.clone(), self.key.clone());
        let reason = partial.map(str::to_string);
        let recorded = tokio::task::spawn_blocking(move || {
            let mut request =
                match RecordRequest::reply(session.clone(), reply, Some(format), Some(sent_at)) {
                    Ok(request) => request,
                    // Nothing of a reply came (the upstream refused, or gave none): an empty reply
                    // stands for it, with why.
                    Err(_) if reason.is_some() => RecordRequest::message(
                        session.clone(),
                        promptd_core::conversation::Message::Assistant {
                            content: String::new(),
                            tool_calls: Vec::new(),
                            blocks: Vec::new(),
                            native: None,
                        },
                    ),
                    Err(e) => return Err(e),
                };
            request.partial = reason;
            let outcome = gateway.daemon.record(request)?;
            if let Some(id) = id {
                crate::lock(&gateway.index).replied(&scope, &id, &session);
            }
            if let Some(key) = &key {
                count_spend(&gateway, key, &outcome);
            }
            let calls = outcome.tool_calls.into_iter().map(|c| c.id).collect();
            Ok::<Vec<String>, DaemonError>(calls)
        })
        .await;
        match recorded {
            Ok(Ok(calls)) => return calls,
            Ok(Err(e)) => tracing::warn!(
                code = e.code(),
                partial = partial.unwrap_or(""),
                "gateway: the reply was not recorded: {e}"
            ),
            Err(e) => tracing::warn!("gateway: recording the reply did not finish: {e}"),
        }
        Vec::new()
    }
}

/// Counts what the recorded reply cost to its gateway key (G12), by the ledger's prices: a
/// reply whose model has no price counts nothing. A count that cannot be written is logged;
/// the reply stays recorded.
fn count_spend(gateway: &Gateway, key: &str, outcome: &crate::outcome::RecordOutcome) {
    let config = gateway.daemon.config();
    let pricing = promptd_core::ledger::Pricing {
        prices: &config.pricing,
        rules: &config.cache,
    };
    let cost = (outcome.usage.as_ref()).and_then(|u| pricing.cost(u, outcome.cache.as_ref()));
    let Some(cost) = cost else {
        return;
    };
    let micro = (cost.total * 1e6).round().max(0.0) as u64;
    let store = gateway.daemon.sessions.store.as_ref();
    if let Err(e) = gateway.keys.spent(store, key, micro) {
        tracing::warn!(
            key,
            "gateway: the reply's cost was not counted to its key: {e}"
        );
    }
}
