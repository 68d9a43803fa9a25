//! The pool with stand-in models: no engine, no files.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

struct Fake {
    id: String,
    bill: u64,
    busy: AtomicUsize,
    broken: AtomicBool,
    stopped: Arc<Mutex<Vec<String>>>,
}

impl PoolModel for Fake {
    fn id(&self) -> &str {
        &self.id
    }
    fn bill_bytes(&self) -> u64 {
        self.bill
    }
    fn is_idle(&self) -> bool {
        self.busy.load(Ordering::SeqCst) == 0
    }
    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst)
    }
    fn answers_to(&self, name: &str) -> bool {
        name == format!("{}-adapter", self.id)
    }
    fn shut_down(&self) {
        self.stopped.lock().unwrap().push(self.id.clone());
    }
}

/// Models `a`, `b`, `c` of `size` bytes each (`huge`: more than any budget).
struct FakeLoader {
    size: u64,
    loads: Arc<Mutex<Vec<String>>>,
    stopped: Arc<Mutex<Vec<String>>>,
}

impl Loader<Fake> for FakeLoader {
    fn find(&self, name: &str) -> Option<Candidate> {
        let id = name.trim_end_matches(".gguf");
        ["a", "b", "c", "huge", "bad"]
            .contains(&id)
            .then(|| Candidate {
                id: id.to_string(),
                path: PathBuf::from(format!("/models/{id}.gguf")),
            })
    }
    fn available(&self) -> Vec<Listed> {
        ["a", "b", "c"]
            .iter()
            .map(|n| Listed {
                name: n.to_string(),
                path: PathBuf::from(format!("/models/{n}.gguf")),
                size_bytes: self.size,
            })
            .collect()
    }
    fn load(&self, c: &Candidate, room: Option<u64>) -> Result<Fake, LoadError> {
        if c.id == "bad" {
            return Err(LoadError::Failed("not a model".into()));
        }
        let needed = if c.id == "huge" { 1 << 40 } else { self.size };
        if let Some(room) = room
            && needed > room
        {
            return Err(LoadError::DoesNotFit { needed, room });
        }
        self.loads.lock().unwrap().push(c.id.clone());
        Ok(Fake {
            id: c.id.clone(),
            bill: needed,
            busy: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
            stopped: self.stopped.clone(),
        })
    }
}

struct Setup {
    pool: Arc<ModelPool<Fake>>,
    loads: Arc<Mutex<Vec<String>>>,
    stopped: Arc<Mutex<Vec<String>>>,
}

fn setup(budget: Option<u64>, models_max: usize) -> Setup {
    let loads = Arc::new(Mutex::new(Vec::new()));
    let stopped = Arc::new(Mutex::new(Vec::new()));
    let loader = FakeLoader {
        size: 100,
        loads: loads.clone(),
        stopped: stopped.clone(),
    };
    let settings = PoolSettings {
        budget_bytes: budget,
        models_max,
        keep_alive: KeepAlive::For(Duration::from_secs(300)),
        room_wait: Duration::from_millis(300),
    };
    Setup {
        pool: Arc::new(ModelPool::new(Arc::new(loader), settings, "a")),
        loads,
        stopped,
    }
}

