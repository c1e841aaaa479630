//! Serving HTTP/1 connections, each bounded in time, a bounded number at once (H6), with
//! graceful shutdown: on the signal no connection is accepted any more, each one finishes the
//! response it is sending and closes, and `serve` returns when all are closed.
//!
//! A watchdog per connection closes it when it takes longer than the header timeout to send a
//! whole request head (timed from the connection's opening, or from its first byte after an
//! idle spell) or sits idle between requests longer than the idle timeout. A connection with a
//! request in flight is never timed: its response may legitimately take long (a server-sent
//! event stream, a step waiting for the first load). hyper's own `header_read_timeout` is not
//! used: it starts as soon as a connection is idle, so it would be the idle timeout as well.
//!
//! This is the server `promptd serve` runs; an embedder of the library serves the daemon's
//! API ([`crate::http::app`]) the same way and gets the same limits (any other service of
//! axum's requests, an [`axum::Router`] of its own, is served the same way):
//!
//! ```no_run
//! # async fn run(daemon: std::sync::Arc<promptd_daemon::Daemon>) -> std::io::Result<()> {
//! use promptd_daemon::{http, server};
//!
//! let limits = server::Limits::of(&daemon);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7070").await?;
//! let app = http::app(daemon, None, promptd_daemon::gateway::Listening::Local);
//! let stop = async {
//!     let _ = tokio::signal::ctrl_c().await;
//! };
//! server::serve(server::no_delay(listener), app, limits, stop).await;
//! # Ok(())
//! # }
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::serve::Listener;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::{service_fn, Service};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use promptd_core::config::Config;
use promptd_core::sync::lock;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

use crate::Daemon;

/// What [`serve`] serves: a service of axum's requests that always answers, as an
/// [`axum::Router`] and [`crate::http::App`] are.
pub trait AxumService:
    tower_service::Service<
        axum::extract::Request,
        Response = axum::response::Response,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> AxumService for S where
    S: tower_service::Service<
            axum::extract::Request,
            Response = axum::response::Response,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// A connection's time limits, read from the config in force when it opens.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// From the opening, or from the first byte after an idle spell, to a whole request head.
    pub header: Duration,
    /// Between the end of a response and the first byte of the next request.
    pub idle: Duration,
    /// From the end of a request's head to the end of its body.
    pub body: Duration,
}

impl Timeouts {
    /// The timeouts of `config`'s `[limits]` (`header_timeout_ms`, `idle_timeout_ms`,
    /// `body_timeout_ms`).
    pub fn of(config: &Config) -> Timeouts {
        Timeouts {
            header: config.header_timeout(),
            idle: config.idle_timeout(),
            body: config.body_timeout(),
        }
    }
}

/// A server's bounds (H6): how many connections may be open at once, and the timeouts of each
/// new connection, asked for as it opens.
#[derive(Clone)]
pub struct Limits {
    /// Connections open at once; beyond that, connections wait in the listen backlog.
    pub max_connections: usize,
    /// Called for each new connection.
    pub timeouts: Arc<dyn Fn() -> Timeouts + Send + Sync>,
    /// Bytes of request bodies read or served at once across connections; a request whose
    /// body (its `Content-Length`, or `max_body` when it has none) does not fit waits.
    pub bodies_in_flight: u64,
    /// The largest body a request may have: what a body of unknown length counts as.
    pub max_body: u64,
}

impl Limits {
    /// The limits of `daemon`'s config: `max_connections` as it is now (a server reads it once,
    /// at start), the timeouts from the config in force when each connection opens, so a
    /// reload applies to later connections.
    pub fn of(daemon: &Arc<Daemon>) -> Limits {
        let daemon = daemon.clone();
        let config = daemon.config();
        Limits {
            max_connections: config.max_connections(),
            bodies_in_flight: config.bodies_in_flight(),
            max_body: config.max_body_bytes() as u64,
            timeouts: Arc::new(move || Timeouts::of(&daemon.config())),
        }
    }
}

impl std::fmt::Debug for Limits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limits")
            .field("max_connections", &self.max_connections)
            .finish_non_exhaustive()
    }
}

