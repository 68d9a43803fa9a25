//! Job statuses and the persisted row.

use serde::{Deserialize, Serialize};

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Waiting for the execution lease.
    Queued,
    /// Running.
    Running,
    /// Finished successfully.
    Done,
    /// Finished with an error.
    Failed,
    /// Left unfinished by an earlier kiln process.
    Zombie,
    /// Stopped on request.
    Cancelled,
}

impl JobStatus {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Done => "done",
            JobStatus::Failed => "failed",
            JobStatus::Zombie => "zombie",
            JobStatus::Cancelled => "cancelled",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => JobStatus::Queued,
            "running" => JobStatus::Running,
            "done" => JobStatus::Done,
            "failed" => JobStatus::Failed,
            "zombie" => JobStatus::Zombie,
            "cancelled" => JobStatus::Cancelled,
            _ => return None,
        })
    }

    /// Done, failed, zombie and cancelled never change again.
    pub fn is_terminal(self) -> bool {
        !matches!(self, JobStatus::Queued | JobStatus::Running)
    }
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A persisted job (the shape of `GET /api/jobs/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRow {
    /// `job_` + 16 hex characters.
    pub id: String,
    /// The runner kind.
    pub kind: String,
    /// The status.
    pub status: JobStatus,
    /// The submitted config, as JSON text.
    pub config_json: String,
    /// Progress in 0..=1.
    pub progress: f64,
    /// The latest progress message.
    pub message: Option<String>,
    /// The NDJSON event log.
    pub log_path: String,
    /// What the job produced.
    pub output_path: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
    /// Creation time, `YYYY-MM-DD HH:MM:SS` UTC.
    pub started_at: String,
    /// When it reached a terminal status.
    pub ended_at: Option<String>,
    /// The child process of a heavy job.
    pub pid: Option<i64>,
}
