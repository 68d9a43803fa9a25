//! A cross-process advisory lock, so two kiln processes (or two threads)
//! never download the same file at once.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use crate::error::{HubError, Result};

/// Holds an exclusive lock on a lock file until dropped.
///
/// The lock file itself is left in place: deleting it on release would let a
/// third process lock a fresh inode while a second still waits on the old one.
#[derive(Debug)]
pub(crate) struct FileLock {
    // Closing the file (on drop) releases the lock; `unlock` is only explicit.
    file: File,
    path: PathBuf,
}

impl FileLock {
    /// Blocks until the lock at `path` is held, telling the user (when
    /// `announce` is set) if someone else holds it.
    pub(crate) fn acquire(path: &Path, announce: bool) -> Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| HubError::io("opening lock file", path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                tracing::info!("waiting for another download holding {}", path.display());
                if announce {
                    eprintln!(
                        "waiting for another kiln process to finish downloading (lock {})",
                        path.display()
                    );
                }
                file.lock().map_err(|e| HubError::io("locking", path, e))?;
            }
            Err(TryLockError::Error(e)) => return Err(HubError::io("locking", path, e)),
        }
        Ok(FileLock {
            file,
            path: path.to_path_buf(),
        })
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        if let Err(e) = self.file.unlock() {
            tracing::debug!("unlocking {}: {e}", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    #[test]
    fn second_holder_waits_for_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(".x.lock");
        let first = FileLock::acquire(&path, false).expect("first lock");
        let released = Arc::new(AtomicBool::new(false));
        let barrier = Arc::new(Barrier::new(2));
        let waiter = {
            let (path, released, barrier) = (path.clone(), released.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let _second = FileLock::acquire(&path, false).expect("second lock");
                // Only reachable once the first holder let go.
                released.load(Ordering::SeqCst)
            })
        };
        barrier.wait();
        std::thread::sleep(Duration::from_millis(150));
        released.store(true, Ordering::SeqCst);
        drop(first);
        assert!(
            waiter.join().expect("join"),
            "second lock taken while first held"
        );
    }
}
