//! The chat page at `/`: one self-contained HTML file compiled into the binary (no Node
//! toolchain), streaming from `/v1/chat/completions`.

use axum::http::{HeaderValue, header};
use axum::response::{Html, IntoResponse, Response};

/// The page.
pub const HTML: &str = include_str!("index.html");

/// `GET /`.
pub async fn index() -> Response {
    let mut r = Html(HTML).into_response();
    // The page talks only to this origin.
    r.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
        ),
    );
    r
}
