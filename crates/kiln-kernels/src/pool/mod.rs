//! A persistent worker pool for the forward pass. Decode runs a few hundred short parallel
//! steps per token; workers spin briefly between steps (a step's gap is microseconds) and park
//! only when idle, so a step costs no thread wake-up. The calling thread takes tasks too.
//!
//! One job runs at a time: a `run` that finds the pool busy (another thread's forward, or a
//! nested call from inside a task) executes its tasks inline, so concurrent callers are correct,
//! just not parallel.
//!
//! A panic in a task, on the caller or on a worker, is caught where it happens; the job's
//! remaining tasks are skipped, and once no thread is inside the closure any more the first
//! panic is re-raised on the caller (as `std::thread::scope` does). The pool stays usable.

mod hint;
mod task_ranges;

pub(crate) use hint::Spans;

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::pool::hint::HintSlot;
use crate::pool::task_ranges::TaskRanges;

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(200);
/// Spin iterations between `yield_now` calls (a few microseconds), so spinning never starves
/// other runnable threads on an oversubscribed machine.
const YIELD_EVERY: u32 = 256;

/// The task function of one job, with its lifetime erased (see `Pool::run` for why that holds).
struct Job {
    task: *const (dyn Fn(usize) + Sync),
    claims: Claims,
    remaining: AtomicUsize,
    /// Set by the first task that panics: later tasks are claimed and counted, not run.
    failed: AtomicBool,
    /// The first panic's payload, re-raised on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// How the threads of a job pick their next task.
enum Claims {
    /// One counter: tasks in index order, whichever thread is free.
    Shared { next: AtomicUsize, n_tasks: usize },
    /// Contiguous ranges per thread (`task_ranges`).
    Ranges(TaskRanges),
}

// SAFETY: `task` points to a `Sync` closure that outlives every call made through it:
// `Pool::run` neither returns nor unwinds before `remaining` reaches zero (its `Completion`
// guard waits on drop, and every task's panic is caught before the count goes down), and a task
// index is claimed (through `Claims`) before the closure is called, so no call can start after
// the last one ends.
unsafe impl Send for Job {}
// SAFETY: as for `Send`; the other fields are atomics and a mutex.
unsafe impl Sync for Job {}

impl Job {
    /// Claims and runs tasks until none are left; `me` is the thread's index in the pool
    /// (the caller is 0).
    fn work(&self, me: usize) {
        loop {
            let claimed = match &self.claims {
                Claims::Shared { next, n_tasks } => {
                    Some(next.fetch_add(1, Ordering::AcqRel)).filter(|i| i < n_tasks)
                }
                Claims::Ranges(r) => r.claim(me),
            };
            let Some(i) = claimed else {
                return;
            };
            if !self.failed.load(Ordering::Relaxed) {
                // SAFETY: see the `Send`/`Sync` impls above.
                let task = unsafe { &*self.task };
                if let Err(payload) = catch_unwind(AssertUnwindSafe(|| run_task(task, i))) {
                    self.record_panic(payload);
                }
            }
            // Last: once the count is zero the closure may be gone.
            self.remaining.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn record_panic(&self, payload: Box<dyn Any + Send>) {
        self.failed.store(true, Ordering::Relaxed);
        let mut slot = lock(&self.panic);
        if slot.is_none() {
            *slot = Some(payload);
        }
    }

    /// Spins until every claimed task has finished.
    fn wait(&self) {
        let mut spins = 0u32;
        while self.remaining.load(Ordering::Acquire) > 0 {
            spins = spins.wrapping_add(1);
            // A worker still busy here may have been preempted by another process (the HTTP
            // thread, a client on the same cores): giving up the core now and then lets it
            // finish instead of spinning against it.
            if spins.is_multiple_of(YIELD_EVERY) {
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
    }
}

/// Waits for the job's last task when dropped, so the caller's frame (which owns the closure)
/// cannot be left, by return or by unwinding, while a worker may still call it.
struct Completion<'a> {
    job: &'a Job,
    current: &'a Mutex<Option<Arc<Job>>>,
}

impl Drop for Completion<'_> {
    fn drop(&mut self) {
        self.job.wait();
        *lock(self.current) = None;
    }
}

struct Shared {
    current: Mutex<Option<Arc<Job>>>,
    generation: AtomicU64,
    sleepers: AtomicUsize,
    wake: Condvar,
    shutdown: AtomicBool,
    /// Weights of the job expected next, for spinning workers to prefetch.
    hint: HintSlot,
}

/// A pool of `threads - 1` workers plus the caller.
pub struct Pool {
    shared: Arc<Shared>,
    busy: Mutex<()>,
    threads: usize,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Starts a pool that runs jobs on `threads` threads (the caller included).
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            current: Mutex::new(None),
            generation: AtomicU64::new(0),
            sleepers: AtomicUsize::new(0),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            hint: HintSlot::default(),
        });
        let workers = (1..threads)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("kiln-worker-{i}"))
                    .spawn(move || worker_loop(&shared, i, threads))
                    .expect("spawning a kernel worker thread")
            })
            .collect();
        Self {
            shared,
            busy: Mutex::new(()),
            threads,
            workers,
        }
    }

    /// Threads a job runs on.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `task(i)` for every `i < n_tasks`, spread over the pool; returns when all are done.
    /// Free threads take the next task in index order.
    pub fn run(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        self.run_claiming(n_tasks, task, false)
    }

    /// As [`Pool::run`], but each thread takes a contiguous range of the tasks in order (and
    /// then helps with the others' last ones): for tasks that are consecutive stretches of one
    /// memory stream, such as a matmul's row groups.
    pub fn run_contiguous(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        self.run_claiming(n_tasks, task, true)
    }

    /// Names the weights the next job will read (contiguous ranges, split evenly over the
    /// threads), so that workers waiting for it can pull the start of their shares into cache.
    /// A hint is only a hint: a wrong one costs memory traffic, never a wrong result.
    pub(crate) fn hint_next(&self, spans: Spans) {
        if self.threads > 1 {
            self.shared.hint.post(spans);
        }
    }

    fn run_claiming(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync), ranges: bool) {
        if n_tasks == 0 {
            return;
        }
        let guard = match self.busy.try_lock() {
            Ok(g) if self.threads > 1 && n_tasks > 1 => g,
            // A poisoned lock guards nothing here (the pool never unwinds while holding it).
            Err(TryLockError::Poisoned(p)) if self.threads > 1 && n_tasks > 1 => p.into_inner(),
            _ => {
                (0..n_tasks).for_each(|i| run_task(task, i));
                return;
            }
        };
        // SAFETY: erasing the lifetime is sound because `Completion` below waits, even while
        // unwinding, until `remaining` is zero, so the closure outlives every call; see `Job`.
        let task: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(task) };
        // Ranges pack a task index into 32 bits; a job that large (none of kiln's is) takes the
        // shared counter instead.
        let claims = match ranges && n_tasks <= TaskRanges::MAX_TASKS {
            true => Claims::Ranges(TaskRanges::new(n_tasks, self.threads)),
            false => Claims::Shared {
                next: AtomicUsize::new(0),
                n_tasks,
            },
        };
        let job = Arc::new(Job {
            task,
            claims,
            remaining: AtomicUsize::new(n_tasks),
            failed: AtomicBool::new(false),
            panic: Mutex::new(None),
        });
        let completion = Completion {
            job: &job,
            current: &self.shared.current,
        };
        *lock(&self.shared.current) = Some(job.clone());
        // SeqCst here and in the worker's park (a store then a load on each side): with weaker
        // orderings both sides could read the other's old value and a worker sleep through the
        // job (harmless, the caller runs every task, but the job loses its parallelism).
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        if self.shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = lock(&self.shared.current);
            self.shared.wake.notify_all();
        }
        job.work(0);
        drop(completion);
        drop(guard);
        let payload = lock(&job.panic).take();
        if let Some(payload) = payload {
            resume_unwind(payload);
        }
    }
}

