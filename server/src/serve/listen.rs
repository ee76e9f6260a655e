//! The accept loop: HTTP/1.1 and HTTP/2 over hyper, with the limits a server facing the open
//! network needs and `axum::serve` does not set.
//!
//! - `--header-timeout`: a connection has that long to send a request's headers, counted from
//!   its opening or, on a kept-alive connection, from the first byte of the next request, so
//!   slow-header (slowloris) connections are cut; an HTTP/2 connection that opens no stream is
//!   cut after it as well.
//! - `--keep-alive-timeout`: a connection that has had a response may then stay silent this
//!   long (HTTP/2 ones included: no stream open) before it is closed. It is longer than the
//!   idle time of the clients' own pools (aiohttp 15 s, httpx 5 s, reqwest and Go 90 s), so the
//!   client closes first: a server closing at the moment a client reuses the connection makes
//!   the client fail the request it just wrote ("Cannot write to closing transport"). hyper's own
//!   header timer also runs while it waits for the next request, so it is set to the sum of the
//!   two as a backstop and the reaper below applies the two rules.
//! - `--max-connections` (by default sized from the open-file limit, which start-up raises to
//!   what the system allows): when every slot is taken, the connection idle longest (no request
//!   in flight) is closed to make room, once it has been idle for [`EVICT_GRACE`]: a connection
//!   just opened has that long to send its request (else a flood that reconnects at once would
//!   close each newcomer before it is read; the accept loop waits instead, and the kernel's
//!   backlog queues newcomers in order); only when every open connection has a request in flight
//!   is a new one refused, and even then a small reserve of connections answers `/health`,
//!   `/metrics` and `/version` (anything else on them gets a 503), so probes and scrapers get
//!   through a flood. Closed and refused connections are counted
//!   (`pace_http_connections_closed_total{reason}`, `pace_http_connections_refused_total`).
//! - The body's own time limit is the extractor's (`--body-timeout`, a 408).
//!
//! On shutdown the loop stops accepting and every open connection is asked to finish (HTTP/1:
//! close after the response in progress; HTTP/2: GOAWAY), for at most `grace`.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tower::ServiceExt;

/// Connection limits.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Time to send a request's headers, from the connection's opening or the request's first byte.
    pub header_timeout: Duration,
    /// Longest silence on a connection after a response.
    pub keep_alive: Duration,
    /// Most open connections (the probe reserve aside).
    pub max_connections: usize,
}

/// Connections beyond `max_connections` that answer only the probe routes, for when every
/// regular connection has a request in flight.
const PROBE_RESERVE: usize = 16;
/// A probe connection is closed after this long without a request.
const PROBE_IDLE: Duration = Duration::from_secs(2);
/// How long the accept loop waits for the slot of a connection it asked to close.
const EVICT_WAIT: Duration = Duration::from_millis(200);
/// How long a connection is idle (since its opening or its last response) before it may be
/// closed to make room for a new one.
const EVICT_GRACE: Duration = Duration::from_millis(250);
/// File descriptors kept for everything but connections (model files, logs, the runtime).
const FD_RESERVE: u64 = 256;
/// The largest default connection limit, however many descriptors the system allows.
const MAX_DEFAULT_CONNECTIONS: u64 = 65_536;

/// Connections the kernel queues for the accept loop (capped by the system's `somaxconn`;
/// tokio's default is 1,024). While the slots are taken by connections in their
/// [`EVICT_GRACE`], newcomers wait here in arrival order; a full queue drops them (the client
/// retries after a second).
const LISTEN_BACKLOG: u32 = 4096;

/// A listening socket on `addr` with [`LISTEN_BACKLOG`] (and `SO_REUSEADDR`, as tokio's `bind`).
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Raises the process's open-file limit to what the system allows and returns the default
/// connection limit that follows from it: the limit less [`FD_RESERVE`] (and the probe
/// reserve), at least 64 and at most [`MAX_DEFAULT_CONNECTIONS`].
pub fn default_max_connections() -> usize {
    let nofile = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("could not raise the open-file limit: {e}");
            rlimit::getrlimit(rlimit::Resource::NOFILE).map(|(soft, _)| soft).unwrap_or(1024)
        }
    };
    let n = connections_for(nofile);
    tracing::info!("open-file limit {nofile}: up to {n} connections (--max-connections)");
    n
}

/// The default connection limit under an open-file limit of `nofile`.
pub fn connections_for(nofile: u64) -> usize {
    nofile.saturating_sub(FD_RESERVE + PROBE_RESERVE as u64).clamp(64, MAX_DEFAULT_CONNECTIONS) as usize
}

