//! The accept loop: HTTP/1.1 and HTTP/2 over hyper, with the limits a server facing the open
//! network needs and `axum::serve` does not set.
//!
//! - `--header-timeout`: a connection has that long to send a request's headers, counted from
//!   its opening or from the end of its previous response, so one timer ends both slow-header
//!   (slowloris) connections and idle keep-alive ones, HTTP/2 ones (no stream open) included.
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
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tower::ServiceExt;

/// Connection limits.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Seconds to send a request's headers (and the longest idle keep-alive).
    pub header_timeout: Duration,
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
    /// Set once something asked it to close.
    closing: AtomicBool,
    close: Notify,
    /// A probe-reserve connection.
    probe: bool,
}

impl ConnState {
    fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
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

    /// Asks every connection idle for longer than its timeout to close; how many.
    fn close_idle(&self, timeout: Duration) -> usize {
        let now = self.now_ms();
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns
            .values()
            .filter(|c| {
                let limit = if c.probe { PROBE_IDLE } else { timeout };
                c.idle() && now.saturating_sub(c.last_active_ms.load(Ordering::Acquire)) >= limit.as_millis() as u64
            })
            .filter(|c| c.close())
            .count()
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
        self.state.in_flight.fetch_sub(1, Ordering::AcqRel);
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
        let (registry, timeout) = (registry.clone(), limits.header_timeout);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250).min(timeout / 2).max(Duration::from_millis(10)));
            loop {
                tick.tick().await;
                for _ in 0..registry.close_idle(timeout) {
                    crate::serve::metrics::record_connection_closed("idle");
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
                    let in_flight = InFlight::new(state, registry);
                    let resp = app.oneshot(req.map(Body::new)).await?;
                    Ok(resp.map(|inner| Body::new(Tracked { inner, _in_flight: in_flight })))
                }
            })
        };
        let header_timeout = if probe { PROBE_IDLE } else { limits.header_timeout };
        let mut builder = Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(header_timeout);
        builder.http2().timer(TokioTimer::new()).keep_alive_interval(Some(header_timeout)).keep_alive_timeout(header_timeout);
        tokio::spawn(async move {
            let (_slot, _registered) = (slot, registered);
            // hyper reads the first bytes to tell HTTP/1 from HTTP/2 before its header timer
            // starts: a connection that sends nothing is timed here (and may be closed for room).
            let mut first = [0u8; 1];
            tokio::select! {
                peeked = tokio::time::timeout(header_timeout, stream.peek(&mut first)) => {
                    if !matches!(peeked, Ok(Ok(n)) if n > 0) {
                        return;
                    }
                }
                _ = state.close.notified() => return,
            }
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
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
