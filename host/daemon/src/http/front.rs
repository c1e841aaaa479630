//! The API as the daemon serves it ([`App`]): the router, with a step answered ahead of it.
//!
//! An agent calls `POST /v1/sessions/{id}/steps` on every turn. Through the router a step
//! pays for route matching, its path parameters and extensions, the gate's middleware, the
//! body limit's layer and the boxed services between them: about 20 of a short step's
//! allocations (issue 50; BENCHMARKS.md, fifth stop). [`App`] takes
//! a step whose request needs none of that as it is — a session id without escapes, a
//! declared length within the limit, the daemon's token when it has one — and runs the same
//! handler the route runs ([`run_step`]) on it. Every other request, and every request it
//! would refuse, goes to the router, which answers it as it always has: the two paths give
//! the same answers, which the tests check byte for byte.

#[allow(unused_imports)]
use super::*;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::http::Method;
use axum::routing::future::RouteFuture;
use http_body_util::BodyExt;

/// The HTTP API as a service: [`router_listening`]'s router, with the step route answered
/// before it (see the module's documentation). Serve it with [`crate::server::serve`].
#[derive(Clone)]
pub struct App {
    router: Router,
    state: Arc<AppState>,
}

impl App {
    pub(super) fn new(router: Router, state: Arc<AppState>) -> App {
        App { router, state }
    }
}

impl tower_service::Service<Request> for App {
    type Response = Response;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The router is always ready, and so is a step.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Answer {
        match direct_step(&self.state, request) {
            Ok(step) => Answer(Either::Step(step)),
            Err(request) => Answer(Either::Router(self.router.call(request))),
        }
    }
}

/// The future of an [`App`]'s answer.
pub struct Answer(Either);

// The router's future kept unboxed: boxing it would cost every other request an allocation.
#[allow(clippy::large_enum_variant)]
enum Either {
    Step(Pin<Box<dyn Future<Output = Response> + Send>>),
    Router(RouteFuture<Infallible>),
}

impl Future for Answer {
    type Output = Result<Response, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            Either::Step(step) => step.as_mut().poll(cx).map(Ok),
            Either::Router(routed) => Pin::new(routed).poll(cx),
        }
    }
}

/// `request` as a step to run before the router, or back when the router is to answer it.
// The request is given back by value, as the router takes it.
#[allow(clippy::result_large_err)]
fn direct_step(
    state: &Arc<AppState>,
    request: Request,
) -> Result<Pin<Box<dyn Future<Output = Response> + Send>>, Request> {
    if request.method() != Method::POST {
        return Err(request);
    }
    let Some(id) = plain_step_path(request.uri().path()) else {
        return Err(request);
    };
    // A body without a declared length (chunked), or one over the limit, is the router's:
    // its gate refuses the one and its body limit bounds the other.
    let declared = declared_length(request.headers());
    if declared.is_none_or(|n| n > state.max_body as u64) {
        return Err(request);
    }
    if unauthorized(state, &request).is_some() {
        return Err(request);
    }
    let id = Arc::<str>::from(id);
    let parent = trace_parent(request.headers());
    let state = state.clone();
    Ok(Box::pin(async move {
        let limit = state.max_body;
        let answer = match read_body(request.into_body(), limit).await {
            Ok(bytes) => match parse_json::<api::StepBody>(&bytes) {
                Ok(body) => run_step(&state, id, parent, body).await,
                Err(refused) => Err(refused),
            },
            Err(e) => Err(body_failure(&*e, limit)),
        };
        // As the router's route does: a body of known size is sent with its length.
        let mut response = answer.into_response();
        if !response.headers().contains_key(header::CONTENT_LENGTH) {
            if let Some(size) = http_body::Body::size_hint(response.body()).exact() {
                response
                    .headers_mut()
                    .insert(header::CONTENT_LENGTH, header::HeaderValue::from(size));
            }
        }
        response
    }))
}

/// The session of a step's path, `/v1/sessions/{id}/steps`, when the id is one segment the
/// router would give as it is (nothing to percent-decode).
fn plain_step_path(path: &str) -> Option<&str> {
    let id = path.strip_prefix("/v1/sessions/")?.strip_suffix("/steps")?;
    let plain = !id.is_empty() && !id.contains(['/', '%']);
    plain.then_some(id)
}

