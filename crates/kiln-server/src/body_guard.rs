//! Request bodies are read here, before routing, within the size limit and the body timeout.
//!
//! A body declared larger than the limit (`Content-Length`) is refused before a byte of it is
//! read; a chunked one is refused when it crosses the limit. Either way the client gets a 413 it
//! can read: a client that keeps sending (as `requests` and the OpenAI SDK do) would see a reset
//! connection, not the answer, if the server closed with its data unread, so the rest of the body
//! is drained (up to [`DRAIN_MAX`] bytes and [`DRAIN_TIME`]) after the answer and the connection
//! then closed. Every route after this one sees a fully read body, so no error answered early
//! (401, 404…) leaves unread data behind either.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;

use crate::errors::{ApiError, Flavor};

/// The most a refused body is read for, after its 413, before the connection is closed.
pub const DRAIN_MAX: u64 = 64 << 20;
/// The longest a refused body is read for.
pub const DRAIN_TIME: Duration = Duration::from_secs(10);

/// The body limits in force.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Largest body accepted, in bytes.
    pub max_bytes: usize,
    /// Time to receive the whole body.
    pub timeout: Duration,
}

/// Middleware: reads the body within [`BodyLimits`] and hands it on whole.
pub async fn read_body(State(limits): State<BodyLimits>, req: Request, next: Next) -> Response {
    let flavor = Flavor::for_path(req.uri().path());
    let max = limits.max_bytes as u64;
    let declared = declared_length(req.headers());
    if declared == Some(0) {
        return next.run(req).await;
    }
    if let Some(n) = declared
        && n > max
    {
        let expects_continue = expects_continue(req.headers());
        let body = req.into_body();
        // A client waiting for `100 Continue` sends nothing more once it has the 413.
        if !expects_continue {
            tokio::spawn(drain(body, n.min(DRAIN_MAX)));
        }
        return too_large(flavor, Some(n), max);
    }
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(limits.timeout, read_up_to(body, max)).await {
        Err(_) => refusal(
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s",
                    limits.timeout.as_secs()
                ),
            )
            .flavor(flavor),
        ),
        Ok(Read::Whole(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Read::TooLarge(rest)) => {
            tokio::spawn(drain(rest, DRAIN_MAX));
            too_large(flavor, None, max)
        }
        Ok(Read::Failed(e)) => refusal(
            ApiError::bad_request(format!("could not read the request body: {e}")).flavor(flavor),
        ),
    }
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get(header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
}

enum Read {
    Whole(Bytes),
    /// The limit was crossed; what is left of the body, to drain.
    TooLarge(Body),
    Failed(axum::Error),
}

async fn read_up_to(mut body: Body, max: u64) -> Read {
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => return Read::Failed(e),
        };
        if let Ok(data) = frame.into_data() {
            if (buf.len() + data.len()) as u64 > max {
                return Read::TooLarge(body);
            }
            buf.extend_from_slice(&data);
        }
    }
    Read::Whole(Bytes::from(buf))
}

/// Reads and drops up to `max` bytes of `body` (within [`DRAIN_TIME`]).
async fn drain(mut body: Body, max: u64) {
    let reading = async {
        let mut seen = 0u64;
        while seen < max {
            match body.frame().await {
                Some(Ok(frame)) => {
                    seen += frame.data_ref().map_or(0, |d| d.len() as u64);
                }
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, reading).await;
}

fn too_large(flavor: Flavor, declared: Option<u64>, max: u64) -> Response {
    let message = match declared {
        Some(n) => format!("request body is too large: {n} bytes, the limit is {max}"),
        None => format!("request body is too large: over the limit of {max} bytes"),
    };
    refusal(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message).flavor(flavor))
}

/// An error answered before the body was read whole: the connection closes after it.
fn refusal(e: ApiError) -> Response {
    let mut resp = e.into_response();
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}