/// `listener` with Nagle's algorithm off on every connection it accepts: a long body goes out
/// in several vectored writes (its shared pieces), and the second must not wait for the
/// client's delayed ACK of the first.
pub fn no_delay(
    listener: tokio::net::TcpListener,
) -> impl Listener<Io = tokio::net::TcpStream, Addr = std::net::SocketAddr> {
    axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY on a connection: {e}");
        }
    })
}

/// Serves `app` on every connection `listener` accepts, at most `limits.max_connections` at
/// once (beyond that, connections wait in the listen backlog), each within the timeouts
/// `limits` gives when it opens, until `shutdown` completes; then lets open connections finish
/// their responses and returns once all are closed.
pub async fn serve<L: Listener, S: AxumService>(
    mut listener: L,
    app: S,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let Limits {
        max_connections: max,
        timeouts,
        bodies_in_flight,
        max_body,
    } = limits;
    let bodies = Arc::new(Bodies::new(bodies_in_flight, max_body));
    let max = max.clamp(1, (u32::MAX as usize).min(Semaphore::MAX_PERMITS));
    let slots = Arc::new(Semaphore::new(max));
    let (stop, stopping) = watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // A free slot before accepting: a connection over the bound costs nothing here.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot,
            () = &mut shutdown => break,
        };
        let Ok(slot) = slot else { break };
        let (io, _) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let (app, stopping, timeouts) = (app.clone(), stopping.clone(), timeouts());
        let bodies = bodies.clone();
        tokio::spawn(async move {
            connection(io, app, timeouts, bodies, stopping).await;
            drop(slot);
        });
    }
    drop(listener);
    // Dropping the sender tells every connection to finish; each gives its slot back when
    // closed, so having them all back means every connection is closed.
    drop(stop);
    let _ = slots.acquire_many(max as u32).await;
}

/// Serves one connection until it closes, times out (H6) or has finished after `stopping`.
async fn connection<I, S: AxumService>(
    io: I,
    app: S,
    timeouts: Timeouts,
    bodies: Arc<Bodies>,
    mut stopping: watch::Receiver<()>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        io,
        activity: activity.clone(),
    });
    let app = TowerToHyperService::new(app);
    let tracked = activity.clone();
    let service = service_fn(move |request: hyper::Request<Incoming>| {
        // In flight from here until hyper drops the response body, i.e. has sent all of it.
        let busy = Busy::begin(&tracked);
        let weight = bodies.weight(&request);
        let bodies = bodies.clone();
        // The body's own deadline: a request in flight is not the watchdog's to close.
        let response = app.call(request.map(|body| Body::new(TimedBody::new(body, timeouts.body))));
        async move {
            // Its body's share of the bytes in flight, held until the answer is made.
            let _share = bodies.take(weight).await;
            let response = response.await?;
            Ok::<_, Infallible>(response.map(|body| Tracked { body, _busy: busy }))
        }
    });
    let conn = http1::Builder::new()
        .header_read_timeout(None)
        .serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let mut finishing = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("connection ended: {e}");
                }
                return;
            }
            _ = stopping.changed(), if !finishing => {
                finishing = true;
                conn.as_mut().graceful_shutdown();
            }
            why = activity.expired(timeouts) => {
                // Dropping the connection closes it.
                tracing::debug!("closing a connection: {why}");
                return;
            }
        }
    }
}

/// What a connection is doing, for its watchdog.
struct Activity {
    state: Mutex<State>,
}

struct State {
    /// Requests whose responses are not sent yet.
    in_flight: usize,
    /// With none in flight: whether a request head is being read (else the connection idles).
    head: bool,
    /// When the head or the idle spell began.
    since: Instant,
}

