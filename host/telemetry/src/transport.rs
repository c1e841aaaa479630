//! Sending an encoded OTLP trace request ([`crate::wire`]) to the collector: a POST over
//! OTLP/HTTP (`application/x-protobuf`), or the `TraceService/Export` call over gRPC, with the
//! configured headers, within the export timeout.

use std::collections::BTreeMap;
use std::time::Duration;

use promptd_core::config::telemetry::Protocol;
use prost::bytes::{Buf, BufMut};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

/// The gRPC method of the OTLP trace service.
const EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Why the transport could not be built (a bad endpoint or header).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BuildError(String);

/// One collector's trace endpoint, connected lazily.
pub(crate) enum Transport {
    Http {
        /// Sends the headers (the configured ones and the content type) on every request.
        client: reqwest::Client,
        url: String,
    },
    Grpc {
        channel: Channel,
        metadata: tonic::metadata::MetadataMap,
    },
}

impl Transport {
    /// The transport to `endpoint` with `headers` on every request; for gRPC it must be built
    /// inside the runtime it will run on.
    pub(crate) fn new(
        protocol: Protocol,
        endpoint: &str,
        headers: &BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<Transport, BuildError> {
        match protocol {
            Protocol::HttpProtobuf => {
                let mut map = reqwest::header::HeaderMap::new();
                for (k, v) in headers {
                    let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                        .map_err(|e| BuildError(format!("header `{k}`: {e}")))?;
                    let value = reqwest::header::HeaderValue::from_str(v)
                        .map_err(|e| BuildError(format!("header `{k}`: {e}")))?;
                    map.insert(name, value);
                }
                map.insert(
                    reqwest::header::CONTENT_TYPE,
                    reqwest::header::HeaderValue::from_static("application/x-protobuf"),
                );
                let client = reqwest::Client::builder()
                    .default_headers(map)
                    .timeout(timeout)
                    .build()
                    .map_err(|e| BuildError(format!("the HTTP client: {e}")))?;
                Ok(Transport::Http {
                    client,
                    url: endpoint.to_string(),
                })
            }
            Protocol::Grpc => {
                let mut metadata = tonic::metadata::MetadataMap::new();
                for (k, v) in headers {
                    let key =
                        tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                            .map_err(|e| BuildError(format!("header `{k}`: {e}")))?;
                    let value = v
                        .parse()
                        .map_err(|e| BuildError(format!("header `{k}`: {e}")))?;
                    metadata.insert(key, value);
                }
                let channel = Endpoint::from_shared(endpoint.to_string())
                    .map_err(|e| BuildError(format!("endpoint `{endpoint}`: {e}")))?
                    .timeout(timeout)
                    .connect_timeout(timeout)
                    .connect_lazy();
                Ok(Transport::Grpc { channel, metadata })
            }
        }
    }

    /// Sends one encoded request; the error says what the collector or the connection said.
    pub(crate) async fn send(&self, body: Vec<u8>) -> Result<(), String> {
        match self {
            Transport::Http { client, url } => {
                let response = client
                    .post(url)
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| error_chain(&e))?;
                let status = response.status();
                if status.is_success() {
                    // The body is an `ExportTraceServiceResponse`; read so the connection is
                    // kept for the next export.
                    let _ = response.bytes().await;
                    return Ok(());
                }
                let text = response.text().await.unwrap_or_default();
                let text: String = text.chars().take(200).collect();
                Err(format!("the collector answered {status}: {text}"))
            }
            Transport::Grpc { channel, metadata } => {
                let mut grpc = tonic::client::Grpc::new(channel.clone());
                grpc.ready()
                    .await
                    .map_err(|e| format!("connecting: {}", error_chain(&e)))?;
                let mut request = tonic::Request::new(body);
                *request.metadata_mut() = metadata.clone();
                grpc.unary::<_, (), _>(request, PathAndQuery::from_static(EXPORT), Raw)
                    .await
                    .map(|_| ())
                    .map_err(|s| format!("the collector answered {:?}: {}", s.code(), s.message()))
            }
        }
    }
}

/// An error and its sources, on one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A gRPC codec for bytes already encoded; the answer's body is not read.
#[derive(Clone, Copy)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = ();
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = ();
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<()>, tonic::Status> {
        let n = src.remaining();
        src.advance(n);
        Ok(Some(()))
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use super::*;

    /// A collector that answers one request with `status` and hands back what it was sent.
    fn collector(status: &'static str) -> (String, std::thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/v1/traces", listener.local_addr().expect("addr"));
        let served = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accept");
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = conn.read(&mut buf).expect("read");
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).to_string();
                if let Some(head) = text.find("\r\n\r\n") {
                    let length = text[..head]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if got.len() >= head + 4 + length {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            let body = "rejected: no tenant";
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            String::from_utf8_lossy(&got).to_string()
        });
        (url, served)
    }

    fn send(url: &str, headers: &BTreeMap<String, String>, body: &[u8]) -> Result<(), String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let transport =
            Transport::new(Protocol::HttpProtobuf, url, headers, Duration::from_secs(5))
                .map_err(|e| e.to_string())?;
        runtime.block_on(transport.send(body.to_vec()))
    }

    #[test]
    fn an_http_export_posts_protobuf_with_the_headers() {
        let (url, served) = collector("200 OK");
        let headers = BTreeMap::from([("x-tenant".to_string(), "team a".to_string())]);
        send(&url, &headers, b"\x0a\x00").expect("sent");
        let got = served.join().expect("collector").to_ascii_lowercase();
        assert!(got.starts_with("post /v1/traces http/1.1\r\n"), "{got}");
        assert!(
            got.contains("\r\ncontent-type: application/x-protobuf\r\n"),
            "{got}"
        );
        assert!(got.contains("\r\nx-tenant: team a\r\n"), "{got}");
        assert!(got.ends_with("\r\n\r\n\n\0"), "{got:?}");
    }

    #[test]
    fn a_refused_export_says_what_the_collector_answered() {
        let (url, served) = collector("401 Unauthorized");
        let e = send(&url, &BTreeMap::new(), b"").unwrap_err();
        served.join().expect("collector");
        assert!(
            e.contains("401") && e.contains("rejected: no tenant"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_header_is_refused_naming_it() {
        for protocol in [Protocol::HttpProtobuf, Protocol::Grpc] {
            let e = Transport::new(
                protocol,
                "http://127.0.0.1:4318",
                &BTreeMap::from([("bad header".to_string(), "x".to_string())]),
                Duration::from_secs(1),
            )
            .err()
            .expect("refused")
            .to_string();
            assert!(e.contains("`bad header`"), "{e}");
        }
    }
}