/// Runs one task (after the armed fault, in test builds).
#[inline(always)]
fn run_task(task: &(dyn Fn(usize) + Sync), i: usize) {
    #[cfg(feature = "fault-injection")]
    fault::strike();
    task(i)
}

/// Test builds only (`--features fault-injection`): makes pool tasks panic on demand, so the
/// tests of the layers above (the engine, the server) can force a panic inside a kernel.
#[cfg(feature = "fault-injection")]
pub mod fault {
    use std::sync::atomic::{AtomicUsize, Ordering};

    static ARMED: AtomicUsize = AtomicUsize::new(0);

    /// The next `n` pool tasks, on any thread and any pool, panic instead of running.
    pub fn panic_next_tasks(n: usize) {
        ARMED.store(n, Ordering::SeqCst);
    }

    pub(super) fn strike() {
        if ARMED.load(Ordering::Relaxed) > 0
            && ARMED
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            panic!("fault injected into a kernel task");
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        {
            let _g = lock(&self.shared.current);
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Worker `me` of a pool of `threads` (the caller is thread 0).
fn worker_loop(shared: &Shared, me: usize, threads: usize) {
    // Generation 0 is the pool's state when the worker was spawned: a job published before this
    // thread first runs is still joined.
    let mut seen = 0;
    let mut hint_seen = shared.hint.generation();
    loop {
        let started = Instant::now();
        let mut spins = 0u32;
        loop {
            if shared.shutdown.load(Ordering::Acquire) {
                return;
            }
            let g = shared.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            let h = shared.hint.generation();
            if h != hint_seen {
                hint_seen = h;
                let arrived = || shared.generation.load(Ordering::Relaxed) != seen;
                shared.hint.prefetch_share(me, threads, arrived);
                continue;
            }
            spins += 1;
            if spins.is_multiple_of(YIELD_EVERY) {
                std::thread::yield_now();
            }
            if spins.is_multiple_of(64) && started.elapsed() > SPIN {
                let mut slot = lock(&shared.current);
                shared.sleepers.fetch_add(1, Ordering::SeqCst);
                while shared.generation.load(Ordering::SeqCst) == seen
                    && !shared.shutdown.load(Ordering::Acquire)
                {
                    slot = shared.wake.wait(slot).unwrap_or_else(|p| p.into_inner());
                }
                shared.sleepers.fetch_sub(1, Ordering::AcqRel);
                drop(slot);
            }
            std::hint::spin_loop();
        }
        let job = lock(&shared.current).clone();
        if let Some(job) = job {
            job.work(me);
        }
    }
}

static GLOBAL: OnceLock<RwLock<Arc<Pool>>> = OnceLock::new();

fn global_slot() -> &'static RwLock<Arc<Pool>> {
    GLOBAL.get_or_init(|| {
        let n = std::env::var("KILN_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        RwLock::new(Arc::new(Pool::new(n)))
    })
}

/// The process-wide pool (all cores, or `KILN_THREADS`, until [`set_threads`] is called).
pub fn global() -> Arc<Pool> {
    global_slot()
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// Replaces the process-wide pool with one of `threads` threads.
pub fn set_threads(threads: usize) {
    let mut slot = global_slot().write().unwrap_or_else(|p| p.into_inner());
    if slot.threads() != threads.max(1) {
        *slot = Arc::new(Pool::new(threads));
    }
}

/// Runs `task(i)` for `i < n_tasks` on the process-wide pool.
pub fn parallel_for(n_tasks: usize, task: impl Fn(usize) + Sync) {
    global().run(n_tasks, &task);
}

/// Runs `f(index, piece)` for each of `pieces` (ascending, non-overlapping ranges of `data`),
/// one piece per task, handed out last piece first: when the work grows with the index (causal
/// attention over a prompt), the longest pieces start first and the pool does not end up
/// waiting on one late, long piece. Pieces may differ in length (the blocks of several
/// sequences' prompts in one batch).
///
/// # Panics
/// If the ranges are not ascending, overlap, or run past `data`.
pub fn for_each_piece_mut_last_first<T: Send>(
    data: &mut [T],
    pieces: &[std::ops::Range<usize>],
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let mut end = 0;
    for r in pieces {
        assert!(
            r.start >= end && r.start <= r.end && r.end <= data.len(),
            "pieces must be ascending, disjoint ranges inside the slice"
        );
        end = r.end;
    }
    if pieces.is_empty() {
        return;
    }
    let base = SendPtr(data.as_mut_ptr());
    let n = pieces.len();
    global().run(n, &|t| {
        let i = n - 1 - t;
        let r = &pieces[i];
        // SAFETY: the ranges were checked above to be disjoint and inside `data`, which is
        // borrowed mutably for the whole call; `run` returns only after every task finished.
        let piece = unsafe { std::slice::from_raw_parts_mut(base.get().add(r.start), r.len()) };
        f(i, piece);
    });
}

/// Splits `data` into `chunk`-sized pieces (the last may be shorter) and runs
/// `f(index, piece)` for each on the process-wide pool, grouping pieces so each task gets at
/// least `min_per_task` of them.
pub fn for_each_chunk_mut<T: Send>(
    data: &mut [T],
    chunk: usize,
    min_per_task: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    if data.is_empty() || chunk == 0 {
        return;
    }
    let n_chunks = data.len().div_ceil(chunk);
    let pool = global();
    let per_task = n_chunks
        .div_ceil(pool.threads() * 4)
        .max(min_per_task.max(1));
    let n_tasks = n_chunks.div_ceil(per_task);
    let len = data.len();
    let base = SendPtr(data.as_mut_ptr());
    pool.run(n_tasks, &|t| {
        let first = t * per_task;
        for c in first..(first + per_task).min(n_chunks) {
            let start = c * chunk;
            let end = (start + chunk).min(len);
            // SAFETY: chunk ranges are disjoint, inside `data`, and `data` is borrowed mutably
            // for the whole call, which returns only after every task has finished.
            let piece =
                unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
            f(c, piece);
        }
    });
}

/// A new vector of `rows` rows of `cols` values, row `r` left as `fill(r, row)` leaves it,
/// computed on the process-wide pool in pieces of `rows_per_piece` rows. Each row is zeroed
/// inside its task just before `fill` runs: the allocation is never cleared up front, which
/// would be one thread's serial pass over megabytes in a prefill.
///
/// # Panics
/// If `rows × cols` overflows, or as `fill` does.
pub fn new_rows(
    rows: usize,
    cols: usize,
    rows_per_piece: usize,
    fill: impl Fn(usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    let len = rows.checked_mul(cols).expect("rows × cols fits in memory");
    let mut buf: Vec<std::mem::MaybeUninit<f32>> = Vec::with_capacity(len);
    // SAFETY: the capacity is `len`, and `MaybeUninit` values need no initialisation.
    unsafe { buf.set_len(len) };
    let per_piece = rows_per_piece.max(1);
    if cols > 0 {
        for_each_chunk_mut(&mut buf, per_piece * cols, 1, |c, piece| {
            for (i, row) in piece.chunks_exact_mut(cols).enumerate() {
                row.iter_mut().for_each(|v| {
                    v.write(0.0);
                });
                // SAFETY: every element of `row` was written just above, and
                // `MaybeUninit<f32>` has the layout of `f32`.
                let row = unsafe { &mut *(row as *mut [std::mem::MaybeUninit<f32>] as *mut [f32]) };
                fill(c * per_piece + i, row);
            }
        });
    }
    let mut buf = std::mem::ManuallyDrop::new(buf);
    // SAFETY: every element was initialised (the pieces cover the buffer and
    // `for_each_chunk_mut` returns only after every task finished; with `cols == 0` the buffer
    // is empty); the pointer, length and capacity are the vector's own, of a type with the
    // layout of `f32`, and the `ManuallyDrop` keeps it from being freed twice.
    unsafe { Vec::from_raw_parts(buf.as_mut_ptr().cast::<f32>(), buf.len(), buf.capacity()) }
}

/// A raw pointer that tasks writing disjoint ranges may share.
struct SendPtr<T>(*mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: only used by `for_each_chunk_mut`, whose tasks touch disjoint elements.
unsafe impl<T: Send> Send for SendPtr<T> {}
// SAFETY: as for `Send`.
unsafe impl<T: Send> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_rows_fills_every_row_once_from_zero() {
        for (rows, cols, per_piece) in [(0, 4, 1), (5, 0, 2), (1, 7, 1), (37, 9, 4), (64, 576, 7)] {
            let calls = AtomicUsize::new(0);
            let got = new_rows(rows, cols, per_piece, |r, row| {
                calls.fetch_add(1, Ordering::Relaxed);
                assert!(row.iter().all(|&v| v == 0.0), "row {r} starts zeroed");
                for (c, v) in row.iter_mut().enumerate() {
                    *v = (r * 1000 + c) as f32;
                }
            });
            let want: Vec<f32> = (0..rows)
                .flat_map(|r| (0..cols).map(move |c| (r * 1000 + c) as f32))
                .collect();
            assert_eq!(got, want, "rows {rows} cols {cols}");
            let rows_called = if cols == 0 { 0 } else { rows };
            assert_eq!(calls.load(Ordering::Relaxed), rows_called);
        }
    }

    #[test]
    fn jobs_between_prefetch_hints_run_every_task_once() {
        let pool = Pool::new(3);
        let weights = vec![7u8; 1 << 20];
        for round in 0..200 {
            // A hint, then a job while the workers may still be prefetching for it.
            let at = (round * 4096) % weights.len();
            pool.hint_next(Spans::new([&weights[at..], &weights[..at]]));
            let hits: Vec<AtomicUsize> = (0..9).map(|_| AtomicUsize::new(0)).collect();
            pool.run_contiguous(9, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "round {round}"
            );
        }
    }

    #[test]
    fn every_task_runs_exactly_once() {
        let pool = Pool::new(3);
        for n in [0, 1, 2, 7, 100, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "n = {n}"
            );
        }
    }

    #[test]
    fn contiguous_runs_every_task_exactly_once() {
        let pool = Pool::new(3);
        for n in [0, 1, 2, 7, 100, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run_contiguous(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "n = {n}"
            );
        }
    }

    /// Uneven pieces (empty ones and gaps between them included) each get exactly their
    /// range; elements outside every piece are never touched.
    #[test]
    fn pieces_get_exactly_their_ranges() {
        let mut data = vec![usize::MAX; 40];
        let pieces = [0..3, 3..3, 5..17, 17..18, 30..40];
        for_each_piece_mut_last_first(&mut data, &pieces, |i, piece| {
            assert_eq!(piece.len(), pieces[i].len());
            piece.iter_mut().for_each(|v| *v = i);
        });
        for (k, v) in data.iter().enumerate() {
            let want = pieces
                .iter()
                .position(|r| r.contains(&k))
                .unwrap_or(usize::MAX);
            assert_eq!(*v, want, "element {k}");
        }
    }

    #[test]
    #[should_panic(expected = "ascending, disjoint")]
    fn overlapping_pieces_are_refused() {
        let mut data = vec![0u8; 10];
        for_each_piece_mut_last_first(&mut data, &[0..5, 4..8], |_, _| {});
    }

    #[test]
    fn concurrent_and_nested_callers_are_correct() {
        let pool = Arc::new(Pool::new(2));
        let total = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (pool, total) = (pool.clone(), total.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        pool.run(8, &|_| {
                            // Nested use runs inline.
                            pool.run(2, &|_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            });
                        });
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("caller thread");
        }
        assert_eq!(total.load(Ordering::Relaxed), 4 * 200 * 8 * 2);
    }

    #[test]
    fn chunks_cover_the_slice_once() {
        let mut v = vec![0usize; 1003];
        for_each_chunk_mut(&mut v, 10, 3, |c, piece| {
            for (j, x) in piece.iter_mut().enumerate() {
                *x += c * 10 + j + 1;
            }
        });
        assert!(v.iter().enumerate().all(|(i, &x)| x == i + 1));
    }

    fn on_worker() -> bool {
        std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("kiln-worker"))
    }

    fn panic_message(payload: &(dyn Any + Send)) -> String {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default()
    }

    /// Runs a job whose tasks on one thread (the caller, or worker 1) panic once another thread
    /// is also inside a task, and checks that the panic reaches the caller only after every
    /// task has left the closure (the others sleep in theirs: the caller, and worker 2 when
    /// worker 1 panics), then that the pool still runs a job completely.
    fn panic_reaches_the_caller_after_every_task(panic_on_worker: bool) {
        let pool = Pool::new(3);
        let panicking_thread = || match panic_on_worker {
            true => std::thread::current().name() == Some("kiln-worker-1"),
            false => !on_worker(),
        };
        let rounds = if cfg!(miri) { 2 } else { 20 };
        for round in 0..rounds {
            let inside = AtomicUsize::new(0);
            let other_side_entered = AtomicBool::new(false);
            let result = catch_unwind(AssertUnwindSafe(|| {
                pool.run(64, &|_| {
                    inside.fetch_add(1, Ordering::SeqCst);
                    if panicking_thread() {
                        let t0 = Instant::now();
                        while !other_side_entered.load(Ordering::SeqCst)
                            && t0.elapsed() < Duration::from_secs(5)
                        {
                            std::thread::yield_now();
                        }
                        inside.fetch_sub(1, Ordering::SeqCst);
                        panic!("task panicked on purpose");
                    }
                    other_side_entered.store(true, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(2));
                    inside.fetch_sub(1, Ordering::SeqCst);
                });
            }));
            let Err(payload) = result else {
                panic!("round {round}: the panic did not reach the caller");
            };
            assert_eq!(panic_message(&*payload), "task panicked on purpose");
            assert_eq!(inside.load(Ordering::SeqCst), 0, "round {round}");
            let hits: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
            pool.run_contiguous(100, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn a_panic_on_the_caller_waits_for_the_workers() {
        panic_reaches_the_caller_after_every_task(false);
    }

    #[test]
    fn a_panic_on_a_worker_reaches_the_caller() {
        panic_reaches_the_caller_after_every_task(true);
    }

    #[test]
    fn after_a_panic_the_remaining_tasks_are_skipped_and_the_pool_stays_parallel() {
        let pool = Pool::new(2);
        let ran = AtomicUsize::new(0);
        let n_tasks = if cfg!(miri) { 300 } else { 10_000 };
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.run(n_tasks, &|i| {
                if i == 0 {
                    panic!("first task");
                }
                ran.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(50));
            })
        }));
        assert!(result.is_err());
        assert!(
            ran.load(Ordering::Relaxed) < n_tasks - 1,
            "tasks after the panic were skipped"
        );
        let workers_used = AtomicBool::new(false);
        for _ in 0..if cfg!(miri) { 3 } else { 50 } {
            pool.run(64, &|_| {
                if on_worker() {
                    workers_used.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_micros(100));
            });
        }
        assert!(
            workers_used.load(Ordering::Relaxed),
            "jobs after a panic still use the workers"
        );
    }

    /// Runs 64 tasks of a millisecond each; says whether a worker took any.
    fn workers_take_part(pool: &Pool) -> bool {
        let sum = AtomicUsize::new(0);
        let by_worker = AtomicBool::new(false);
        pool.run(64, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
            if on_worker() {
                by_worker.store(true, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(1));
        });
        assert_eq!(sum.load(Ordering::Relaxed), 64 * 63 / 2);
        by_worker.load(Ordering::Relaxed)
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = Pool::new(2);
        std::thread::sleep(Duration::from_millis(20));
        assert!(workers_take_part(&pool), "a parked worker joined the job");
    }

    #[test]
    fn the_first_job_after_start_uses_the_workers() {
        // Published before the worker threads may have run at all: they must still join it.
        for _ in 0..if cfg!(miri) { 2 } else { 20 } {
            let pool = Pool::new(2);
            assert!(workers_take_part(&pool));
        }
    }
}
