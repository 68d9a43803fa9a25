//! Safety middleware: API key (Bearer or `x-api-key`, compared in constant time), the `Host`
//! check against DNS rebinding on loopback binds, and CORS only for `--cors-origin`.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::errors::{ApiError, Flavor};
use crate::state::SharedState;

/// Paths that never need a key: liveness, readiness (probes) and the chat page (which asks for the key itself).
const OPEN_PATHS: [&str; 3] = ["/health", "/ready", "/"];

/// Whether `path` needs no key: the built-in open paths and the extensions' own.
fn is_open(state: &crate::state::AppState, path: &str) -> bool {
    OPEN_PATHS.contains(&path)
        || state.open_paths.iter().any(|p| {
            if p.ends_with('/') {
                path.starts_with(p)
            } else {
                path == *p
            }
        })
}

/// Whether `headers` carry `key`.
pub fn key_matches(headers: &HeaderMap, key: &str) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    [bearer, x_api_key]
        .into_iter()
        .flatten()
        .any(|given| bool::from(given.as_bytes().ct_eq(key.as_bytes())))
}

/// Whether a `Host` header is acceptable for a server bound to loopback `port`.
pub fn host_allowed(host: &str, port: u16) -> bool {
    let (name, p) = match host.rsplit_once(':') {
        // `[::1]:8080` or `localhost:8080`; a bare `::1` has colons but no brackets.
        Some((n, p)) if !n.is_empty() && (n.starts_with('[') || !n.contains(':')) => (n, Some(p)),
        _ => (host, None),
    };
    let name_ok = matches!(
        name.to_ascii_lowercase().as_str(),
        "localhost" | "127.0.0.1" | "[::1]"
    ) || name
        .parse::<std::net::Ipv4Addr>()
        .is_ok_and(|ip| ip.is_loopback());
    let port_ok = p.is_none_or(|p| p.parse::<u16>() == Ok(port));
    name_ok && port_ok
}

/// The middleware.
pub async fn guard(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let flavor = Flavor::for_path(&path);
    let origin = req.headers().get(header::ORIGIN).cloned();
    let cors = state
        .config
        .cors_origin
        .as_deref()
        .and_then(|allowed| allowed_origin(allowed, origin.as_ref()));
    if req.method() == Method::OPTIONS
        && let Some(o) = &cors
    {
        return preflight(o.clone());
    }
    if state.local_addr.ip().is_loopback() {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok());
        if let Some(h) = host
            && !host_allowed(h, state.local_addr.port())
        {
            let refusal = ApiError::new(
                StatusCode::FORBIDDEN,
                format!("Host {h:?} is not allowed on a loopback server"),
            )
            .flavor(flavor)
            .into_response();
            return crate::body_guard::refuse_unread(req, refusal);
        }
    }
    if let Some(key) = &state.config.api_key
        && !is_open(&state, &path)
        && !key_matches(req.headers(), key)
    {
        let mut r = ApiError::unauthorized().flavor(flavor).into_response();
        add_cors(&mut r, cors);
        return crate::body_guard::refuse_unread(req, r);
    }
    let mut resp = next.run(req).await;
    add_cors(&mut resp, cors);
    resp
}

fn allowed_origin(allowed: &str, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
    if allowed == "*" {
        return Some(HeaderValue::from_static("*"));
    }
    let o = origin?;
    (o.as_bytes() == allowed.as_bytes()).then(|| o.clone())
}

fn add_cors(resp: &mut Response, origin: Option<HeaderValue>) {
    if let Some(o) = origin {
        let h = resp.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
    }
}

fn preflight(origin: HeaderValue) -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(
            "authorization, content-type, x-api-key, anthropic-version, anthropic-beta",
        ),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    h.insert(header::VARY, HeaderValue::from_static("Origin"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        assert!(host_allowed("127.0.0.1:8080", 8080));
        assert!(host_allowed("localhost:8080", 8080));
        assert!(host_allowed("[::1]:8080", 8080));
        assert!(host_allowed("localhost", 8080));
        assert!(!host_allowed("evil.example:8080", 8080));
        assert!(!host_allowed("localhost:9999", 8080));
        assert!(!host_allowed("127.0.0.1.evil.example:8080", 8080));
    }

    #[test]
    fn keys() {
        let mut h = HeaderMap::new();
        assert!(!key_matches(&h, "k"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        assert!(key_matches(&h, "k"));
        assert!(!key_matches(&h, "kk"));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("k"));
        assert!(key_matches(&h, "k"));
    }
}
