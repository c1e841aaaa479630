//! The streaming tee (G5): an upstream's server-sent events go to the client frame by frame
//! as they arrive, and the same frames fold into the one reply that is recorded once the
//! stream ends (the session's next step waits for it). Memory per stream: one frame, and the
//! reply being folded.

use std::time::Duration;

use axum::body::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;
use tokio::sync::mpsc;

use promptd_core::gateway::eventstream::Decoder;
use promptd_core::gateway::stream::{unasked_usage, Frames, Reassembly};
use promptd_core::gateway::Ingress;

/// What a stream ended as, for the record.
pub(crate) struct Ended {
    /// The reply, as far as it came.
    pub reply: Value,
    /// Why it is partial, when it is.
    pub partial: Option<String>,
}

/// How one stream is teed.
pub(crate) struct Tee {
    pub ingress: Ingress,
    /// promptd asked for usage the client did not: the client is not shown it.
    pub usage_added: bool,
    /// The longest wait for the upstream's next bytes.
    pub idle: Duration,
    /// The longest wait for a client to take the next frame.
    pub stall: Duration,
}

/// The next data of an upstream's body (trailers skipped): `Ok(None)` at its end, else why it
/// ended early (nothing for `idle`, or broken).
pub(super) async fn next_data(
    body: &mut Incoming,
    idle: Duration,
) -> Result<Option<Bytes>, String> {
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => {
                return Err(format!(
                    "the upstream sent nothing for {} ms ([gateway] idle_timeout_ms)",
                    idle.as_millis()
                ))
            }
            Ok(None) => return Ok(None),
            Ok(Some(Err(e))) => return Err(format!("the upstream's stream broke: {e}")),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            return Ok(Some(data));
        }
    }
}

impl Tee {
    /// Forwards `body`'s frames to `client`; returns what the stream amounted to.
    pub(crate) async fn run(&self, mut body: Incoming, client: &mpsc::Sender<Bytes>) -> Ended {
        let mut frames = Frames::default();
        // Bedrock's stream is AWS's binary event-stream framing, not SSE.
        let binary = self.ingress == Ingress::ConverseStream;
        let mut decoder = Decoder::default();
        let mut folded = Reassembly::new(self.ingress);
        let mut partial = None;
        'read: loop {
            let data = match next_data(&mut body, self.idle).await {
                Ok(Some(data)) => data,
                Ok(None) => break,
                Err(why) => {
                    partial = Some(why);
                    break;
                }
            };
            let shown: Vec<Vec<u8>> = if binary {
                match decoder.push(&data) {
                    Ok(complete) => (complete.into_iter())
                        .map(|frame| {
                            folded.push_event(&frame);
                            frame.raw
                        })
                        .collect(),
                    Err(e) => {
                        // A frame whose CRC fails is not the client's to see (G5).
                        partial = Some(format!("invalid stream from the upstream: {e}"));
                        break;
                    }
                }
            } else {
                match frames.push(&data) {
                    Ok(complete) => (complete.into_iter())
                        .filter_map(|frame| {
                            folded.push(&frame);
                            if self.usage_added && self.ingress == Ingress::ChatCompletions {
                                unasked_usage(&frame)
                            } else {
                                Some(frame.raw.clone())
                            }
                        })
                        .collect(),
                    Err(e) => {
                        partial = Some(e.to_string());
                        break;
                    }
                }
            };
            for shown in shown {
                match tokio::time::timeout(self.stall, client.send(Bytes::from(shown))).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => {
                        partial = Some("the client disconnected".into());
                        break 'read;
                    }
                    Err(_) => {
                        partial = Some(format!(
                            "the client read nothing for {} ms ([gateway] client_stall_ms)",
                            self.stall.as_millis()
                        ));
                        break 'read;
                    }
                }
            }
        }
        let out = folded.finish();
        if partial.is_none() && !decoder.rest().is_empty() {
            partial = Some("the stream ended inside an event-stream frame".into());
        }
        if partial.is_none() && !frames.rest().is_empty() {
            // What is left names the line that broke the framing, when one did.
            partial = Some(match frames.finish() {
                Err(e) => e.to_string(),
                Ok(()) => "the stream ended inside a frame".into(),
            });
        }
        if partial.is_none() && !out.complete {
            partial = Some(match &out.error {
                Some(e) => format!("the upstream sent an error: {e}"),
                None => "the stream ended before its last event".into(),
            });
        }
        Ended {
            reply: out.reply,
            partial,
        }
    }
}

/// Marks a partial reply with its reason where the provider's shape keeps a stop reason, so
/// the record says why it ended.
pub(crate) fn mark_partial(ingress: Ingress, reply: &mut Value, reason: &str) {
    let why = Value::String(format!("promptd: partial: {reason}"));
    match ingress {
        Ingress::Messages | Ingress::CountTokens => {
            reply["stop_reason"] = why;
        }
        Ingress::ChatCompletions => {
            if let Some(Value::Array(choices)) = reply.get_mut("choices") {
                for choice in choices {
                    choice["finish_reason"] = why.clone();
                }
            }
        }
        Ingress::Responses => {
            reply["status"] = Value::from("incomplete");
            reply["incomplete_details"] = serde_json::json!({ "reason": why });
        }
        Ingress::GenerateContent | Ingress::StreamGenerateContent => {
            promptd_core::gateway::gemini::mark_partial(reply, &why)
        }
        Ingress::Converse | Ingress::ConverseStream => {
            promptd_core::gateway::bedrock::mark_partial(reply, &why)
        }
    }
}
