//! G13: tools promptd runs itself (an MCP server's), in a gateway request. When the model
//! calls only such tools, promptd runs them, records call and result, and asks the upstream
//! again — each round a step of the session, its body the client's with the rounds before
//! appended — until the reply is text or calls the client's tools; the client sees the last
//! reply. A reply mixing both is shown with promptd's calls taken out; its calls and results,
//! and every round before it, are put back at their place into the client's later bodies
//! ([`Restores`]), so the upstream sees a valid conversation, the same bytes every request.
//! The pure pieces are `promptd_core::gateway::own_tools`.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde_json::Value;

use promptd_core::conversation::content::Content;
use promptd_core::conversation::Message;
use promptd_core::gateway::body::{ClientBody, Spans};
use promptd_core::gateway::messages::{conversation as read_conversation, Conversation};
use promptd_core::gateway::own_tools::{self, Call, Ran, Restore, MAX_RESTORES};
use promptd_core::gateway::splice::{Edit, Splice};
use promptd_core::gateway::stream::{unasked_usage, Frame, Frames, Reassembly};
use promptd_core::gateway::{GatewayError, Ingress};

use super::reply::Reply;
use super::tee::mark_partial;
use super::upstream::hop_by_hop;
use super::{
    now_ms, Gateway, GatewayRefusal, Read, Stepped, Timing, MAX_REPLY_BYTES, SESSION_HEADER,
};
use crate::outcome::RecordRequest;

/// The largest message the MCP client (rmcp) reads from a stdio server, in MiB: a longer one
/// is dropped, so a call whose answer is longer never gets one.
const STDIO_MESSAGE_MIB: usize = 16;

/// Most sessions whose restores are held; beyond, the least recently used is dropped (its
/// later requests then go as the client sends them: valid, a colder cache).
const MAX_SESSIONS: usize = 1024;
/// Most bytes the restores of all sessions hold; beyond, the least recently used sessions'
/// go first (then a session's oldest).
const MAX_HELD_BYTES: usize = 64 << 20;

/// What each session's later requests get back of promptd's own tool calls, in memory
/// (bounded: [`MAX_SESSIONS`] sessions of [`MAX_RESTORES`] each, [`MAX_HELD_BYTES`] in all).
#[derive(Default)]
pub(super) struct Restores {
    by_session: HashMap<String, Vec<Arc<Restore>>>,
    order: VecDeque<String>,
    bytes: usize,
}

impl Restores {
    /// Session `session`'s restores, oldest first.
    pub(super) fn of(&self, session: &str) -> Vec<Arc<Restore>> {
        self.by_session.get(session).cloned().unwrap_or_default()
    }

    fn add(&mut self, session: &str, restore: Restore) {
        self.bytes += restore.bytes();
        let held = self.by_session.entry(session.to_string()).or_default();
        held.push(Arc::new(restore));
        if held.len() > MAX_RESTORES {
            let old = held.remove(0);
            self.bytes -= old.bytes();
        }
        self.order.retain(|s| s != session);
        self.order.push_back(session.to_string());
        while self.order.len() > MAX_SESSIONS || self.bytes > MAX_HELD_BYTES {
            let Some(oldest) = self.order.front().cloned() else {
                break;
            };
            let Some(held) = self.by_session.get_mut(&oldest) else {
                self.order.pop_front();
                continue;
            };
            // The session itself, when others are older (or there are too many); else its
            // oldest restore.
            if held.len() > 1 && self.order.len() == 1 {
                let old = held.remove(0);
                self.bytes -= old.bytes();
                continue;
            }
            for old in self.by_session.remove(&oldest).unwrap_or_default() {
                self.bytes -= old.bytes();
            }
            self.order.pop_front();
        }
    }
}

/// A client's body with promptd's earlier calls put back ([`restored`]).
pub(super) struct Restored {
    /// The body the step takes.
    pub(super) body: String,
    /// Where its members sit.
    pub(super) spans: Spans,
    /// Its conversation.
    pub(super) conversation: Conversation,
    /// The insertions made (none: `body` is the client's).
    pub(super) edits: Vec<Edit>,
    /// The body again, when any insertion was made (the next rounds append to it).
    pub(super) again: Option<String>,
}

