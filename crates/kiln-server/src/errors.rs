//! API errors, shaped like OpenAI's (`{"error":{"message","type","code"}}`) or Anthropic's
//! (`{"type":"error","error":{"type","message"}}`) depending on the surface that raised them.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Which API family an error is reported in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `/v1/chat/completions`, `/v1/completions` and everything else.
    OpenAi,
    /// `/v1/messages` and `/v1/messages/count_tokens`.
    Anthropic,
}

impl Flavor {
    /// The flavor of errors on `path`.
    pub fn for_path(path: &str) -> Self {
        if path.starts_with("/v1/messages") {
            Flavor::Anthropic
        } else {
            Flavor::OpenAi
        }
    }
}

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message, naming the offending field where there is one.
    pub message: String,
    /// Machine-readable code (OpenAI `code`), when there is a specific one.
    pub code: Option<&'static str>,
    /// OpenAI `type` override (otherwise derived from the status).
    pub kind: Option<&'static str>,
    /// Error shape.
    pub flavor: Flavor,
    /// Seconds for `Retry-After` (503).
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// An error with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            code: None,
            kind: None,
            flavor: Flavor::OpenAi,
            retry_after: None,
        }
    }

    /// 400 with `message`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 401 for a missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid or missing API key (send `Authorization: Bearer <key>` or `x-api-key`)",
        )
        .with_code("invalid_api_key")
    }

    /// 404 with `message`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// 503 with a `Retry-After`.
    pub fn busy(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, message);
        e.retry_after = Some(1);
        e
    }

    /// 500 with `message`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// Sets the machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// Sets the OpenAI `type`.
    pub fn with_kind(mut self, kind: &'static str) -> Self {
        self.kind = Some(kind);
        self
    }

    /// Reports this error in `flavor`'s shape.
    pub fn flavor(mut self, flavor: Flavor) -> Self {
        self.flavor = flavor;
        self
    }

    fn openai_type(&self) -> &'static str {
        if let Some(k) = self.kind {
            return k;
        }
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            503 => "overloaded_error",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        }
    }

    fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            503 => "overloaded_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body of this error.
    pub fn body(&self) -> ErrorBody<'_> {
        match self.flavor {
            Flavor::OpenAi => ErrorBody::OpenAi {
                error: OpenAiError {
                    message: &self.message,
                    kind: self.openai_type(),
                    param: None,
                    code: self.code,
                },
            },
            Flavor::Anthropic => ErrorBody::Anthropic {
                kind: "error",
                error: AnthropicError {
                    kind: self.anthropic_type(),
                    message: &self.message,
                },
            },
        }
    }
}

impl std::fmt::Display for ErrorBody<'_> {
    /// The body as JSON text.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let json = serde_json::to_string(self).map_err(|_| std::fmt::Error)?;
        f.write_str(&json)
    }
}

/// An error body in its surface's shape.
#[derive(Serialize)]
#[serde(untagged)]
pub enum ErrorBody<'a> {
    /// `{"error":{"message","type","param","code"}}`.
    OpenAi {
        /// The error.
        error: OpenAiError<'a>,
    },
    /// `{"type":"error","error":{"type","message"}}`.
    Anthropic {
        /// Always `error`.
        #[serde(rename = "type")]
        kind: &'static str,
        /// The error.
        error: AnthropicError<'a>,
    },
}

/// OpenAI's error object.
#[derive(Serialize)]
pub struct OpenAiError<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'static str>,
    code: Option<&'static str>,
}

/// Anthropic's error object.
#[derive(Serialize)]
pub struct AnthropicError<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_json(e: &ApiError) -> serde_json::Value {
        serde_json::to_value(e.body()).expect("an error body serialises")
    }

    #[test]
    fn openai_shape_names_type_and_code() {
        let e = ApiError::unauthorized();
        let b = body_json(&e);
        assert!(b["error"]["param"].is_null());
        assert_eq!(b["error"]["type"], "authentication_error");
        assert_eq!(b["error"]["code"], "invalid_api_key");
        assert!(b["error"]["message"].as_str().unwrap().contains("API key"));
    }

    #[test]
    fn anthropic_shape() {
        let e = ApiError::bad_request("messages: empty").flavor(Flavor::Anthropic);
        let b = body_json(&e);
        assert_eq!(b["type"], "error");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["message"], "messages: empty");
    }

    #[test]
    fn busy_sets_retry_after() {
        let resp = ApiError::busy("queue full").into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
    }
}
