//! The execution lease: one heavy job at a time, FIFO, plus the inference gate.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use serde::Serialize;
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// How heavy jobs and live inference share the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobPolicy {
    /// A heavy job waits for in-flight generations to drain, and new
    /// generations wait while a heavy job holds (or has reserved) the lease.
    #[default]
    Exclusive,
    /// Heavy jobs and generations run side by side.
    Shared,
}

impl std::str::FromStr for JobPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exclusive" => Ok(JobPolicy::Exclusive),
            "shared" => Ok(JobPolicy::Shared),
            other => Err(format!("unknown job policy {other:?} (exclusive|shared)")),
        }
    }
}

/// What starts a queued job once it reaches the head of the queue.
pub(crate) type Start = Box<dyn FnOnce(Reservation) + Send>;

struct Queued {
    job_id: String,
    host: u64,
    start: Start,
}

#[derive(Default)]
struct State {
    holder: Option<String>,
    queue: VecDeque<Queued>,
}

/// One heavy job at a time, in submission order, process-wide.
pub struct ExecutionLease {
    state: Mutex<State>,
    gate: Arc<RwLock<()>>,
}

impl std::fmt::Debug for ExecutionLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutionLease")
            .field("holder", &self.holder())
            .field("queued", &self.queued().len())
            .finish()
    }
}

impl Default for ExecutionLease {
    fn default() -> Self {
        ExecutionLease {
            state: Mutex::default(),
            gate: Arc::new(RwLock::new(())),
        }
    }
}

impl ExecutionLease {
    /// A lease of its own (tests; a process normally uses [`global`](Self::global)).
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The process-wide lease.
    pub fn global() -> Arc<Self> {
        static GLOBAL: OnceLock<Arc<ExecutionLease>> = OnceLock::new();
        GLOBAL.get_or_init(ExecutionLease::new).clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The job holding (or having reserved) the lease.
    pub fn holder(&self) -> Option<String> {
        self.lock().holder.clone()
    }

    /// The queued job ids, head first.
    pub fn queued(&self) -> Vec<String> {
        self.lock().queue.iter().map(|q| q.job_id.clone()).collect()
    }

    /// Appends a job to the queue, then starts the head if the lease is free.
    pub(crate) fn enqueue(self: &Arc<Self>, job_id: String, host: u64, start: Start) {
        self.lock().queue.push_back(Queued {
            job_id,
            host,
            start,
        });
        self.drain();
    }

    /// Takes a queued job out of the queue; false if it is not queued.
    pub(crate) fn remove(&self, job_id: &str) -> bool {
        let mut st = self.lock();
        let before = st.queue.len();
        st.queue.retain(|q| q.job_id != job_id);
        st.queue.len() != before
    }

    /// Takes every job of `host` out of the queue; returns their ids.
    pub(crate) fn remove_host(&self, host: u64) -> Vec<String> {
        let mut st = self.lock();
        let (gone, kept): (Vec<_>, Vec<_>) = st.queue.drain(..).partition(|q| q.host == host);
        st.queue = kept.into();
        gone.into_iter().map(|q| q.job_id).collect()
    }

    /// While the lease is free, reserves it for the head and starts it. The
    /// holder is set before the start runs, which keeps FIFO order while the
    /// head waits for the execution permit.
    fn drain(self: &Arc<Self>) {
        loop {
            let next = {
                let mut st = self.lock();
                if st.holder.is_some() {
                    return;
                }
                let Some(next) = st.queue.pop_front() else {
                    return;
                };
                st.holder = Some(next.job_id.clone());
                next
            };
            let reservation = Reservation {
                lease: Some(self.clone()),
                job_id: next.job_id,
            };
            (next.start)(reservation);
        }
    }

    /// Waits for the execution permit: all in-flight generations drained.
    pub(crate) async fn acquire_permit(&self) -> OwnedRwLockWriteGuard<()> {
        self.gate.clone().write_owned().await
    }

    /// Admits one generation now, or `None` while a heavy job holds or waits for the permit
    /// (a waiting writer takes every free permit, so new readers are refused: a drain).
    pub(crate) fn try_admit_inference(&self) -> Option<OwnedRwLockReadGuard<()>> {
        self.gate.clone().try_read_owned().ok()
    }

    /// Waits until no heavy job holds the permit, then admits one generation.
    /// Returns the guard and the job it waited for, if it had to wait.
    pub(crate) async fn admit_inference(&self) -> (OwnedRwLockReadGuard<()>, Option<String>) {
        if let Ok(guard) = self.gate.clone().try_read_owned() {
            return (guard, None);
        }
        let holder = self.holder();
        (self.gate.clone().read_owned().await, holder)
    }
}

/// The lease, held by one job; dropping it releases the lease and starts the next job.
pub struct Reservation {
    lease: Option<Arc<ExecutionLease>>,
    job_id: String,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("job_id", &self.job_id)
            .finish()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            {
                let mut st = lease.lock();
                if st.holder.as_deref() == Some(self.job_id.as_str()) {
                    st.holder = None;
                }
            }
            lease.drain();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_parses() {
        assert_eq!("exclusive".parse::<JobPolicy>(), Ok(JobPolicy::Exclusive));
        assert_eq!("shared".parse::<JobPolicy>(), Ok(JobPolicy::Shared));
        assert!("both".parse::<JobPolicy>().is_err());
    }

    #[test]
    fn fifo_and_release_on_drop() {
        let lease = ExecutionLease::new();
        let held = Arc::new(Mutex::new(Vec::<Reservation>::new()));
        for id in ["a", "b", "c"] {
            let held = held.clone();
            lease.enqueue(
                id.into(),
                1,
                Box::new(move |r| held.lock().expect("lock").push(r)),
            );
        }
        assert_eq!(lease.holder().as_deref(), Some("a"));
        assert_eq!(lease.queued(), ["b", "c"]);
        assert!(lease.remove("c"));
        let a = held.lock().expect("lock").pop().expect("a started");
        drop(a);
        assert_eq!(lease.holder().as_deref(), Some("b"));
        assert!(lease.queued().is_empty());
    }

    /// The drain `--job-policy exclusive` relies on: once a heavy job waits for the permit, no
    /// new generation is admitted; the running one finishes, then the job gets the permit.
    #[tokio::test]
    async fn a_waiting_job_stops_new_generations_until_it_ran() {
        let lease = ExecutionLease::new();
        let running = lease.try_admit_inference().expect("free at first");
        let l = lease.clone();
        let job = tokio::spawn(async move {
            let permit = l.acquire_permit().await;
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            drop(permit);
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(
            lease.try_admit_inference().is_none(),
            "a new generation started while the job waited"
        );
        assert!(!job.is_finished());
        drop(running);
        job.await.expect("job ran");
        assert!(
            lease.try_admit_inference().is_some(),
            "free again after the job"
        );
    }
}