fn loaded_ids(p: &ModelPool<Fake>) -> Vec<String> {
    let mut ids: Vec<String> = p.loaded().0.iter().map(|e| e.model.id.clone()).collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn loads_on_first_request_and_once() {
    let s = setup(None, 3);
    let a = s.pool.acquire(None, None).await.unwrap();
    assert_eq!(a.id, "a");
    drop(a);
    let again = s.pool.acquire(Some("a.gguf"), None).await.unwrap();
    assert_eq!(again.id, "a");
    assert_eq!(*s.loads.lock().unwrap(), ["a"]);
    assert_eq!(loaded_ids(&s.pool), ["a"]);
}

#[tokio::test]
async fn unknown_and_path_names_are_refused() {
    let s = setup(None, 3);
    match s.pool.acquire(Some("nope"), None).await {
        Err(PoolError::NotFound { known, .. }) => assert_eq!(known, ["a", "b", "c"]),
        other => panic!("{:?}", other.err()),
    }
    for bad in [
        "../a",
        "/etc/passwd",
        "a/../../b",
        "~/x",
        "C:\\x",
        ".hidden",
    ] {
        assert!(
            matches!(
                s.pool.acquire(Some(bad), None).await,
                Err(PoolError::PathName(_))
            ),
            "{bad}"
        );
    }
    assert!(matches!(
        s.pool.acquire(Some("bad"), None).await,
        Err(PoolError::LoadFailed { .. })
    ));
    assert!(s.loads.lock().unwrap().is_empty());
}

#[tokio::test]
async fn models_max_evicts_the_least_recently_used_idle_model() {
    let s = setup(None, 2);
    drop(s.pool.acquire(Some("a"), None).await.unwrap());
    drop(s.pool.acquire(Some("b"), None).await.unwrap());
    drop(s.pool.acquire(Some("a"), None).await.unwrap());
    drop(s.pool.acquire(Some("c"), None).await.unwrap());
    assert_eq!(loaded_ids(&s.pool), ["a", "c"]);
    assert_eq!(*s.stopped.lock().unwrap(), ["b"]);
}

#[tokio::test]
async fn the_budget_is_never_exceeded_and_busy_models_are_waited_for() {
    // Room for one model of 100 bytes.
    let s = setup(Some(150), 3);
    let a = s.pool.acquire(Some("a"), None).await.unwrap();
    // `a` is leased: `b` waits, then gives up with the numbers.
    match s.pool.acquire(Some("b"), None).await {
        Err(PoolError::NoRoom {
            needed, free, busy, ..
        }) => {
            assert_eq!((needed, free), (100, 50));
            assert_eq!(busy, ["a"]);
        }
        other => panic!("{:?}", other.err()),
    }
    // Once `a` is let go while `b` waits, `b` evicts it.
    let pool = s.pool.clone();
    let waiter =
        tokio::spawn(async move { pool.acquire(Some("b"), None).await.map(|l| l.id.clone()) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(a);
    assert_eq!(waiter.await.unwrap().unwrap(), "b");
    assert_eq!(loaded_ids(&s.pool), ["b"]);
    assert!(s.pool.billed_bytes() <= 150);
    match s.pool.acquire(Some("huge"), None).await {
        Err(PoolError::TooLarge { needed, budget, .. }) => {
            assert_eq!((needed, budget), (1 << 40, 150))
        }
        other => panic!("{:?}", other.err()),
    }
    // The huge model evicted nothing.
    assert_eq!(loaded_ids(&s.pool), ["b"]);
}

#[tokio::test]
async fn a_model_with_requests_in_flight_is_not_evicted() {
    let s = setup(None, 1);
    drop(s.pool.acquire(Some("a"), None).await.unwrap());
    let a = s.pool.get("a").unwrap();
    a.busy.store(1, Ordering::SeqCst);
    assert!(matches!(
        s.pool.acquire(Some("b"), None).await,
        Err(PoolError::AllBusy { max: 1, .. })
    ));
    a.busy.store(0, Ordering::SeqCst);
    drop(s.pool.acquire(Some("b"), None).await.unwrap());
    assert_eq!(loaded_ids(&s.pool), ["b"]);
}

#[tokio::test]
async fn keep_alive_zero_unloads_once_idle_and_negative_keeps() {
    let s = setup(None, 3);
    let a = s
        .pool
        .acquire(Some("a"), Some(KeepAlive::For(Duration::ZERO)))
        .await
        .unwrap();
    assert!(s.pool.reap().is_empty(), "leased models stay");
    drop(a);
    drop(
        s.pool
            .acquire(Some("b"), Some(KeepAlive::Forever))
            .await
            .unwrap(),
    );
    assert_eq!(s.pool.reap(), ["a"]);
    assert_eq!(loaded_ids(&s.pool), ["b"]);
    assert!(s.pool.reap().is_empty());
}

#[tokio::test]
async fn a_broken_model_is_replaced_and_the_others_keep_serving() {
    let s = setup(None, 3);
    drop(s.pool.acquire(Some("a"), None).await.unwrap());
    drop(s.pool.acquire(Some("b"), None).await.unwrap());
    s.pool
        .get("a")
        .unwrap()
        .broken
        .store(true, Ordering::SeqCst);
    let b = s.pool.acquire(Some("b"), None).await.unwrap();
    assert_eq!(b.id, "b");
    let a = s.pool.acquire(Some("a"), None).await.unwrap();
    assert!(!a.broken.load(Ordering::SeqCst), "a fresh model");
    assert_eq!(*s.loads.lock().unwrap(), ["a", "b", "a"]);
}

#[tokio::test]
async fn an_adapter_name_reaches_its_model_and_unload_waits_for_requests() {
    let s = setup(None, 3);
    drop(s.pool.acquire(Some("b"), None).await.unwrap());
    assert_eq!(
        s.pool.acquire(Some("b-adapter"), None).await.unwrap().id,
        "b"
    );
    let lease = s.pool.acquire(Some("b"), None).await.unwrap();
    assert_eq!(s.pool.unload("b").await, Ok(false));
    drop(lease);
    assert_eq!(s.pool.reap(), ["b"]);
    assert!(matches!(
        s.pool.unload("b").await,
        Err(PoolError::NotFound { .. })
    ));
}
