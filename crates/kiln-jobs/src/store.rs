//! The SQLite job store (WAL, shared by the server and its job children).

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::Value;

use crate::error::{JobError, Result};
use crate::paths::JobPaths;
use crate::schema;
use crate::status::{JobRow, JobStatus};

const COLUMNS: &str = "id, kind, status, config_json, progress, message, log_path, output_path, \
                       error, started_at, ended_at, pid";
const UNFINISHED: &str = "status IN ('queued','running')";

/// One connection to the job database; cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Store {
    conn: Mutex<Connection>,
    paths: JobPaths,
}

/// A fresh job id: `job_` + 16 lowercase hex characters from the OS CSPRNG.
pub fn new_job_id() -> Result<String> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| {
        JobError::io(
            "reading random bytes",
            "getrandom",
            std::io::Error::other(e.to_string()),
        )
    })?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("job_{hex}"))
}

impl Store {
    /// Opens (creating and migrating) the store under `paths`.
    pub fn open(paths: JobPaths) -> Result<Self> {
        let root = paths.root().to_path_buf();
        std::fs::create_dir_all(&root).map_err(|e| JobError::io("creating", &root, e))?;
        let logs = paths.logs_dir();
        if let Err(e) = std::fs::create_dir_all(&logs) {
            // Not fatal here: each job then fails with a clear error of its own.
            tracing::warn!(dir = %logs.display(), error = %e, "cannot create the job log directory");
        }
        let mut conn = Connection::open(paths.db())?;
        conn.busy_timeout(Duration::from_secs(10))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        schema::migrate(&mut conn)?;
        Ok(Store {
            conn: Mutex::new(conn),
            paths,
        })
    }

