//! Request bodies: bytes → typed request, with errors that name the offending field.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::errors::{ApiError, Flavor};

/// Parses a JSON body into `T`; a body over the size limit is a 413, malformed JSON (or
/// invalid UTF-8) a 400 saying so, and a wrongly typed field a 400 naming its path.
pub fn parse_json<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    flavor: Flavor,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|rej| {
        let status = rej.status();
        let msg = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "request body is too large".to_string()
        } else {
            format!("could not read the request body: {rej}")
        };
        ApiError::new(status, msg).flavor(flavor)
    })?;
    parse_slice(&bytes).map_err(|e| e.flavor(flavor))
}

/// A request whose sampling fields are read by a second pass over the same bytes (serde's
/// `flatten` would lose the field names in error messages).
pub trait WithSampling: DeserializeOwned {
    /// Stores the sampling fields.
    fn set_sampling(&mut self, s: crate::sampling::SamplingFields);
}

/// [`parse_json`] for a request with sampling fields.
pub fn parse_request<T: WithSampling>(
    body: Result<Bytes, BytesRejection>,
    flavor: Flavor,
) -> Result<T, ApiError> {
    let bytes: Bytes = body.map_err(|rej| {
        let status = rej.status();
        let msg = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "request body is too large".to_string()
        } else {
            format!("could not read the request body: {rej}")
        };
        ApiError::new(status, msg).flavor(flavor)
    })?;
    let mut req: T = parse_slice(&bytes).map_err(|e| e.flavor(flavor))?;
    req.set_sampling(parse_slice(&bytes).map_err(|e| e.flavor(flavor))?);
    Ok(req)
}

/// [`parse_json`] on bytes already read.
pub fn parse_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "the request body is empty; expected a JSON object",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() || inner.is_io() {
            ApiError::bad_request(format!("invalid JSON: {inner}"))
        } else if path == "." || path.is_empty() {
            ApiError::bad_request(format!("invalid request: {inner}"))
        } else {
            ApiError::bad_request(format!("{path}: {inner}"))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct T {
        #[allow(dead_code)]
        a: Option<bool>,
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse_slice::<T>(br#"{"a": "yes"}"#).unwrap_err();
        assert!(e.message.starts_with("a: invalid type"), "{}", e.message);
        let e = parse_slice::<T>(br#"{"a": tru"#).unwrap_err();
        assert!(e.message.starts_with("invalid JSON"), "{}", e.message);
        let e = parse_slice::<T>(b"{\"a\": \"\xff\"}").unwrap_err();
        assert!(e.message.starts_with("invalid JSON"), "{}", e.message);
        let e = parse_slice::<T>(b"\"x\"").unwrap_err();
        assert!(e.message.starts_with("invalid request"), "{}", e.message);
        assert!(parse_slice::<T>(b"  ").is_err());
    }
}