/// The client's body (with its spans and conversation) with `held` put back.
pub(super) fn restored(
    ingress: Ingress,
    client_body: String,
    spans: Spans,
    conversation: Conversation,
    held: &[Arc<Restore>],
) -> Result<Restored, GatewayError> {
    let unchanged = |body, spans, conversation| Restored {
        body,
        spans,
        conversation,
        edits: Vec::new(),
        again: None,
    };
    if held.is_empty() {
        return Ok(unchanged(client_body, spans, conversation));
    }
    let body = ClientBody::with_spans(&client_body, spans);
    let edits = own_tools::restore(ingress, &body, &conversation, held);
    if edits.is_empty() {
        let spans = body.into_spans();
        return Ok(unchanged(client_body, spans, conversation));
    }
    drop(body);
    let splice = Splice {
        edits: edits.clone(),
        ..Splice::default()
    };
    let text = String::from_utf8(splice.apply(client_body.as_bytes()))
        .map_err(|_| GatewayError::InvalidBody("the restored body is not UTF-8".into()))?;
    let parsed = ClientBody::parse(text.as_bytes())?;
    let (spans, conversation) = (parsed.spans(), read_conversation(ingress, &parsed));
    drop(parsed);
    Ok(Restored {
        body: text.clone(),
        spans,
        conversation,
        edits,
        again: Some(text),
    })
}

/// A round's reply as read.
struct Got {
    /// The reply (a stream folded into it).
    reply: Value,
    /// An unstreamed reply's bytes.
    bytes: Bytes,
    /// A streamed reply's frames.
    frames: Option<Vec<Frame>>,
    /// Why a stream is partial, when it is.
    partial: Option<String>,
}

/// One client request whose agent has tools promptd runs itself.
pub(super) struct Loop {
    pub(super) gateway: Arc<Gateway>,
    pub(super) ingress: Ingress,
    pub(super) session: String,
    /// The client's request as it came (its conversation as the client sent it).
    pub(super) read: Read,
    pub(super) headers: HeaderMap,
    pub(super) path_and_query: String,
    /// The tools promptd runs itself, by name.
    pub(super) own: Vec<String>,
    /// The body the first step took (the client's, with earlier rounds put back).
    pub(super) base: String,
    /// promptd asked a Chat stream for usage the client did not: the client is not shown it.
    pub(super) usage_added: bool,
    pub(super) timing: Timing,
}

impl Loop {
    fn refusal(&self, status: StatusCode, code: &'static str, message: String) -> Response {
        GatewayRefusal::new(self.ingress.provider(), status, code, message).into_response()
    }

    fn reply(&self, sent_at: u64) -> Reply {
        Reply {
            gateway: self.gateway.clone(),
            ingress: self.ingress,
            session: Some(self.session.clone()),
            scope: super::index::scope(
                &self.read.agent,
                self.read.key.as_ref().map(|k| k.name.as_str()),
            ),
            // Each round's reply costs its key (G12).
            key: self.read.key.as_ref().map(|k| k.name.clone()),
            sent_at,
            degraded: None,
            _pending: None,
            timing: Timing {
                parse: self.timing.parse,
                step: self.timing.step,
                record: self.timing.record,
            },
        }
    }

