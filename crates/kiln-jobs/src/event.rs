//! Job events and the emit sink that appends them to the NDJSON log.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use crate::store::Store;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `{"type":"started","ts":<ms>}`.
pub fn started() -> Value {
    json!({"type": "started", "ts": now_ms()})
}

/// `{"type":"log","line":…}`.
pub fn log(line: &str) -> Value {
    json!({"type": "log", "line": line})
}

/// `{"type":"stage","stage":…,"progress"?,"message"?}`.
pub fn stage(name: &str, progress: Option<f64>, message: Option<&str>) -> Value {
    let mut m = Map::new();
    m.insert("type".into(), "stage".into());
    m.insert("stage".into(), name.into());
    if let Some(p) = progress {
        m.insert("progress".into(), p.into());
    }
    if let Some(msg) = message {
        m.insert("message".into(), msg.into());
    }
    Value::Object(m)
}

/// `{"type":"done","ts":<ms>,"output_dir"?,"summary"?}`.
pub fn done(output_dir: Option<&str>, summary: Option<&Value>) -> Value {
    let mut m = Map::new();
    m.insert("type".into(), "done".into());
    m.insert("ts".into(), now_ms().into());
    if let Some(dir) = output_dir {
        m.insert("output_dir".into(), dir.into());
    }
    if let Some(s) = summary {
        m.insert("summary".into(), s.clone());
    }
    Value::Object(m)
}

/// `{"type":"failed","error":…,"ts":<ms>}`.
pub fn failed(error: &str) -> Value {
    json!({"type": "failed", "error": error, "ts": now_ms()})
}

/// `{"type":"cancelled","reason":…,"ts":<ms>}`.
pub fn cancelled(reason: &str) -> Value {
    json!({"type": "cancelled", "reason": reason, "ts": now_ms()})
}

/// True for the events that end a job's log: `done`, `failed`, `cancelled`.
pub fn is_terminal(event: &Value) -> bool {
    matches!(
        event.get("type").and_then(Value::as_str),
        Some("done" | "failed" | "cancelled")
    )
}

/// `<log_path>.stop`, touched by [`crate::JobHost::request_stop`].
pub fn stop_path(log_path: &std::path::Path) -> PathBuf {
    let mut p = log_path.as_os_str().to_owned();
    p.push(".stop");
    PathBuf::from(p)
}

/// The emit sink of one job: appends each event as one flushed line and, for
/// `stage`/`metric` events, updates the row's progress and message. Never fails.
#[derive(Debug, Clone)]
pub struct Emitter {
    store: Arc<Store>,
    id: String,
    log_path: PathBuf,
}

impl Emitter {
    /// The sink of job `id`, writing to `log_path`.
    pub fn new(store: Arc<Store>, id: impl Into<String>, log_path: impl Into<PathBuf>) -> Self {
        Emitter {
            store,
            id: id.into(),
            log_path: log_path.into(),
        }
    }

    /// The job this sink writes for.
    pub fn job_id(&self) -> &str {
        &self.id
    }

    /// The file whose existence asks the job to stop and save (spec §5.7's `request_stop`):
    /// `<log_path>.stop`.
    pub fn stop_path(&self) -> PathBuf {
        stop_path(&self.log_path)
    }

    /// Appends `event`; errors are logged and swallowed.
    pub fn emit(&self, event: &Value) {
        if let Err(e) = self.append(event) {
            tracing::warn!(job = %self.id, error = %e, "job event not written");
        }
        let kind = event.get("type").and_then(Value::as_str);
        if !matches!(kind, Some("stage" | "metric")) {
            return;
        }
        let message = event.get("message").and_then(Value::as_str);
        let updated = match (event.get("progress").and_then(Value::as_f64), message) {
            (Some(p), m) => self.store.set_progress(&self.id, p, m),
            (None, Some(m)) => self.store.set_message(&self.id, m),
            (None, None) => Ok(()),
        };
        if let Err(e) = updated {
            tracing::warn!(job = %self.id, error = %e, "job progress not recorded");
        }
    }

    fn append(&self, event: &Value) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(event).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log_path)?;
        // One write of a whole line on an O_APPEND file: the parent's and the
        // child's lines never interleave mid-line.
        file.write_all(&line)?;
        file.flush()
    }
}
