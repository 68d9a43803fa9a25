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

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};

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
    let max = limits.max_bytes;
    let declared = declared_length(req.headers());
    if declared == Some(0) {
        return next.run(req).await;
    }
    if let Some(n) = declared
        && n > max as u64
    {
        return refuse_unread(req, too_large(flavor, Some(n), max));
    }
    let (parts, mut body) = req.into_parts();
    let read = tokio::time::timeout(limits.timeout, Limited::new(&mut body, max).collect()).await;
    let refused = match read {
        Ok(Ok(whole)) => {
            let req = Request::from_parts(parts, Body::from(whole.to_bytes()));
            return next.run(req).await;
        }
        Ok(Err(e)) if e.is::<LengthLimitError>() => too_large(flavor, None, max),
        Ok(Err(e)) => {
            let e = ApiError::bad_request(format!("could not read the request body: {e}"));
            return close_after(e.flavor(flavor).into_response());
        }
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {:.1} s",
                limits.timeout.as_secs_f64()
            ),
        )
        .flavor(flavor)
        .into_response(),
    };
    // Past the limit, or a client still trickling its body: it reads the answer, not a reset.
    tokio::spawn(drain(body, DRAIN_MAX));
    close_after(refused)
}

/// Answers `refusal` to a request whose body has not been read: the body is drained in the
/// background (unless the client waits for `100 Continue`, and so sends nothing more) and the
/// connection closes after the answer.
pub fn refuse_unread(req: Request, refusal: Response) -> Response {
    let headers = req.headers();
    if declared_length(headers) != Some(0) && !expects_continue(headers) {
        tokio::spawn(drain(req.into_body(), DRAIN_MAX));
    }
    close_after(refusal)
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

fn too_large(flavor: Flavor, declared: Option<u64>, max: usize) -> Response {
    let message = match declared {
        Some(n) => format!("request body is too large: {n} bytes, the limit is {max}"),
        None => format!("request body is too large: over the limit of {max} bytes"),
    };
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message)
        .flavor(flavor)
        .into_response()
}

/// An answer given before the body was read whole: the connection closes after it.
fn close_after(mut resp: Response) -> Response {
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}
