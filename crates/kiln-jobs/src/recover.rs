//! Boot recovery: rows an earlier process left `queued`/`running`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Result;
use crate::procinfo;
use crate::status::JobStatus;
use crate::store::Store;

const LEFT: &str = "left unfinished by an earlier kiln process";
const DIED: &str = "its process ended without finishing the job";

/// Jobs whose child outlived an earlier server, watched until it ends. A cancel
/// takes its id out first, so the watcher leaves the row to the cancel.
pub(crate) type Adopted = Arc<Mutex<HashSet<String>>>;

/// Marks unfinished rows `zombie`, except those whose child (same pid and start
/// time) still runs: that child finishes its own row. A watcher thread marks
/// the row `zombie` if the child dies without doing so. Rows are never deleted.
pub(crate) fn recover(store: &Arc<Store>) -> Result<Adopted> {
    let adopted = Adopted::default();
    for (row, start) in store.unfinished()? {
        let pid = row.pid.and_then(|p| u32::try_from(p).ok());
        match pid {
            Some(pid) if procinfo::is_alive(pid, start) => {
                tracing::info!(job = %row.id, pid, "adopting a job child of an earlier process");
                lock(&adopted).insert(row.id.clone());
                watch(store.clone(), adopted.clone(), row.id, pid, start);
            }
            _ => {
                store.finish(&row.id, JobStatus::Zombie, Some(LEFT))?;
            }
        }
    }
    Ok(adopted)
}

/// Takes `id` out of the adopted set; true if it was there.
pub(crate) fn disown(adopted: &Adopted, id: &str) -> bool {
    lock(adopted).remove(id)
}

fn lock(adopted: &Adopted) -> std::sync::MutexGuard<'_, HashSet<String>> {
    adopted.lock().unwrap_or_else(|p| p.into_inner())
}

fn watch(store: Arc<Store>, adopted: Adopted, id: String, pid: u32, start: Option<u64>) {
    let spawned = std::thread::Builder::new()
        .name(format!("kiln-jobs-watch-{pid}"))
        .spawn(move || {
            while procinfo::is_alive(pid, start) {
                std::thread::sleep(Duration::from_millis(500));
            }
            if !disown(&adopted, &id) {
                return; // cancelled meanwhile
            }
            if let Err(e) = store.finish(&id, JobStatus::Zombie, Some(DIED)) {
                tracing::warn!(job = %id, error = %e, "cannot mark an orphaned job zombie");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot watch an adopted job child");
    }
}