/// One open connection, as the accept loop and the idle reaper see it.
struct ConnState {
    /// Requests whose response has not been written to the end.
    in_flight: AtomicUsize,
    /// Milliseconds since the registry's epoch of its opening or its last response's end.
    last_active_ms: AtomicU64,
    /// Milliseconds since the epoch of the first byte read after the last response ([`NONE`]
    /// while nothing has come since): a request under way, whose headers are due within the
    /// header timeout.
    first_byte_ms: AtomicU64,
    /// It has carried an HTTP/2 request: its idle traffic (pings, window updates) is not the
    /// start of a request.
    h2: AtomicBool,
    /// Set once something asked it to close.
    closing: AtomicBool,
    close: Notify,
    /// A probe-reserve connection.
    probe: bool,
}

/// No byte read since the last response.
const NONE: u64 = u64::MAX;

impl ConnState {
    fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// The first byte of an HTTP/1 request whose headers are not in yet (HTTP/2 frames between
    /// requests, such as ping acks, do not start one): when, if so.
    fn request_begun(&self) -> Option<u64> {
        let t = self.first_byte_ms.load(Ordering::Acquire);
        (t != NONE && !self.h2.load(Ordering::Acquire)).then_some(t)
    }

    /// Whether it is to be closed at `now`: idle and silent past the keep-alive, or idle with a
    /// request's first bytes in but not its headers after the header timeout.
    fn expired(&self, now: u64, limits: &ConnLimits) -> bool {
        if !self.idle() {
            return false;
        }
        let since = |t: &AtomicU64| now.saturating_sub(t.load(Ordering::Acquire));
        if self.probe {
            return since(&self.last_active_ms) >= PROBE_IDLE.as_millis() as u64;
        }
        if let Some(started) = self.request_begun() {
            return now.saturating_sub(started) >= limits.header_timeout.as_millis() as u64;
        }
        since(&self.last_active_ms) >= limits.keep_alive.as_millis() as u64
    }

    /// Asks the connection to close (once).
    fn close(&self) -> bool {
        if self.closing.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.close.notify_one();
        true
    }
}

/// What [`Registry::close_oldest_idle`] did.
enum Evict {
    /// Asked one to close.
    Closed,
    /// The idle longest may be closed after this long.
    WaitFor(Duration),
    /// Every connection has a request in flight (or is closing already).
    NoneIdle,
}

/// Every open connection, oldest first.
struct Registry {
    epoch: Instant,
    next: AtomicU64,
    conns: Mutex<BTreeMap<u64, Arc<ConnState>>>,
}

impl Registry {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn insert(self: &Arc<Self>, probe: bool) -> (Arc<ConnState>, Registered) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnState {
            in_flight: AtomicUsize::new(0),
            last_active_ms: AtomicU64::new(self.now_ms()),
            first_byte_ms: AtomicU64::new(NONE),
            h2: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            close: Notify::new(),
            probe,
        });
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).insert(id, state.clone());
        (state, Registered { registry: self.clone(), id })
    }

    /// Asks the regular connection idle longest to close, if it has been idle for `grace`.
    fn close_oldest_idle(&self, grace: Duration) -> Evict {
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let oldest =
            conns.values().filter(|c| !c.probe && c.idle() && !c.closing.load(Ordering::Acquire)).min_by_key(|c| c.last_active_ms.load(Ordering::Acquire));
        let Some(c) = oldest else { return Evict::NoneIdle };
        let idle = Duration::from_millis(self.now_ms().saturating_sub(c.last_active_ms.load(Ordering::Acquire)));
        match grace.checked_sub(idle) {
            Some(left) if !left.is_zero() => Evict::WaitFor(left),
            _ if c.close() => Evict::Closed,
            _ => Evict::NoneIdle,
        }
    }

    /// Asks every connection past its keep-alive or header timeout ([`ConnState::expired`]) to
    /// close; how many of each (idle, slow headers).
    fn close_expired(&self, limits: &ConnLimits) -> (usize, usize) {
        let now = self.now_ms();
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let (mut idle, mut slow) = (0, 0);
        for c in conns.values().filter(|c| c.expired(now, limits)) {
            let started = c.request_begun().is_some();
            if c.close() {
                *if started { &mut slow } else { &mut idle } += 1;
            }
        }
        (idle, slow)
    }

    fn close_all(&self) {
        for c in self.conns.lock().unwrap_or_else(|e| e.into_inner()).values() {
            c.close();
        }
    }
}

/// Removes a connection from the registry when its task ends.
struct Registered {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.conns.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}

/// A request in flight on a connection: counted until its response body is dropped.
struct InFlight {
    state: Arc<ConnState>,
    registry: Arc<Registry>,
}