impl Activity {
    /// A new connection owes its first request head.
    fn new() -> Activity {
        Activity {
            state: Mutex::new(State {
                in_flight: 0,
                head: true,
                since: Instant::now(),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Bytes arrived: on an idle connection, they begin a request head.
    fn read(&self) {
        let mut state = self.state();
        if state.in_flight == 0 && !state.head {
            state.head = true;
            state.since = Instant::now();
        }
    }

    /// Resolves when the connection has exceeded a timeout, saying which.
    ///
    /// The watchdog is never told of a change: it looks again at least every `min(header,
    /// idle)`. A deadline set after a look is at least that far from it (it starts when it is
    /// set), so a look always comes before it, and it is kept exactly. Re-arming a timer per
    /// request instead would wake the runtime's timer driver at every request.
    async fn expired(&self, timeouts: Timeouts) -> &'static str {
        let most = timeouts.header.min(timeouts.idle);
        loop {
            let now = Instant::now();
            let deadline = {
                let state = self.state();
                (state.in_flight == 0).then(|| {
                    if state.head {
                        (state.since + timeouts.header, "request head timeout")
                    } else {
                        (state.since + timeouts.idle, "idle timeout")
                    }
                })
            };
            let wake = match deadline {
                Some((at, why)) if now >= at => return why,
                Some((at, _)) => at.min(now + most),
                None => now + most,
            };
            tokio::time::sleep_until(wake).await;
        }
    }
}

/// One request in flight, until dropped.
struct Busy(Arc<Activity>);

impl Busy {
    fn begin(activity: &Arc<Activity>) -> Busy {
        activity.state().in_flight += 1;
        Busy(activity.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.in_flight = state.in_flight.saturating_sub(1);
        if state.in_flight == 0 {
            state.head = false;
            state.since = Instant::now();
        }
    }
}

/// A response body that keeps its request in flight until hyper is done with it.
struct Tracked {
    body: Body,
    _busy: Busy,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The bytes of request bodies in flight across connections (`[limits] bodies_in_flight_mb`),
/// counted in KiB: a request takes its body's share before its handler runs (a `GET` none)
/// and gives it back once its answer is made.
struct Bodies {
    kib: Arc<Semaphore>,
    total_kib: u32,
    max_body_kib: u32,
}

impl Bodies {
    fn new(total: u64, max_body: u64) -> Self {
        let total_kib = u32::try_from(total.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        let total_kib = total_kib.min(Semaphore::MAX_PERMITS as u32);
        Bodies {
            kib: Arc::new(Semaphore::new(total_kib as usize)),
            total_kib,
            max_body_kib: u32::try_from(max_body.div_ceil(1024)).unwrap_or(u32::MAX),
        }
    }

    /// A request's share, in KiB: its `Content-Length`, or the largest body when it streams
    /// one of unknown length; at most the whole budget (such a request runs alone).
    fn weight<B>(&self, request: &hyper::Request<B>) -> u32 {
        let headers = request.headers();
        let length = headers
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let kib = match length {
            Some(n) => u32::try_from(n.div_ceil(1024)).unwrap_or(u32::MAX),
            None if headers.contains_key(hyper::header::TRANSFER_ENCODING) => self.max_body_kib,
            None => 0,
        };
        kib.min(self.total_kib)
    }

    async fn take(&self, kib: u32) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if kib == 0 {
            return None;
        }
        self.kib.clone().acquire_many_owned(kib).await.ok()
    }
}

/// A request body read past its deadline ends in [`BodyTimeout`]: a body sent slowly cannot
/// hold a connection (and its handler) longer than `[limits] body_timeout_ms`.
struct TimedBody {
    body: Incoming,
    limit: Duration,
    started: Instant,
    /// Made the first time the body is not ready: most bodies arrive with their head, and
    /// need no timer (nor its allocation).
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl TimedBody {
    fn new(body: Incoming, limit: Duration) -> Self {
        TimedBody {
            body,
            limit,
            started: Instant::now(),
            deadline: None,
        }
    }
}

/// A request body did not arrive whole within `[limits] body_timeout_ms`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} ms (limits.body_timeout_ms)", .0.as_millis())]
pub struct BodyTimeout(pub Duration);

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let (started, limit) = (this.started, this.limit);
        let deadline = this
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(started + limit)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimeout(this.limit))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The connection's socket, telling its [`Activity`] when bytes arrive.
struct Watched<I> {
    io: I,
    activity: Arc<Activity>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.read();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
