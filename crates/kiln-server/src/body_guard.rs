//! Request bodies are read here, after the auth and Host checks and before routing, within the
//! size limit and the body timeout.
//!
//! A body declared larger than the limit (`Content-Length`) is refused before a byte of it is
//! read; a chunked one is refused when it crosses the limit. Either way the client gets a 413 it
//! can read: a client that keeps sending (as `requests` and the OpenAI SDK do) would see a reset
//! connection, not the answer, if the server closed with its data unread, so the rest of the body
//! is drained (up to [`DRAIN_MAX`] bytes and [`DRAIN_TIME`]) after the answer and the connection
//! then closed. Every route after this one sees a fully read body, so no error answered early
//! (404, 405…) leaves unread data behind either; the auth and Host refusals, which come before
//! this layer so that no unauthenticated body is ever buffered, drain theirs through
//! [`refuse_unread`].

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
/// A refused body that sends nothing for this long is not waited for (nginx's lingering close
/// works the same way).
pub const DRAIN_IDLE: Duration = Duration::from_secs(2);

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
    let (parts, mut body) = req.into_parts();
    let read = tokio::time::timeout(limits.timeout, read_up_to(&mut body, max)).await;
    match read {
        Ok(Read::Whole(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(_) => {
            // A client still trickling its body reads the 408 rather than a reset.
            tokio::spawn(drain(body, DRAIN_MAX));
            refusal(
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request body did not arrive within {:.1} s",
                        limits.timeout.as_secs_f64()
                    ),
                )
                .flavor(flavor),
            )
        }
        Ok(Read::TooLarge) => {
            tokio::spawn(drain(body, DRAIN_MAX));
            too_large(flavor, None, max)
        }
        Ok(Read::Failed(e)) => refusal(
            ApiError::bad_request(format!("could not read the request body: {e}")).flavor(flavor),
        ),
    }
}

/// Answers `refusal` to a request whose body has not been read: the body is drained in the
/// background (bounded as for a 413) and the connection closes after the answer.
pub fn refuse_unread(req: Request, refusal: Response) -> Response {
    let headers = req.headers();
    if declared_length(headers) != Some(0) && !expects_continue(headers) {
        tokio::spawn(drain(req.into_body(), DRAIN_MAX));
    }
    let mut resp = refusal;
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
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
    /// The limit was crossed; the rest of the body is still unread.
    TooLarge,
    Failed(axum::Error),
}

async fn read_up_to(body: &mut Body, max: u64) -> Read {
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => return Read::Failed(e),
        };
        if let Ok(data) = frame.into_data() {
            if (buf.len() + data.len()) as u64 > max {
                return Read::TooLarge;
            }
            buf.extend_from_slice(&data);
        }
    }
    Read::Whole(Bytes::from(buf))
}

/// Reads and drops up to `max` bytes of `body`, within [`DRAIN_TIME`], until the client stops
/// sending for [`DRAIN_IDLE`].
async fn drain(mut body: Body, max: u64) {
    let reading = async {
        let mut seen = 0u64;
        while seen < max {
            match tokio::time::timeout(DRAIN_IDLE, body.frame()).await {
                Ok(Some(Ok(frame))) => {
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
