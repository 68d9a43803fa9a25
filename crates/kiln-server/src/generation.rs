//! The path every generation endpoint shares: fit the prompt into the context, hand the typed
//! request to the gateway, then either wait for the result or stream it as server-sent events.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use futures_util::stream;
use kiln_engine::{GenerateOutput, GenerateRequest};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::errors::{ApiError, Flavor};
use crate::gateway::{Event, GatewayError};
use crate::models::ServedModel;
use crate::state::AppState;

/// `max_tokens` for a prompt of `prompt_len` tokens: an explicit value must fit in the context
/// with the prompt (else 400 before any compute); a default is capped at the room left.
pub fn plan_max_tokens(
    state: &AppState,
    model: &ServedModel,
    prompt_len: usize,
    requested: Option<u64>,
    default: usize,
    field: &str,
) -> Result<usize, ApiError> {
    let ctx = model.info.context_len;
    if prompt_len == 0 {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    if prompt_len >= ctx {
        return Err(ApiError::bad_request(format!(
            "the prompt has {prompt_len} tokens but the context holds {ctx} (prompt plus at least one generated token) — shorten the prompt"
        ))
        .with_code("context_length_exceeded"));
    }
    let room = ctx - prompt_len;
    let n = match requested {
        Some(0) => return Err(ApiError::bad_request(format!("{field} must be at least 1"))),
        Some(n) if n > room as u64 => {
            return Err(ApiError::bad_request(format!(
                "request needs {} tokens of context (prompt {prompt_len} + {field} {n}) but the context holds {ctx} — shorten the prompt or lower {field}",
                prompt_len as u64 + n
            ))
            .with_code("context_length_exceeded"));
        }
        Some(n) => n as usize,
        None => state.config.max_tokens.unwrap_or(default).clamp(1, room),
    };
    let Some(memory) = &model.info.memory else {
        return Ok(n);
    };
    // A default max_tokens shrinks to the room the memory budget leaves, as it does to the
    // context's; an explicit one that does not fit is refused.
    let safe = memory.fit.max_safe_context;
    let n = if requested.is_none() {
        n.min(safe.saturating_sub(prompt_len)).max(1)
    } else {
        n
    };
    if prompt_len + n > safe {
        return Err(ApiError::bad_request(format!(
            "request needs {} tokens of context (prompt {prompt_len} + {field} {n}) but the memory budget caps safe context at {safe} — shorten the prompt or lower {field}",
            prompt_len + n
        ))
        .with_kind("memory_admission")
        .with_code("context_over_budget"));
    }
    Ok(n)
}

/// Runs CPU-heavy request preparation (template rendering, tokenizing up to a body-limit's
/// worth of text) off the async workers, so one big prompt cannot stall other connections.
pub async fn blocking<T: Send + 'static>(
    flavor: Flavor,
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        ApiError::internal(format!("request preparation failed: {e}")).flavor(flavor)
    })?
}

/// Sends `req` to `model`'s engine.
pub fn submit(
    model: &ServedModel,
    req: GenerateRequest,
    flavor: Flavor,
) -> Result<UnboundedReceiver<Event>, ApiError> {
    if model.info.embedding.is_some() {
        return Err(crate::models::not_generative(&model.info.id).flavor(flavor));
    }
    model.gateway.submit(req).map_err(|e| match e {
        GatewayError::Busy(_) => ApiError::busy(e.to_string()).flavor(flavor),
        GatewayError::Closed => ApiError::busy(e.to_string()).flavor(flavor),
    })
}

/// Waits for the whole generation.
pub async fn collect(
    mut rx: UnboundedReceiver<Event>,
    flavor: Flavor,
) -> Result<Box<GenerateOutput>, ApiError> {
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text { .. } => {}
            Event::Done(out) => return Ok(out),
            Event::Failed(msg) => return Err(ApiError::internal(msg).flavor(flavor)),
        }
    }
    Err(ApiError::internal("the engine stopped before finishing").flavor(flavor))
}

/// Turns engine events into the bytes of a stream (one API's framing).
pub trait Framer: Send + 'static {
    /// Frames sent before any generated text.
    fn start(&mut self) -> String;
    /// Frames for a piece of text (may be empty while text is held back), given the logprobs
    /// of the tokens behind it (streams that report logprobs send them with it; the rest
    /// ignore them).
    fn text(&mut self, piece: &str, logprobs: Vec<kiln_engine::request::TokenLogprob>) -> String;
    /// Closing frames.
    fn done(&mut self, out: &GenerateOutput) -> String;
    /// Frames reporting a failure mid-stream.
    fn failed(&mut self, message: &str) -> String;
}

/// `data: <json>\n\n`.
pub fn data_frame<T: serde::Serialize + ?Sized>(v: &T) -> String {
    format!("data: {}\n\n", frame_json(v))
}

/// `event: <name>\ndata: <json>\n\n`.
pub fn event_frame<T: serde::Serialize + ?Sized>(name: &str, v: &T) -> String {
    format!("event: {name}\ndata: {}\n\n", frame_json(v))
}

fn frame_json<T: serde::Serialize + ?Sized>(v: &T) -> String {
    // kiln's bodies are maps with string keys: serialising them cannot fail.
    serde_json::to_string(v).unwrap_or_else(|e| {
        tracing::error!("a response frame did not serialise: {e}");
        "{}".into()
    })
}

enum Phase {
    Start,
    Running,
    Finished,
}

/// A `text/event-stream` response fed by `rx`. When the client goes away the body is dropped,
/// which drops `rx`, which makes the engine's next `on_text` return false: cancellation.
pub fn sse_response<F: Framer>(rx: UnboundedReceiver<Event>, framer: F) -> Response {
    let s = stream::unfold(
        (rx, framer, Phase::Start),
        |(mut rx, mut framer, phase)| async move {
            let frames = match phase {
                Phase::Finished => return None,
                Phase::Start => {
                    let f = framer.start();
                    return Some((
                        Ok::<_, Infallible>(Bytes::from(f)),
                        (rx, framer, Phase::Running),
                    ));
                }
                Phase::Running => loop {
                    match rx.recv().await {
                        Some(Event::Text { text, logprobs }) => {
                            let f = framer.text(&text, logprobs);
                            if !f.is_empty() {
                                break (f, Phase::Running);
                            }
                        }
                        Some(Event::Done(out)) => break (framer.done(&out), Phase::Finished),
                        Some(Event::Failed(m)) => break (framer.failed(&m), Phase::Finished),
                        None => {
                            break (
                                framer.failed("the engine stopped before finishing"),
                                Phase::Finished,
                            );
                        }
                    }
                },
            };
            let (bytes, next) = frames;
            Some((Ok(Bytes::from(bytes)), (rx, framer, next)))
        },
    );
    let mut resp = Response::new(Body::from_stream(s));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// The OpenAI name of a finish reason.
pub fn finish_reason_str(out: &GenerateOutput, tool_calls: bool) -> &'static str {
    use kiln_engine::FinishReason;
    if tool_calls {
        return "tool_calls";
    }
    match out.finish_reason {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}