impl InFlight {
    fn new(state: Arc<ConnState>, registry: Arc<Registry>) -> Self {
        state.in_flight.fetch_add(1, Ordering::AcqRel);
        Self { state, registry }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.last_active_ms.store(self.registry.now_ms(), Ordering::Release);
        // Bytes of a pipelined request already read are not seen again (hyper's own header
        // timer, the keep-alive plus the header timeout, is their backstop).
        self.state.first_byte_ms.store(NONE, Ordering::Release);
        self.state.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connection's socket, noting when the first byte after a response is read.
struct Watched {
    stream: TcpStream,
    state: Arc<ConnState>,
    registry: Arc<Registry>,
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before && self.state.first_byte_ms.load(Ordering::Relaxed) == NONE && self.state.idle() {
            self.state.first_byte_ms.store(self.registry.now_ms(), Ordering::Release);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A response body that keeps its request counted in flight until it is written or dropped.
struct Tracked {
    inner: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        http_body::Body::poll_frame(Pin::new(&mut self.inner), cx)
    }

    fn is_end_stream(&self) -> bool {
        http_body::Body::is_end_stream(&self.inner)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::Body::size_hint(&self.inner)
    }
}

fn is_probe(path: &str) -> bool {
    matches!(path, "/health" | "/metrics" | "/version")
}

/// The 503 a probe-reserve connection gives to anything but a probe.
fn slots_full() -> Response<Body> {
    let body =
        r#"{"error":{"message":"every connection slot has a request in flight; retry shortly","type":"server_error","param":null,"code":"unavailable"}}"#;
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets open connections finish for
/// at most `grace`.
pub async fn serve(listener: TcpListener, app: Router, limits: ConnLimits, shutdown: impl Future<Output = ()>, grace: Duration) {
    let max = limits.max_connections.max(1);
    let slots = Arc::new(Semaphore::new(max));
    let probes = Arc::new(Semaphore::new(PROBE_RESERVE));
    let registry = Arc::new(Registry { epoch: Instant::now(), next: AtomicU64::new(0), conns: Mutex::new(BTreeMap::new()) });
    let reaper = {
        let registry = registry.clone();
        let period = Duration::from_millis(250).min(limits.header_timeout.min(limits.keep_alive) / 2).max(Duration::from_millis(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                let (idle, slow) = registry.close_expired(&limits);
                for _ in 0..idle {
                    crate::serve::metrics::record_connection_closed("idle");
                }
                for _ in 0..slow {
                    crate::serve::metrics::record_connection_closed("header_timeout");
                }
            }
        })
    };
    let mut refused_logged = false;
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors or a connection reset before accept: make room, back off
                    // briefly.
                    tracing::warn!("accept failed: {e}");
                    if let Evict::Closed = registry.close_oldest_idle(Duration::ZERO) {
                        crate::serve::metrics::record_connection_closed("slots_full");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let mut slot = slots.clone().try_acquire_owned().ok();
        while slot.is_none() {
            let wait = match registry.close_oldest_idle(EVICT_GRACE) {
                Evict::Closed => {
                    crate::serve::metrics::record_connection_closed("slots_full");
                    EVICT_WAIT
                }
                Evict::WaitFor(d) => d,
                Evict::NoneIdle => break,
            };
            slot = tokio::time::timeout(wait, slots.clone().acquire_owned()).await.ok().and_then(Result::ok);
        }
        let (slot, probe) = match slot {
            Some(s) => (s, false),
            None => match probes.clone().try_acquire_owned() {
                Ok(s) => (s, true),
                Err(_) => {
                    crate::serve::metrics::record_connection_refused();
                    if !std::mem::replace(&mut refused_logged, true) {
                        tracing::warn!("--max-connections ({max}) reached with a request in flight on each: closing new connections (logged once)");
                    }
                    drop(stream);
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (state, registered) = registry.insert(probe);
        let service = {
            let (app, state, registry) = (app.clone(), state.clone(), registry.clone());
            hyper::service::service_fn(move |req: Request<Incoming>| {
                let (app, state, registry) = (app.clone(), state.clone(), registry.clone());
                async move {
                    if state.probe && !is_probe(req.uri().path()) {
                        return Ok::<_, std::convert::Infallible>(slots_full());
                    }
                    if req.version() == axum::http::Version::HTTP_2 {
                        state.h2.store(true, Ordering::Release);
                    }
                    let in_flight = InFlight::new(state, registry);
                    let resp = app.oneshot(req.map(Body::new)).await?;
                    Ok(resp.map(|inner| Body::new(Tracked { inner, _in_flight: in_flight })))
                }
            })
        };
        let header_timeout = if probe { PROBE_IDLE } else { limits.header_timeout };
        let mut builder = Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(header_timeout + if probe { Duration::ZERO } else { limits.keep_alive });
        builder.http2().timer(TokioTimer::new()).keep_alive_interval(Some(header_timeout)).keep_alive_timeout(header_timeout);
        let io = Watched { stream, state: state.clone(), registry: registry.clone() };
        tokio::spawn(async move {
            let (_slot, _registered) = (slot, registered);
            // hyper reads the first bytes to tell HTTP/1 from HTTP/2 before its header timer
            // starts: a connection that sends nothing is timed here (and may be closed for room).
            let mut first = [0u8; 1];
            tokio::select! {
                peeked = tokio::time::timeout(header_timeout, io.stream.peek(&mut first)) => {
                    if !matches!(peeked, Ok(Ok(n)) if n > 0) {
                        return;
                    }
                }
                _ = state.close.notified() => return,
            }
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
            tokio::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!("connection from {peer}: {e}");
                    }
                }
                _ = state.close.notified() => {
                    // Idle (closed for room, or for its idle time): dropped at once. With a
                    // request in flight (shutdown, or a request that came in just now): HTTP/1
                    // closes after its response, HTTP/2 sends GOAWAY, for at most `grace`.
                    if !state.idle() {
                        conn.as_mut().graceful_shutdown();
                        if tokio::time::timeout(grace, conn).await.is_err() {
                            tracing::debug!("connection from {peer} still open after {} s of closing", grace.as_secs_f64());
                        }
                    }
                }
            }
        });
    }
    drop(listener);
    reaper.abort();
    registry.close_all();
    // Every connection's task holds its slot until it ends.
    let all = async { tokio::join!(slots.acquire_many(max as u32), probes.acquire_many(PROBE_RESERVE as u32)) };
    if tokio::time::timeout(grace + Duration::from_secs(1), all).await.is_err() {
        tracing::debug!("connections still open after {} s of shutdown grace", grace.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_limit_follows_the_open_file_limit() {
        assert_eq!(connections_for(1024), 1024 - 256 - 16);
        assert_eq!(connections_for(100), 64);
        assert_eq!(connections_for(1 << 20), 65_536);
    }

    #[test]
    fn silence_is_timed_by_the_keep_alive_and_a_begun_request_by_the_header_timeout() {
        let limits = ConnLimits { header_timeout: Duration::from_secs(15), keep_alive: Duration::from_secs(120), max_connections: 8 };
        let epoch = Instant::now().checked_sub(Duration::from_secs(1000)).unwrap();
        let registry = Arc::new(Registry { epoch, next: AtomicU64::new(0), conns: Mutex::new(BTreeMap::new()) });
        let (c, _r) = registry.insert(false);
        let t = registry.now_ms();
        c.last_active_ms.store(t, Ordering::Release);
        // Silent after a response: kept for the keep-alive, not the header timeout.
        assert!(!c.expired(t + 60_000, &limits));
        assert!(c.expired(t + 120_000, &limits));
        // The first byte of a request 30 s later: its headers are due 15 s after it.
        c.first_byte_ms.store(t + 30_000, Ordering::Release);
        assert!(!c.expired(t + 44_000, &limits));
        assert!(c.expired(t + 45_000, &limits));
        // HTTP/2: bytes while no stream is open (ping acks) are not a request under way.
        c.h2.store(true, Ordering::Release);
        assert!(!c.expired(t + 60_000, &limits));
        // A request in flight is never expired; a probe connection keeps PROBE_IDLE.
        c.in_flight.store(1, Ordering::Release);
        assert!(!c.expired(t + 500_000, &limits));
        let (p, _q) = registry.insert(true);
        assert!(p.expired(registry.now_ms() + PROBE_IDLE.as_millis() as u64, &limits));
    }

    #[test]
    fn a_new_connection_is_not_closed_for_room_before_its_grace() {
        let epoch = Instant::now().checked_sub(Duration::from_secs(10)).unwrap();
        let registry = Arc::new(Registry { epoch, next: AtomicU64::new(0), conns: Mutex::new(BTreeMap::new()) });
        assert!(matches!(registry.close_oldest_idle(EVICT_GRACE), Evict::NoneIdle));
        let (old, _a) = registry.insert(false);
        let (new, _b) = registry.insert(false);
        // The one idle past its grace goes first; the newcomer is left to send its request.
        old.last_active_ms.store(registry.now_ms() - EVICT_GRACE.as_millis() as u64, Ordering::Release);
        assert!(matches!(registry.close_oldest_idle(EVICT_GRACE), Evict::Closed));
        assert!(old.closing.load(Ordering::Acquire) && !new.closing.load(Ordering::Acquire));
        match registry.close_oldest_idle(EVICT_GRACE) {
            Evict::WaitFor(d) => assert!(d > Duration::ZERO && d <= EVICT_GRACE, "{d:?}"),
            _ => panic!("the newcomer is within its grace"),
        }
        // A request in flight is never closed for room.
        new.in_flight.store(1, Ordering::Release);
        assert!(matches!(registry.close_oldest_idle(Duration::ZERO), Evict::NoneIdle));
    }
}
