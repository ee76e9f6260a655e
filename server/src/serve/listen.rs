//! The accept loop: HTTP/1.1 and HTTP/2 over hyper, with the limits a server facing the open
//! network needs and `axum::serve` does not set.
//!
//! - `--header-timeout`: a connection has that long to send a request's headers, counted from
//!   its opening or from the end of its previous response, so one timer ends both slow-header
//!   (slowloris) connections and idle keep-alive ones.
//! - `--max-connections`: connections beyond it are closed as they are accepted (and counted in
//!   `pace_http_connections_refused_total`), so a flood of slow clients cannot exhaust the
//!   process's file descriptors; a probe of `/health` gets in as soon as one closes.
//! - The body's own time limit is the extractor's (`--body-timeout`, a 408).
//!
//! On shutdown the loop stops accepting and every open connection is asked to finish (HTTP/1:
//! close after the response in progress; HTTP/2: GOAWAY), for at most `grace`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// Connection limits.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Seconds to send a request's headers (and the longest idle keep-alive).
    pub header_timeout: Duration,
    /// Most open connections.
    pub max_connections: usize,
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets open connections finish for
/// at most `grace`.
pub async fn serve(listener: TcpListener, app: Router, limits: ConnLimits, shutdown: impl Future<Output = ()>, grace: Duration) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut refused_logged = false;
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors or a connection reset before accept: back off briefly.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            crate::serve::metrics::record_connection_refused();
            if !std::mem::replace(&mut refused_logged, true) {
                tracing::warn!("--max-connections ({}) reached: closing new connections (logged once)", limits.max_connections);
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let header_timeout = limits.header_timeout;
        let service = TowerToHyperService::new(app.map_request(|req: axum::http::Request<Incoming>| req.map(axum::body::Body::new)));
        let mut builder = Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(header_timeout);
        builder.http2().timer(TokioTimer::new()).keep_alive_interval(Some(header_timeout)).keep_alive_timeout(header_timeout);
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            // hyper reads the first bytes to tell HTTP/1 from HTTP/2 before its header timer
            // starts: a connection that sends nothing must be timed here.
            let mut first = [0u8; 1];
            if !matches!(tokio::time::timeout(header_timeout, stream.peek(&mut first)).await, Ok(Ok(n)) if n > 0) {
                drop(slot);
                return;
            }
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!("connection from {peer}: {e}");
            }
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::debug!("connections still open after {} s of shutdown grace", grace.as_secs_f64());
    }
}
