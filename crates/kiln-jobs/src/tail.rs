//! Tailing a job's NDJSON log: replay from the start, then follow until terminal.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::mpsc;

use crate::error::{JobError, Result};
use crate::event;
use crate::status::JobStatus;
use crate::store::Store;

/// How long a terminal row waits for its terminal event to reach the log.
const TERMINAL_GRACE: Duration = Duration::from_millis(1500);

/// Reads complete lines appended to a log since the last read.
#[derive(Debug)]
pub struct LogReader {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl LogReader {
    /// A reader at the start of `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        LogReader {
            path: path.into(),
            offset: 0,
            partial: Vec::new(),
        }
    }

    /// The events of the complete lines written since the last call. A trailing
    /// partial line is kept for the next call (a writer may be mid-line), or
    /// dropped when `last` is set. A missing log reads as empty.
    pub fn read_new(&mut self, last: bool) -> std::io::Result<Vec<Value>> {
        match std::fs::File::open(&self.path) {
            Ok(mut f) => {
                f.seek(SeekFrom::Start(self.offset))?;
                let n = f.read_to_end(&mut self.partial)?;
                self.offset += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut events = Vec::new();
        let complete = self
            .partial
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        for line in self.partial[..complete].split(|&b| b == b'\n') {
            let line = line.trim_ascii();
            if line.is_empty() {
                continue;
            }
            match serde_json::from_slice::<Value>(line) {
                Ok(v) => events.push(v),
                // A crash left half a line that a later write completed: skip it.
                Err(e) => tracing::debug!(path = %self.path.display(), error = %e, "bad log line"),
            }
        }
        self.partial.drain(..complete);
        if last {
            self.partial.clear();
        }
        Ok(events)
    }
}

/// Sends every event of job `id` to `tx`: the whole log so far, then new
/// events as they are written, until the job is terminal and its log read.
/// Returns early (Ok) when the receiver goes away.
pub async fn follow(
    store: Arc<Store>,
    id: String,
    tx: mpsc::Sender<Value>,
    poll: Duration,
) -> Result<()> {
    let row = store
        .get(&id)?
        .ok_or_else(|| JobError::NotFound(id.clone()))?;
    let mut reader = LogReader::new(&row.log_path);
    let mut terminal_since: Option<Instant> = None;
    let mut saw_end = false;
    loop {
        let row = store
            .get(&id)?
            .ok_or_else(|| JobError::NotFound(id.clone()))?;
        let terminal = row.status.is_terminal();
        let grace_over = terminal_since.is_some_and(|t| t.elapsed() >= TERMINAL_GRACE);
        // On the last pass (terminal and its event seen, or the grace over) drop a partial line.
        let last = terminal && (saw_end || grace_over || row.status == JobStatus::Zombie);
        let events = reader
            .read_new(last)
            .map_err(|e| JobError::io("reading", &row.log_path, e))?;
        for ev in events {
            saw_end |= event::is_terminal(&ev);
            if tx.send(ev).await.is_err() {
                return Ok(());
            }
        }
        if last {
            return Ok(());
        }
        if terminal {
            terminal_since.get_or_insert_with(Instant::now);
            if saw_end {
                continue;
            }
        }
        tokio::time::sleep(poll).await;
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn partial_lines_wait_and_garbage_is_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.log");
        let mut f = std::fs::File::create(&path).expect("create");
        let mut r = LogReader::new(&path);
        f.write_all(b"{\"type\":\"started\"}\n{\"type\":\"lo")
            .expect("write");
        assert_eq!(r.read_new(false).expect("read").len(), 1);
        f.write_all(b"g\",\"line\":\"a\"}\nnot json\n{\"type\":\"done\"}\n{\"par")
            .expect("write");
        let evs = r.read_new(false).expect("read");
        assert_eq!(evs.len(), 2);
        assert_eq!(evs[0]["line"], "a");
        assert!(
            r.read_new(true).expect("read").is_empty(),
            "a partial last line is dropped"
        );
        assert!(
            LogReader::new(dir.path().join("missing"))
                .read_new(true)
                .expect("read")
                .is_empty()
        );
    }
}
