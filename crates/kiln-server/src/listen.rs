//! The accept loop: one HTTP/1.1 connection per task, with the limits a server on a shared
//! machine needs. A connection must send a complete request head within the header timeout,
//! also between requests on a kept-alive connection (hyper measures both from the moment it
//! waits for the next head), so idle and slow-header connections are closed instead of holding a
//! file descriptor forever. A response already streaming is never cut by it: the timer only runs
//! while a head is awaited. Beyond `max_connections` a new connection gets a 503 and is closed.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::errors::ApiError;

/// Per-connection limits (`kiln serve --header-timeout`, `--body-timeout`, `--max-connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Time a connection has to send a complete request head, on a new connection and between
    /// requests on a kept-alive one.
    pub header_timeout: Duration,
    /// Time a client has to send a request's whole body once its head has arrived.
    pub body_timeout: Duration,
    /// Connections served at once; the next one is answered 503 and closed.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            max_connections: 512,
        }
    }
}

/// How long a refused connection is kept to send its 503 and read what the client sent, so
/// that closing it does not reset the connection before the client has read the answer.
const REFUSAL_LINGER: Duration = Duration::from_secs(2);
/// Refusals answered at once; beyond them a connection is closed without an answer, so a flood
/// of connections cannot hold more than this many extra file descriptors.
const MAX_REFUSALS: usize = 64;

/// Serves `app` on `listener` until `shutdown` resolves, then stops accepting and waits for
/// in-flight requests (streams included) to finish.
pub async fn serve_connections(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let cap = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let slots = Arc::new(Semaphore::new(cap));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut shutdown = pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    tokio::select! {
                        () = on_accept_error(e) => continue,
                        () = &mut shutdown => break,
                    }
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if let Ok(refusal) = refusals.clone().try_acquire_owned() {
                tokio::spawn(async move {
                    refuse(stream, cap).await;
                    drop(refusal);
                });
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = app
            .clone()
            .map_request(|req: axum::http::Request<Incoming>| req.map(Body::new));
        let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("connection ended: {e}");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Accept errors are about one connection (reset before accept) or about the process (out of
/// file descriptors); the latter get a pause so the loop does not spin on them.
async fn on_accept_error(e: std::io::Error) {
    use std::io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset | Interrupted
    ) {
        return;
    }
    tracing::warn!("accepting a connection failed: {e}; pausing for a second");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Answers a connection over the cap with a 503 (OpenAI's error shape: no path has been read)
/// and closes it once the client has had the time to read the answer.
async fn refuse(mut stream: TcpStream, cap: usize) {
    let body = ApiError::busy(format!(
        "the server is at its limit of {cap} open connections; retry shortly"
    ))
    .body()
    .to_string();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let answer = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await?;
        // Read (and drop) whatever the client sends until it closes: closing with unread data
        // would reset the connection and could destroy the answer in flight.
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    };
    let _ = tokio::time::timeout(REFUSAL_LINGER, answer).await;
}