    /// Sends `upstream` (the first step's body), runs promptd's calls round by round, and
    /// answers the client.
    pub(super) async fn run(mut self, upstream: String) -> Response {
        let bounds = self.read.settings.tool_bounds;
        let agent = self.read.agent.clone();
        let mut upstream = upstream;
        let mut body = std::mem::take(&mut self.base);
        let mut before: Vec<String> = Vec::new();
        let mut rounds = 0u32;
        loop {
            let sent_at = now_ms();
            let sent = (self.gateway.upstreams)
                .send(
                    &self.read.upstream,
                    &self.path_and_query,
                    &self.headers,
                    Bytes::from(std::mem::take(&mut upstream)),
                )
                .await;
            let response = match sent {
                Ok(response) => response,
                Err(failure) => {
                    let refusal =
                        failure.refusal(self.ingress.provider(), &self.read.upstream_name);
                    let reason = refusal.message.clone();
                    self.reply(sent_at).record(Value::Null, Some(&reason)).await;
                    return refusal.into_response();
                }
            };
            if !response.status().is_success() {
                // The upstream's own answer goes to the client as it came, recorded (G2).
                return self.reply(sent_at).answer(response, false).await;
            }
            let (parts, incoming) = response.into_parts();
            let got = match self.read.streamed {
                true => self.read_stream(incoming).await,
                false => self.read_whole(incoming).await,
            };
            let Got {
                reply,
                bytes,
                frames,
                partial,
            } = match got {
                Ok(got) => got,
                Err(refusal) => return refusal,
            };
            // Recorded before promptd answers any of its calls: the log holds the call first.
            let logged = (self.reply(sent_at))
                .record(reply.clone(), partial.as_deref())
                .await;
            let calls = match partial {
                // A stream that broke: the client gets it as it came, no call of it is run.
                Some(_) => Vec::new(),
                None => own_tools::calls(self.ingress, &reply),
            };
            let (mine, theirs): (Vec<Call>, Vec<Call>) =
                calls.into_iter().partition(|c| self.own.contains(&c.name));
            if mine.is_empty() {
                if !before.is_empty() {
                    self.keep(before, &reply, &[], &[]);
                }
                let body = match frames {
                    Some(frames) => self.shown(frames),
                    None => bytes,
                };
                return self.respond(&parts.headers, parts.status, body);
            }
            let names: Vec<&str> = mine.iter().map(|c| c.name.as_str()).collect();
            if rounds >= bounds.max_rounds {
                return self.refusal(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "own_tool_rounds",
                    format!(
                        "the model went on calling tools promptd runs itself ({}) after {rounds} rounds in one request ([agents.{agent}.gateway] max_tool_rounds = {}); every round is in session {}'s log, the last calls unanswered",
                        names.join(", "),
                        bounds.max_rounds,
                        self.session
                    ),
                );
            }
            let mut ran = Vec::with_capacity(mine.len());
            for call in &mine {
                // Its result is recorded under the id the log gave the call (a Gemini call
                // may have come without one).
                let logged = logged.get(call.nth).filter(|id| !id.is_empty());
                let logged = logged.cloned().unwrap_or_else(|| call.id.clone());
                match self.run_one(call, &logged, bounds).await {
                    Ok(result) => ran.push(result),
                    Err(refusal) => return refusal,
                }
            }
            if !theirs.is_empty() {
                self.keep(before, &reply, &mine, &ran);
                let body = match frames {
                    Some(frames) => {
                        self.shown(own_tools::frames_for_client(self.ingress, frames, &mine))
                    }
                    None => {
                        let shown = own_tools::for_client(self.ingress, &reply, &mine);
                        Bytes::from(shown.to_string())
                    }
                };
                return self.respond(&parts.headers, parts.status, body);
            }
            rounds += 1;
            let added = own_tools::round_messages(self.ingress, &reply, &ran);
            body = match own_tools::appended(self.ingress, &body, &added) {
                Ok(body) => body,
                Err(e) => return self.refusal(StatusCode::BAD_REQUEST, e.code(), e.to_string()),
            };
            // Each round's body grows by the model's turn and the results: bounded as a
            // client's body is.
            let limit = self.gateway.daemon.config().gateway.max_body_bytes();
            if body.len() as u64 > limit {
                return self.refusal(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!(
                        "round {rounds}'s body, with the results of {}, is {} bytes, over {limit} ([gateway] max_body_bytes)",
                        names.join(", "),
                        body.len()
                    ),
                );
            }
            before.extend(added);
            upstream = match self.step(&body, rounds).await {
                Ok(upstream) => upstream,
                Err(refusal) => return refusal,
            };
        }
    }

