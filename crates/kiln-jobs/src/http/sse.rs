//! `GET /api/jobs/{id}/stream`: SSE replay-then-follow (spec §5.6).

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::error::JobError;
use crate::host::JobHost;
use crate::tail;

const POLL: Duration = Duration::from_millis(200);
const RETRY: Duration = Duration::from_millis(1500);

/// Streams `retry`, one `data:` frame (with `id: <n>`) per event, then `event: end`.
/// `Last-Event-ID: n` resumes after event n. An unknown id gets a `failed` frame and `end`.
pub(super) async fn stream(
    State(host): State<JobHost>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let skip = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(0, |n| n.saturating_add(1));
    let (tx, rx) = mpsc::channel::<Event>(64);
    let store = host.store().clone();
    tokio::spawn(async move {
        if tx.send(Event::default().retry(RETRY)).await.is_err() {
            return;
        }
        let (vtx, mut vrx) = mpsc::channel::<Value>(64);
        let follower = tokio::spawn(tail::follow(store, id.clone(), vtx, POLL));
        let mut n: u64 = 0;
        while let Some(ev) = vrx.recv().await {
            if n >= skip {
                let frame = Event::default().id(n.to_string()).data(ev.to_string());
                if tx.send(frame).await.is_err() {
                    return;
                }
            }
            n += 1;
        }
        let failure = match follower.await {
            Ok(Ok(())) => None,
            Ok(Err(JobError::NotFound(_))) => Some(format!("job {id} not found")),
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(format!("tail failed: {e}")),
        };
        if let Some(error) = failure {
            let ev = json!({"type": "failed", "error": error, "ts": crate::event::now_ms()});
            let _ = tx.send(Event::default().data(ev.to_string())).await;
        }
        let _ = tx.send(Event::default().event("end").data("{}")).await;
    });
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    let headers = [
        (header::CACHE_CONTROL, "no-cache"),
        (header::HeaderName::from_static("x-accel-buffering"), "no"),
    ];
    (headers, Sse::new(events)).into_response()
}
