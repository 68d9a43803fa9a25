//! The job host: submit, cancel, close, boot recovery, and the inference gate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::{OwnedRwLockReadGuard, watch};

use crate::cancel::CancelToken;
use crate::config::HostConfig;
use crate::error::{JobError, Result};
use crate::event::Emitter;
use crate::lease::JobPolicy;
use crate::runner::{ExecMode, Registry};
use crate::status::JobRow;
use crate::store::Store;
use crate::{finish, heavy, inproc, procinfo};

/// Lease and queue state, for `/stats`.
#[derive(Debug, Clone, Serialize)]
pub struct HostStatus {
    /// The job policy.
    pub policy: JobPolicy,
    /// The heavy job holding (or waiting on) the execution lease.
    pub lease_holder: Option<String>,
    /// Heavy jobs waiting for the lease, head first.
    pub queued: Vec<String>,
    /// Whether new generations currently wait for a heavy job.
    pub inference_gated: bool,
}

/// Admission of one generation; hold it for the generation's whole life.
#[derive(Debug)]
pub struct InferencePermit {
    _guard: Option<OwnedRwLockReadGuard<()>>,
    /// The heavy job this generation waited for, if it had to wait.
    pub waited_for: Option<String>,
}

/// The cancel reason of jobs still running when the host closes (spec §5.4).
pub const ENGINE_CLOSED: &str = "engine_closed";

#[derive(Clone)]
pub(crate) struct Tracked {
    pub(crate) cancel: CancelToken,
    pub(crate) done: watch::Receiver<bool>,
}

#[derive(Default)]
pub(crate) struct Active {
    closed: bool,
    jobs: HashMap<String, Tracked>,
}

pub(crate) struct Inner {
    pub(crate) id: u64,
    pub(crate) store: Arc<Store>,
    adopted: crate::recover::Adopted,
    pub(crate) cfg: HostConfig,
    active: Mutex<Active>,
}

impl Inner {
    fn active(&self) -> MutexGuard<'_, Active> {
        self.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn emitter(&self, row: &JobRow) -> Emitter {
        Emitter::new(self.store.clone(), &row.id, &row.log_path)
    }
}

/// Marks a job finished when dropped (panics included): untracks it, wakes waiters.
pub(crate) struct Finished {
    pub(crate) inner: Arc<Inner>,
    pub(crate) id: String,
    pub(crate) tx: watch::Sender<bool>,
}

impl Drop for Finished {
    fn drop(&mut self) {
        self.inner.active().jobs.remove(&self.id);
        let _ = self.tx.send(true);
    }
}

/// Runs and tracks jobs; cheap to clone. One per server process.
#[derive(Clone)]
pub struct JobHost {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for JobHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobHost")
            .field("id", &self.inner.id)
            .finish()
    }
}