    /// A whole (unstreamed) reply.
    async fn read_whole(&self, incoming: hyper::body::Incoming) -> Result<Got, Response> {
        let read = tokio::time::timeout(
            self.gateway.idle,
            http_body_util::Limited::new(incoming, MAX_REPLY_BYTES).collect(),
        )
        .await;
        let bytes = match read {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(e)) => {
                return Err(self.refusal(
                    StatusCode::BAD_GATEWAY,
                    "upstream_reply",
                    format!("the upstream's reply could not be read: {e}"),
                ))
            }
            Err(_) => {
                return Err(self.refusal(
                    StatusCode::GATEWAY_TIMEOUT,
                    "upstream_timeout",
                    "the upstream's reply stalled ([gateway] idle_timeout_ms)".into(),
                ))
            }
        };
        let Ok(reply) = serde_json::from_slice::<Value>(&bytes) else {
            return Err(self.refusal(
                StatusCode::BAD_GATEWAY,
                "upstream_reply",
                "the upstream's reply is not JSON".into(),
            ));
        };
        Ok(Got {
            reply,
            bytes,
            frames: None,
            partial: None,
        })
    }

    /// A streamed round, read whole (at most [`MAX_REPLY_BYTES`]): whether it is the client's
    /// to see is known only once it ended (G13: the client gets the final round's frames).
    async fn read_stream(&self, mut incoming: hyper::body::Incoming) -> Result<Got, Response> {
        let mut cut = Frames::default();
        let mut frames = Vec::new();
        let mut folded = Reassembly::new(self.ingress);
        let (mut held, mut partial) = (0usize, None);
        loop {
            let data = match super::tee::next_data(&mut incoming, self.gateway.idle).await {
                Ok(Some(data)) => data,
                Ok(None) => break,
                Err(why) => {
                    partial = Some(why);
                    break;
                }
            };
            held += data.len();
            if held > MAX_REPLY_BYTES {
                return Err(self.refusal(
                    StatusCode::BAD_GATEWAY,
                    "upstream_reply",
                    format!("a round's stream passed {MAX_REPLY_BYTES} bytes (promptd holds a round whole to know whether it is the client's)"),
                ));
            }
            match cut.push(&data) {
                Ok(complete) => {
                    for frame in complete {
                        folded.push(&frame);
                        frames.push(frame);
                    }
                }
                Err(e) => {
                    partial = Some(e.to_string());
                    break;
                }
            }
        }
        let ended = folded.finish();
        let mut reply = ended.reply;
        let partial = partial
            .or(ended.error)
            .or_else(|| (!ended.complete).then(|| "the stream ended before its end event".into()));
        if let Some(reason) = &partial {
            mark_partial(self.ingress, &mut reply, reason);
        }
        Ok(Got {
            reply,
            bytes: Bytes::new(),
            frames: Some(frames),
            partial,
        })
    }

    /// The bytes of `frames` the client sees: as they came, but for the usage promptd asked a
    /// Chat stream for that the client did not (G5).
    fn shown(&self, frames: Vec<Frame>) -> Bytes {
        let mut out = Vec::new();
        for frame in frames {
            if self.usage_added && self.ingress == Ingress::ChatCompletions {
                if let Some(raw) = unasked_usage(&frame) {
                    out.extend_from_slice(&raw);
                }
            } else {
                out.extend_from_slice(&frame.raw);
            }
        }
        Bytes::from(out)
    }

    /// Runs one of promptd's calls within the bounds, and records its result (G13). A call
    /// past `tool_timeout_ms` or an output over `max_tool_output_bytes` refuses the request,
    /// naming the tool; its result is recorded as that error, so no call is left open.
    async fn run_one(
        &self,
        call: &Call,
        logged: &str,
        bounds: promptd_core::config::gateway::ToolBounds,
    ) -> Result<Ran, Response> {
        let agent = &self.read.agent;
        let ran = match self.gateway.daemon.tool_runner(&call.name) {
            // Gone since the step (its server's config dropped): the model reads why.
            None => Ok(Ran {
                id: call.id.clone(),
                name: call.name.clone(),
                content: format!("promptd has no runner for tool `{}` now", call.name),
                is_error: true,
            }),
            Some((plugin, runner)) => {
                let (name, arguments) = (call.name.clone(), call.arguments.clone());
                let task = tokio::task::spawn_blocking(move || runner.run(&name, &arguments));
                let limit = Duration::from_millis(bounds.timeout_ms);
                match tokio::time::timeout(limit, task).await {
                    Err(_) => Err((
                        StatusCode::GATEWAY_TIMEOUT,
                        "own_tool_timeout",
                        format!(
                            "tool `{}` ({plugin}) gave no answer within [agents.{agent}.gateway] tool_timeout_ms = {} (it ran long, or its answer never came: the MCP client drops a stdio message over {} MiB)",
                            call.name,
                            bounds.timeout_ms,
                            STDIO_MESSAGE_MIB
                        ),
                    )),
                    Ok(Err(e)) => Err((
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        format!("tool `{}` ({plugin}) did not finish: {e}", call.name),
                    )),
                    Ok(Ok(outcome)) if outcome.content.len() as u64 > bounds.max_output_bytes => {
                        Err((
                            StatusCode::BAD_GATEWAY,
                            "own_tool_output",
                            format!(
                                "tool `{}` ({plugin}) gave {} bytes of output, over [agents.{agent}.gateway] max_tool_output_bytes = {}",
                                call.name,
                                outcome.content.len(),
                                bounds.max_output_bytes
                            ),
                        ))
                    }
                    Ok(Ok(outcome)) => Ok(Ran {
                        id: call.id.clone(),
                        name: call.name.clone(),
                        content: outcome.content,
                        is_error: outcome.is_error,
                    }),
                }
            }
        };
        let (recorded, answer) = match ran {
            Ok(ran) => (ran.clone(), Ok(ran)),
            Err((status, code, message)) => (
                Ran {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    content: format!("promptd refused this call: {message}"),
                    is_error: true,
                },
                Err(self.refusal(status, code, message)),
            ),
        };
        self.record_result(&recorded, logged).await;
        answer
    }

    /// Records one result as the tool message of the call the log names `logged`.
    async fn record_result(&self, ran: &Ran, logged: &str) {
        let message = Message::Tool {
            tool_call_id: logged.to_string(),
            content: Content::Text(ran.content.clone()),
            is_error: ran.is_error,
        };
        let (gateway, session) = (self.gateway.clone(), self.session.clone());
        let recorded = tokio::task::spawn_blocking(move || {
            gateway
                .daemon
                .record(RecordRequest::message(session, message))
        })
        .await;
        match recorded {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(
                code = e.code(),
                "gateway: a tool result of promptd's was not recorded: {e}"
            ),
            Err(e) => tracing::warn!("gateway: recording a tool result did not finish: {e}"),
        }
    }

    /// Keeps what the client's later requests get back: the rounds `before` the reply the
    /// client is shown, and promptd's calls in it with their results.
    fn keep(&self, before: Vec<String>, reply: &Value, own: &[Call], ran: &[Ran]) {
        // Where the reply lands in the client's next body: after the messages it sent.
        let anchor = ClientBody::parse(self.read.client_body.as_bytes())
            .ok()
            .and_then(|b| own_tools::anchor(self.ingress, &b));
        let Some(anchor) = anchor else {
            return;
        };
        let restore = Restore::new(
            self.ingress,
            &self.read.conversation,
            anchor,
            before,
            reply,
            own,
            ran,
        );
        crate::lock(&self.gateway.restores).add(&self.session, restore);
    }

    /// The next round: a step of the session with `body` (G13), its upstream body back.
    async fn step(&self, body: &str, round: u32) -> Result<String, Response> {
        let parsed = match ClientBody::parse(body.as_bytes()) {
            Ok(parsed) => parsed,
            Err(e) => return Err(self.refusal(StatusCode::BAD_REQUEST, e.code(), e.to_string())),
        };
        let read = Read {
            conversation: read_conversation(self.ingress, &parsed),
            spans: parsed.spans(),
            client_body: body.to_string(),
            round,
            ..self.read.clone()
        };
        drop(parsed);
        let mut headers = self.headers.clone();
        if let Ok(v) = HeaderValue::from_str(&self.session) {
            headers.insert(SESSION_HEADER, v);
        }
        let (gateway, ingress) = (self.gateway.clone(), self.ingress);
        let stepped =
            tokio::task::spawn_blocking(move || gateway.step(ingress, &headers, read)).await;
        match stepped {
            Ok(Ok(Stepped::Spliced { body, .. })) => Ok(body),
            // The rounds' plugins failed and the agent forwards: the body goes as the round
            // made it, without the plugins' parts (and without promptd's tools: the model
            // then answers with what it has).
            Ok(Ok(Stepped::Degraded(_))) => Ok(body.to_string()),
            Ok(Err(refusal)) => Err(refusal.into_response()),
            Err(e) => Err(self.refusal(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("the round's step did not finish: {e}"),
            )),
        }
    }

    /// The client's answer: the last reply (or the one it is shown), with the upstream's
    /// headers but the hop-by-hop ones, the session and `server-timing`.
    fn respond(&self, upstream: &HeaderMap, status: StatusCode, bytes: Bytes) -> Response {
        let mut headers = HeaderMap::with_capacity(upstream.len() + 2);
        for (name, value) in upstream {
            if !hop_by_hop(name, upstream) {
                headers.append(name.clone(), value.clone());
            }
        }
        if let Ok(v) = HeaderValue::from_str(&self.session) {
            headers.insert(SESSION_HEADER, v);
        }
        headers.insert("server-timing", self.timing.header());
        let mut response = Response::new(Body::from(bytes));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restore(text: &str) -> Restore {
        Restore {
            before: vec![text.to_string()],
            ..Restore::default()
        }
    }

    /// G13: what is put back is bounded: per session, in sessions, and in bytes, the least
    /// recently used going first.
    #[test]
    fn g13_restores_are_bounded() {
        let mut held = Restores::default();
        for i in 0..MAX_RESTORES + 3 {
            held.add("s", restore(&i.to_string()));
        }
        let of = held.of("s");
        assert_eq!(of.len(), MAX_RESTORES);
        assert_eq!(of[0].before[0], "3", "the oldest went");
        for i in 0..MAX_SESSIONS {
            held.add(&format!("t{i}"), restore("x"));
        }
        assert!(
            held.of("s").is_empty(),
            "the least recently used session went"
        );
        assert_eq!(held.of("t0").len(), 1);
        let big = "y".repeat(MAX_HELD_BYTES / 2 + 1);
        held.add("big1", restore(&big));
        held.add("big2", restore(&big));
        assert!(held.bytes <= MAX_HELD_BYTES, "{}", held.bytes);
        assert!(held.of("big1").is_empty() && held.of("big2").len() == 1);
        assert!(held.of("t0").is_empty(), "older sessions went first");
    }
}
