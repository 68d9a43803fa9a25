//! The lab's pages: one shell (`/lab`) and its scripts and style under `/lab/assets/`, compiled
//! into the binary. `KILN_PAGE_DIR` serves them from that folder instead, read on each request
//! (for working on the pages without rebuilding). `/quantize`, `/finetune`, `/dataset`,
//! `/status` and `/jobs` redirect to their hash routes.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// Every page file: name, content type, compiled-in text.
const FILES: [(&str, &str, &str); 8] = [
    (
        "lab.html",
        "text/html; charset=utf-8",
        include_str!("page/lab.html"),
    ),
    (
        "lab.css",
        "text/css; charset=utf-8",
        include_str!("page/lab.css"),
    ),
    (
        "chart.js",
        "text/javascript; charset=utf-8",
        include_str!("page/chart.js"),
    ),
    (
        "lab.js",
        "text/javascript; charset=utf-8",
        include_str!("page/lab.js"),
    ),
    (
        "quantize.js",
        "text/javascript; charset=utf-8",
        include_str!("page/quantize.js"),
    ),
    (
        "finetune.js",
        "text/javascript; charset=utf-8",
        include_str!("page/finetune.js"),
    ),
    (
        "dataset.js",
        "text/javascript; charset=utf-8",
        include_str!("page/dataset.js"),
    ),
    (
        "status.js",
        "text/javascript; charset=utf-8",
        include_str!("page/status.js"),
    ),
];

/// The pages talk only to this origin, run only their own scripts.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'";

pub(super) fn router() -> Router {
    let mut r = Router::new()
        .route("/lab", get(|| async { file("lab.html") }))
        .route(
            "/lab/assets/{name}",
            get(|Path(name): Path<String>| async move { file(&name) }),
        );
    for (path, hash) in [
        ("/quantize", "quantize"),
        ("/finetune", "finetune"),
        ("/dataset", "dataset"),
        ("/status", "status"),
        ("/jobs", "status"),
    ] {
        let to = format!("/lab#/{hash}");
        r = r.route(path, get(move || async move { found(&to) }));
    }
    r
}

/// A 302 to `to` (spec §3.8).
fn found(to: &str) -> Response {
    let mut r = StatusCode::FOUND.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

fn file(name: &str) -> Response {
    let Some(&(_, content_type, builtin)) = FILES.iter().find(|(n, _, _)| *n == name) else {
        return (StatusCode::NOT_FOUND, "no such page file").into_response();
    };
    let body = match std::env::var_os("KILN_PAGE_DIR") {
        Some(dir) => match std::fs::read_to_string(std::path::Path::new(&dir).join(name)) {
            Ok(text) => text,
            Err(e) => {
                return (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("KILN_PAGE_DIR: {name}: {e}"),
                )
                    .into_response();
            }
        },
        None => builtin.to_string(),
    };
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_the_shell_loads_is_served() {
        let shell = FILES[0].2;
        for (name, _, _) in &FILES[1..] {
            assert!(
                shell.contains(&format!("/lab/assets/{name}")),
                "lab.html does not load {name}"
            );
        }
    }
}