    /// The paths this store uses.
    pub fn paths(&self) -> &JobPaths {
        &self.paths
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The journal mode (`wal`).
    pub fn journal_mode(&self) -> Result<String> {
        Ok(self
            .conn()
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))?)
    }

    /// The applied schema version.
    pub fn schema_version(&self) -> Result<i64> {
        let v: Option<i64> =
            self.conn()
                .query_row("SELECT MAX(version) FROM schema_version", [], |r| r.get(0))?;
        Ok(v.unwrap_or(0))
    }

    /// Inserts a `queued` row and creates its empty log. If the log cannot be
    /// created, the row is kept but marked `failed` with the reason.
    pub fn create(&self, kind: &str, config: &Value) -> Result<JobRow> {
        self.create_with_output(kind, config, None)
    }

    /// [`create`](Self::create) with the output path known up front (reported by `done`
    /// when the runner returns none).
    pub fn create_with_output(
        &self,
        kind: &str,
        config: &Value,
        output_path: Option<&str>,
    ) -> Result<JobRow> {
        let id = new_job_id()?;
        let log_path = self.paths.log(&id);
        let config_json = config.to_string();
        self.conn().execute(
            "INSERT INTO jobs (id, kind, status, config_json, log_path, output_path) \
             VALUES (?1, ?2, 'queued', ?3, ?4, ?5)",
            params![
                id,
                kind,
                config_json,
                log_path.to_string_lossy(),
                output_path
            ],
        )?;
        let created = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path);
        if let Err(e) = created {
            let error = format!("cannot create the job log {}: {e}", log_path.display());
            tracing::error!(job = %id, "{error}");
            self.finish(&id, JobStatus::Failed, Some(&error))?;
        }
        self.get(&id)?.ok_or(JobError::NotFound(id))
    }

    /// The row of job `id`.
    pub fn get(&self, id: &str) -> Result<Option<JobRow>> {
        let sql = format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1");
        let row = self.conn().query_row(&sql, [id], read_row).optional()?;
        row.transpose()
    }

    /// The newest `limit` rows, optionally of one kind.
    pub fn recent(&self, limit: usize, kind: Option<&str>) -> Result<Vec<JobRow>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let conn = self.conn();
        let order = "ORDER BY started_at DESC, rowid DESC LIMIT";
        let rows = match kind {
            Some(kind) => {
                let sql = format!("SELECT {COLUMNS} FROM jobs WHERE kind = ?1 {order} ?2");
                let mut stmt = conn.prepare(&sql)?;
                stmt.query_map(params![kind, limit], read_row)?
                    .collect::<rusqlite::Result<Vec<_>>>()?
            }
            None => {
                let sql = format!("SELECT {COLUMNS} FROM jobs {order} ?1");
                let mut stmt = conn.prepare(&sql)?;
                stmt.query_map(params![limit], read_row)?
                    .collect::<rusqlite::Result<Vec<_>>>()?
            }
        };
        rows.into_iter().collect()
    }

    /// Rows still `queued` or `running`.
    pub fn unfinished(&self) -> Result<Vec<(JobRow, Option<u64>)>> {
        let sql = format!("SELECT {COLUMNS}, pid_start_time FROM jobs WHERE {UNFINISHED}");
        let conn = self.conn();
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt
            .query_map([], |r| {
                let start: Option<i64> = r.get(12)?;
                Ok((read_row(r)?, start.and_then(|s| u64::try_from(s).ok())))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter()
            .map(|(row, s)| row.map(|r| (r, s)))
            .collect()
    }

    /// The recorded child process of job `id`: pid and start time.
    pub fn pid_of(&self, id: &str) -> Result<Option<(u32, Option<u64>)>> {
        let got: Option<(Option<i64>, Option<i64>)> = self
            .conn()
            .query_row(
                "SELECT pid, pid_start_time FROM jobs WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        Ok(got.and_then(|(pid, start)| {
            let pid = u32::try_from(pid?).ok()?;
            Some((pid, start.and_then(|s| u64::try_from(s).ok())))
        }))
    }

    /// `queued` → `running`; false if the row was not queued.
    pub fn set_running(&self, id: &str) -> Result<bool> {
        let n = self.conn().execute(
            "UPDATE jobs SET status = 'running' WHERE id = ?1 AND status = 'queued'",
            [id],
        )?;
        Ok(n == 1)
    }

    /// `queued` → `running` by the child process itself, recording its pid and
    /// start time in the same update; false if the row was not queued.
    pub fn set_running_as(&self, id: &str, pid: u32, start_time: Option<u64>) -> Result<bool> {
        let start = start_time.and_then(|s| i64::try_from(s).ok());
        let n = self.conn().execute(
            "UPDATE jobs SET status = 'running', pid = ?2, pid_start_time = ?3 \
             WHERE id = ?1 AND status = 'queued'",
            params![id, pid, start],
        )?;
        Ok(n == 1)
    }

    /// Moves an unfinished job to a terminal `status` with `ended_at = now`.
    /// Returns false (and changes nothing) if it was already terminal.
    pub fn finish(&self, id: &str, status: JobStatus, error: Option<&str>) -> Result<bool> {
        let sql = format!(
            "UPDATE jobs SET status = ?2, error = COALESCE(?3, error), ended_at = datetime('now'), \
             progress = CASE WHEN ?2 = 'done' THEN 1 ELSE progress END \
             WHERE id = ?1 AND {UNFINISHED}"
        );
        let n = self
            .conn()
            .execute(&sql, params![id, status.as_str(), error])?;
        Ok(n == 1)
    }

    /// Sets the progress (clamped to 0..=1) and, if given, the message.
    pub fn set_progress(&self, id: &str, progress: f64, message: Option<&str>) -> Result<()> {
        let p = if progress.is_finite() {
            progress.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.conn().execute(
            "UPDATE jobs SET progress = ?2, message = COALESCE(?3, message) WHERE id = ?1",
            params![id, p, message],
        )?;
        Ok(())
    }

    /// Sets the message alone.
    pub fn set_message(&self, id: &str, message: &str) -> Result<()> {
        self.conn().execute(
            "UPDATE jobs SET message = ?2 WHERE id = ?1",
            params![id, message],
        )?;
        Ok(())
    }

    /// Records what the job produced.
    pub fn set_output_path(&self, id: &str, path: &str) -> Result<()> {
        self.conn().execute(
            "UPDATE jobs SET output_path = ?2 WHERE id = ?1",
            params![id, path],
        )?;
        Ok(())
    }

    /// Records the child process (pid and its start time in clock ticks since boot).
    pub fn set_pid(&self, id: &str, pid: u32, start_time: Option<u64>) -> Result<()> {
        let start = start_time.and_then(|s| i64::try_from(s).ok());
        self.conn().execute(
            "UPDATE jobs SET pid = ?2, pid_start_time = ?3 WHERE id = ?1",
            params![id, pid, start],
        )?;
        Ok(())
    }
}

fn read_row(r: &Row<'_>) -> rusqlite::Result<Result<JobRow>> {
    let status: String = r.get(2)?;
    let Some(status) = JobStatus::parse(&status) else {
        return Ok(Err(JobError::BadRow(format!("unknown status {status:?}"))));
    };
    Ok(Ok(JobRow {
        id: r.get(0)?,
        kind: r.get(1)?,
        status,
        config_json: r.get(3)?,
        progress: r.get(4)?,
        message: r.get(5)?,
        log_path: r.get(6)?,
        output_path: r.get(7)?,
        error: r.get(8)?,
        started_at: r.get(9)?,
        ended_at: r.get(10)?,
        pid: r.get(11)?,
    }))
}