impl JobHost {
    /// Opens the store and recovers rows an earlier process left unfinished.
    pub fn open(cfg: HostConfig) -> Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let store = Arc::new(Store::open(cfg.paths.clone())?);
        let adopted = crate::recover::recover(&store)?;
        let inner = Inner {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            store,
            adopted,
            cfg,
            active: Mutex::default(),
        };
        Ok(JobHost {
            inner: Arc::new(inner),
        })
    }

    /// The store (for reads).
    pub fn store(&self) -> &Arc<Store> {
        &self.inner.store
    }

    /// The runners.
    pub fn registry(&self) -> &Registry {
        &self.inner.cfg.registry
    }

    /// Creates a job and starts (or queues) it. A job whose log cannot be
    /// created comes back already `failed`, with the reason in `error`.
    pub fn submit(&self, kind: &str, config: Value) -> Result<JobRow> {
        self.submit_with_output(kind, config, None)
    }

    /// [`submit`](Self::submit) with the output path decided by the caller (e.g. a
    /// quantize endpoint that answers `{job_id, output_dir}` at once).
    pub fn submit_with_output(
        &self,
        kind: &str,
        config: Value,
        output_path: Option<&str>,
    ) -> Result<JobRow> {
        let runner = (self.inner.cfg.registry.get(kind))
            .ok_or_else(|| JobError::UnknownKind(kind.to_string()))?;
        let Value::Object(map) = config else {
            return Err(JobError::BadConfig("config must be a JSON object".into()));
        };
        let handle = tokio::runtime::Handle::try_current().map_err(|_| JobError::NoRuntime)?;
        let (map, prepared_output) = runner.prepare(map).map_err(JobError::BadConfig)?;
        // What the runner will write wins: it has put that path in the stored config.
        let output_path = prepared_output.as_deref().or(output_path);
        let config = Value::Object(map);
        let (row, cancel, tx) = {
            let mut active = self.inner.active();
            if active.closed {
                return Err(JobError::Closed);
            }
            let row = (self.inner.store).create_with_output(kind, &config, output_path)?;
            if row.status.is_terminal() {
                return Ok(row);
            }
            let (tx, rx) = watch::channel(false);
            let cancel = CancelToken::new();
            let tracked = Tracked {
                cancel: cancel.clone(),
                done: rx,
            };
            active.jobs.insert(row.id.clone(), tracked);
            (row, cancel, tx)
        };
        let fin = Finished {
            inner: self.inner.clone(),
            id: row.id.clone(),
            tx,
        };
        match runner.mode() {
            ExecMode::InProcess => inproc::start(&handle, &self.inner, &row, runner, cancel, fin),
            ExecMode::Child => {
                let inner = self.inner.clone();
                let r = row.clone();
                let start = Box::new(move |res| {
                    handle.spawn(heavy::supervise(inner, r, res, cancel, fin));
                });
                (self.inner.cfg.lease).enqueue(row.id.clone(), self.inner.id, start);
            }
        }
        Ok(self.inner.store.get(&row.id)?.unwrap_or(row))
    }

    /// Cancels job `id`: a queued one at once, an in-process one at its next
    /// progress boundary, a child by SIGTERM (SIGKILL after the grace). Waits
    /// (bounded) for it to end and returns the row.
    pub async fn cancel(&self, id: &str) -> Result<JobRow> {
        let row = (self.inner.store.get(id)?).ok_or_else(|| JobError::NotFound(id.to_string()))?;
        if row.status.is_terminal() {
            return Err(JobError::Terminal {
                status: row.status.to_string(),
            });
        }
        let tracked = self.inner.active().jobs.get(id).cloned();
        match tracked {
            Some(_) if self.inner.cfg.lease.remove(id) => {
                finish::cancelled(&self.inner.store, &self.inner.emitter(&row), "cancelled");
            }
            Some(t) => {
                t.cancel.cancel("cancelled");
                let wait = self.inner.cfg.kill_grace + Duration::from_secs(5);
                let mut done = t.done;
                let _ = tokio::time::timeout(wait, done.wait_for(|d| *d)).await;
            }
            None => self.cancel_untracked(&row).await,
        }
        (self.inner.store.get(id)?).ok_or_else(|| JobError::NotFound(id.to_string()))
    }

    /// Asks a running job to stop and save (spec §5.7): touches `<log_path>.stop`, which the
    /// job polls between steps. Only jobs that are queued or running can be asked.
    pub fn request_stop(&self, id: &str) -> Result<JobRow> {
        let row = (self.inner.store.get(id)?).ok_or_else(|| JobError::NotFound(id.to_string()))?;
        if row.status.is_terminal() {
            return Err(JobError::Terminal {
                status: row.status.to_string(),
            });
        }
        let path = crate::event::stop_path(std::path::Path::new(&row.log_path));
        std::fs::write(&path, b"").map_err(|e| JobError::io("requesting a stop at", &path, e))?;
        Ok(row)
    }

    /// A row this host does not run (a child that outlived an earlier server).
    async fn cancel_untracked(&self, row: &JobRow) {
        crate::recover::disown(&self.inner.adopted, &row.id);
        if let Ok(Some((pid, start))) = self.inner.store.pid_of(&row.id)
            && procinfo::is_alive(pid, start)
        {
            // Children run as process-group leaders; fall back to the pid alone.
            let kill = |sig| procinfo::signal_group(pid, sig) || procinfo::send_signal(pid, sig);
            kill(procinfo::SIGTERM);
            let deadline = tokio::time::Instant::now() + self.inner.cfg.kill_grace;
            while procinfo::is_alive(pid, start) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if procinfo::is_alive(pid, start) {
                kill(procinfo::SIGKILL);
            }
        }
        finish::cancelled(&self.inner.store, &self.inner.emitter(row), "cancelled");
    }

    /// Host shutdown: refuse new submits, fail queued jobs (`job host closed`), cancel
    /// running ones with reason `engine_closed` (spec §5.7) and wait until each has ended
    /// (children reaped).
    pub async fn close(&self) {
        self.inner.active().closed = true;
        for id in self.inner.cfg.lease.remove_host(self.inner.id) {
            if let Ok(Some(row)) = self.inner.store.get(&id) {
                finish::failed(
                    &self.inner.store,
                    &self.inner.emitter(&row),
                    "job host closed",
                );
            }
            self.inner.active().jobs.remove(&id);
        }
        let running: Vec<Tracked> = self.inner.active().jobs.values().cloned().collect();
        for t in &running {
            t.cancel.cancel(ENGINE_CLOSED);
        }
        for t in running {
            let mut done = t.done;
            let _ = done.wait_for(|d| *d).await;
        }
    }

    /// Lease holder, queue and policy, for `/stats`.
    pub fn status(&self) -> HostStatus {
        let lease = &self.inner.cfg.lease;
        let holder = lease.holder();
        HostStatus {
            policy: self.inner.cfg.policy,
            inference_gated: self.inner.cfg.policy == JobPolicy::Exclusive && holder.is_some(),
            lease_holder: holder,
            queued: lease.queued(),
        }
    }

    /// Admits one generation now, or `None` under [`JobPolicy::Exclusive`] while a heavy job
    /// holds or waits for the lease (running generations finish first, then the job starts).
    pub fn try_inference_gate(&self) -> Option<InferencePermit> {
        if self.inner.cfg.policy == JobPolicy::Shared {
            return Some(InferencePermit {
                _guard: None,
                waited_for: None,
            });
        }
        let guard = self.inner.cfg.lease.try_admit_inference()?;
        Some(InferencePermit {
            _guard: Some(guard),
            waited_for: None,
        })
    }

    /// Admits one generation. Under [`JobPolicy::Exclusive`] this waits while a
    /// heavy job holds or has reserved the lease; under `Shared` it never waits.
    pub async fn inference_gate(&self) -> InferencePermit {
        if self.inner.cfg.policy == JobPolicy::Shared {
            return InferencePermit {
                _guard: None,
                waited_for: None,
            };
        }
        let (guard, waited) = self.inner.cfg.lease.admit_inference().await;
        InferencePermit {
            _guard: Some(guard),
            waited_for: waited,
        }
    }
}
