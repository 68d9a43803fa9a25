//! The store's schema: an ordered list of additive migrations.

use rusqlite::{Connection, OptionalExtension};

use crate::error::Result;

/// Migrations, applied in order; entry `i` brings the schema to version `i + 1`.
/// Only ever append: a migration may add tables, columns and indexes, never drop them.
const MIGRATIONS: &[&str] = &[
    // 1: the jobs table of spec §5.2.
    "CREATE TABLE IF NOT EXISTS jobs (
        id TEXT PRIMARY KEY, kind TEXT NOT NULL, status TEXT NOT NULL, config_json TEXT NOT NULL,
        progress REAL NOT NULL DEFAULT 0, message TEXT, log_path TEXT NOT NULL, output_path TEXT,
        error TEXT, started_at TEXT NOT NULL DEFAULT (datetime('now')), ended_at TEXT);
     CREATE INDEX IF NOT EXISTS idx_jobs_status_started ON jobs(status, started_at DESC);",
    // 2: the child process of a heavy job, for boot recovery and cancel.
    "ALTER TABLE jobs ADD COLUMN pid INTEGER;
     ALTER TABLE jobs ADD COLUMN pid_start_time INTEGER;",
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: usize = MIGRATIONS.len();

/// Brings the database up to [`SCHEMA_VERSION`]; safe against a concurrent opener.
pub fn migrate(conn: &mut Connection) -> Result<()> {
    conn.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);")?;
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let current: Option<i64> = tx
        .query_row("SELECT MAX(version) FROM schema_version", [], |r| r.get(0))
        .optional()?
        .flatten();
    let current = usize::try_from(current.unwrap_or(0)).unwrap_or(0);
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current) {
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO schema_version (version) VALUES (?1)",
            [i as i64 + 1],
        )?;
    }
    tx.commit()?;
    Ok(())
}