/// A request's `Content-Length`, when it has one that reads as a number.
pub(super) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// A body whose declared length is within `limit`, read whole: one frame is kept as it
/// came; more are gathered into one buffer. (hyper stops a body at its declared length; the
/// limit still bounds any other body.)
async fn read_body(body: axum::body::Body, limit: usize) -> Result<Bytes, axum::BoxError> {
    let mut body = http_body_util::Limited::new(body, limit);
    let mut first: Option<Bytes> = None;
    let mut gathered: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            break; // trailers end the data
        };
        match first.take() {
            None if gathered.is_empty() => first = Some(data),
            held => {
                gathered.extend_from_slice(held.as_deref().unwrap_or_default());
                gathered.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(gathered)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use promptd_core::config::Config;
    use promptd_core::load::{Engine, Instantiated, LoadRequest};
    use promptd_core::plugin::provider::NativePlugin;
    use promptd_core::store::MemoryStore;

    /// A persona from every file: a step's request has a system prompt to carry.
    struct Persona;
    impl Engine for Persona {
        fn instantiate(&self, _: LoadRequest<'_>) -> promptd_core::Result<Instantiated> {
            let plugin = NativePlugin::new().section("persona", 0, "Be \"brief\".");
            let (declaration, provider) = plugin.build();
            Ok(Instantiated {
                declaration,
                provider,
                cache: None,
            })
        }
    }

    /// An [`App`] over a daemon with one plugin, a body limit of 1 MiB and `token` if given;
    /// the folder lives as long as the app.
    fn app(token: Option<&str>) -> (App, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("persona.wasm"), b"native").unwrap();
        let config = "[model]\nmodel = \"m\"\nmax_tokens = 64\n[limits]\nmax_body_mb = 1\n";
        let config = Config::parse(config, "test").unwrap();
        let daemon = Daemon::new(
            Arc::new(MemoryStore::new()),
            Arc::new(Persona),
            config,
            dir.path(),
        )
        .unwrap();
        let app = super::super::app(
            Arc::new(daemon),
            token.map(str::to_string),
            crate::gateway::Listening::Local,
        );
        (app, dir)
    }

    /// `text` with every byte percent-encoded: the same path to the router, but not one
    /// [`App`] takes before it.
    fn escaped(text: &str) -> String {
        text.bytes().map(|b| format!("%{b:02X}")).collect()
    }

    type Answered = (StatusCode, Vec<(String, Vec<u8>)>, Bytes);

    /// Sends a request through `app`, saying whether it was taken before the router.
    async fn send(app: &App, request: Request) -> (bool, Answered) {
        use tower_service::Service;
        let mut app = app.clone();
        let mut answer = app.call(request);
        let direct = matches!(answer.0, Either::Step(_));
        let response = (&mut answer).await.unwrap();
        let status = response.status();
        let headers = response
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (direct, (status, headers, body))
    }

    fn post(path: &str, body: &'static str, headers: &[(&str, &str)]) -> Request {
        let mut request = Request::builder().method("POST").uri(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(axum::body::Body::from(body)).unwrap()
    }

    const STEP: &str = r#"{"messages":[{"role":"user","content":"What is \"here\"?"}],"facts":{"cwd":"/src"},"format":"anthropic"}"#;

    /// H8: a step `App` answers before the router gets the status, headers and body the
    /// router gives the same request: a step that runs, one of an unknown session, bodies
    /// that cannot be read, a missing or wrong token. Requests it does not take (no declared
    /// length, one over the limit) go to the router.
    #[tokio::test]
    async fn h8_a_step_answered_before_the_router_is_answered_as_the_router_answers_it() {
        let length = |body: &str| body.len().to_string();
        for token in [None, Some("s3cret")] {
            let (app, _dir) = app(token);
            let bearer = token.map(|t| format!("Bearer {t}")).unwrap_or_default();
            // Two sessions made alike, one stepped on each path, twice.
            let mut sessions = Vec::new();
            for _ in 0..2 {
                let made = post(
                    "/v1/sessions",
                    r#"{"agent":"default"}"#,
                    &[
                        ("content-type", "application/json"),
                        ("content-length", "19"),
                        ("authorization", &bearer),
                    ],
                );
                let (_, (status, _, body)) = send(&app, made).await;
                assert_eq!(status, StatusCode::CREATED, "{body:?}");
                let v: Value = serde_json::from_slice(&body).unwrap();
                sessions.push(v["id"].as_str().unwrap().to_string());
            }
            let bodies: [&'static str; 5] = [STEP, STEP, "[]", r#"{"messages":5}"#, "{"];
            for (i, body) in bodies.iter().enumerate() {
                let headers = [
                    ("content-type", "application/json"),
                    ("content-length", &length(body)),
                    ("authorization", &bearer),
                ];
                let plain = format!("/v1/sessions/{}/steps", sessions[0]);
                let routed = format!("/v1/sessions/{}/steps", escaped(&sessions[1]));
                let (direct, ours) = send(&app, post(&plain, body, &headers)).await;
                let (also_direct, theirs) = send(&app, post(&routed, body, &headers)).await;
                assert!(direct && !also_direct, "request {i}");
                assert_eq!(ours, theirs, "request {i}");
                if i < 2 {
                    assert_eq!(ours.0, StatusCode::OK, "{:?}", ours.2);
                    let v: Value = serde_json::from_slice(&ours.2).unwrap();
                    assert_eq!(v["step"], i + 1);
                    assert!(v["request"]["system"].to_string().contains("brief"), "{v}");
                } else {
                    assert_eq!(ours.0, StatusCode::BAD_REQUEST, "{:?}", ours.2);
                }
            }
            // An unknown session, named plainly and escaped.
            let headers = [
                ("content-length", &length(STEP)[..]),
                ("authorization", &bearer),
            ];
            let (direct, ours) = send(&app, post("/v1/sessions/nope/steps", STEP, &headers)).await;
            let routed = format!("/v1/sessions/{}/steps", escaped("nope"));
            let (_, theirs) = send(&app, post(&routed, STEP, &headers)).await;
            assert!(direct);
            assert_eq!(ours, theirs);
            assert_eq!(ours.0, StatusCode::NOT_FOUND, "{:?}", ours.2);
            // What the router answers: a wrong token, a declared length over the limit, no
            // declared length, another method.
            let over = (2 << 20).to_string();
            for (request, status) in [
                (
                    post(
                        "/v1/sessions/nope/steps",
                        STEP,
                        &[
                            ("content-length", &length(STEP)),
                            ("authorization", "Bearer wrong"),
                        ],
                    ),
                    if token.is_some() {
                        StatusCode::UNAUTHORIZED
                    } else {
                        StatusCode::NOT_FOUND
                    },
                ),
                (
                    post(
                        "/v1/sessions/nope/steps",
                        STEP,
                        &[("content-length", &over), ("authorization", &bearer)],
                    ),
                    StatusCode::PAYLOAD_TOO_LARGE,
                ),
            ] {
                let (direct, (got, _, body)) = send(&app, request).await;
                assert_eq!(direct, token.is_none() && status == StatusCode::NOT_FOUND);
                assert_eq!(got, status, "{body:?}");
            }
            let chunked = Request::builder()
                .method("POST")
                .uri("/v1/sessions/nope/steps")
                .header("authorization", &bearer)
                .body(axum::body::Body::from_stream(futures_util::stream::iter([
                    Ok::<_, std::io::Error>(Bytes::from_static(STEP.as_bytes())),
                ])))
                .unwrap();
            let (direct, (got, _, _)) = send(&app, chunked).await;
            assert!(!direct);
            assert_eq!(got, StatusCode::NOT_FOUND);
            let get = Request::builder()
                .uri("/v1/sessions/nope/steps")
                .header("authorization", &bearer)
                .body(axum::body::Body::empty())
                .unwrap();
            let (direct, (got, _, _)) = send(&app, get).await;
            assert!(!direct);
            assert_eq!(got, StatusCode::METHOD_NOT_ALLOWED);
        }
    }

    /// A body cut off as it is read is answered as the router's extractor answers it.
    #[tokio::test]
    async fn a_body_that_fails_as_it_is_read_is_answered_as_the_router_answers_it() {
        let (app, _dir) = app(None);
        let failing = || {
            axum::body::Body::from_stream(futures_util::stream::iter([
                Ok(Bytes::from_static(b"{\"messages\"")),
                Err(std::io::Error::other("connection reset")),
            ]))
        };
        let request = |path: String| {
            Request::builder()
                .method("POST")
                .uri(path)
                .header("content-length", "100")
                .body(failing())
                .unwrap()
        };
        let (direct, ours) = send(&app, request("/v1/sessions/nope/steps".into())).await;
        let (routed, theirs) = send(
            &app,
            request(format!("/v1/sessions/{}/steps", escaped("nope"))),
        )
        .await;
        assert!(direct && !routed);
        assert_eq!(ours, theirs);
        assert_eq!(ours.0, StatusCode::BAD_REQUEST);
        let v: Value = serde_json::from_slice(&ours.2).unwrap();
        assert_eq!(
            v["error"]["message"],
            "Failed to buffer the request body: connection reset (limit 1048576 bytes: limits.max_body_mb)"
        );
    }

    #[test]
    fn only_a_plain_session_id_is_taken_from_a_step_path() {
        assert_eq!(plain_step_path("/v1/sessions/s1/steps"), Some("s1"));
        assert_eq!(
            plain_step_path("/v1/sessions/a-b_c.d~e/steps"),
            Some("a-b_c.d~e")
        );
        for path in [
            "/v1/sessions//steps",
            "/v1/sessions/a/b/steps",
            "/v1/sessions/%73/steps",
            "/v1/sessions/s1/steps/",
            "/v1/sessions/s1/steps/1/request",
            "/v1/sessions/s1",
            "/v1/sessions",
            "/v1/sessions/s1/stepsx",
        ] {
            assert_eq!(plain_step_path(path), None, "{path}");
        }
    }

    #[tokio::test]
    async fn a_body_is_read_whole_and_within_its_limit() {
        use futures_util::stream;
        let frames = |parts: &[&'static str]| {
            let chunks: Vec<Result<Bytes, std::io::Error>> = parts
                .iter()
                .map(|p| Ok(Bytes::from_static(p.as_bytes())))
                .collect();
            axum::body::Body::from_stream(stream::iter(chunks))
        };
        let one = read_body(frames(&["{\"a\":1}"]), 64).await.unwrap();
        assert_eq!(&one[..], b"{\"a\":1}");
        let three = read_body(frames(&["{\"a\"", ":", "1}"]), 64).await.unwrap();
        assert_eq!(&three[..], b"{\"a\":1}");
        let empty = read_body(frames(&[]), 64).await.unwrap();
        assert!(empty.is_empty());
        let over = read_body(frames(&["0123", "4567"]), 6).await.unwrap_err();
        assert_eq!(over.to_string(), "length limit exceeded");
    }
}
