//! kiln's job system: tracked, leased, cancellable lab jobs that never lose a row.
//!
//! - [`Store`]: SQLite (WAL) rows plus one NDJSON event log per job.
//! - [`JobRunner`]s registered by kind in a [`Registry`]; in-process kinds run on
//!   the host's runtime, heavy kinds in a child (`kiln __job <id>`, see [`child_main`]).
//! - [`JobHost`]: submit, cancel, close, boot recovery, and the [`ExecutionLease`]
//!   (one heavy job at a time, FIFO) with the inference gate of [`JobPolicy`].
//! - [`http::router`]: the `/api/jobs` API, its SSE tail, and the `/jobs` page.
//!
//! # Wiring into the server
//! ```text
//! let mut cfg = HostConfig::new(JobPaths::from_env()?, registry)?; // child: `<this exe> __job <id>`
//! cfg.policy = args.job_policy;                                    // --job-policy exclusive|shared
//! let jobs = JobHost::open(cfg)?;                                  // boot recovery runs here
//! let app = app.merge(kiln_jobs::http::router(jobs.clone()));
//! // per generation, held until it ends:
//! let permit = jobs.inference_gate().await;                        // waits under Exclusive
//! // /stats: serde_json::to_value(jobs.status())
//! // shutdown: inside with_graceful_shutdown's future, after the signal: jobs.close().await
//! ```
//! The registry must be the one `kiln __job` uses, so a child knows every heavy kind.

mod builtin;
mod cancel;
mod child;
mod config;
mod error;
pub mod event;
mod finish;
mod heavy;
mod host;
pub mod http;
mod inproc;
mod lease;
mod paths;
pub mod procinfo;
mod recover;
mod runner;
mod schema;
mod status;
mod store;
pub mod tail;

pub use builtin::{CrashRunner, NoopRunner};
pub use cancel::{CancelToken, Cancelled};
pub use child::{CHILD_VERB, EXIT_USAGE, child_main, run_child};
pub use config::{HostConfig, OnComplete};
pub use error::{JobError, Result};
pub use event::Emitter;
pub use host::{HostStatus, InferencePermit, JobHost};
pub use lease::{ExecutionLease, JobPolicy, Reservation};
pub use paths::{DATA_DIR_ENV, JobPaths};
pub use runner::{ExecMode, JobContext, JobRunner, Registry, RunError, RunOutput};
pub use schema::SCHEMA_VERSION;
pub use status::{JobRow, JobStatus};
pub use store::{Store, new_job_id};
