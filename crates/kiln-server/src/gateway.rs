//! The generation gateway: the engine runs on its own OS thread and receives typed requests over
//! a bounded channel, one generation at a time; text streams back over a tokio channel. The HTTP
//! side never touches the engine, so continuous batching can later replace the loop behind
//! [`Gateway::submit`] without changing a handler.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use kiln_engine::prompt_cache::PromptCacheStats;
use kiln_engine::{Engine, EngineError, GenerateOutput, GenerateRequest, KvReport};
use kiln_model::backend::Backend;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// Something that generates: the engine, or a scripted stand-in in tests.
pub trait Generator: Send + 'static {
    /// Runs one request; `on_text` gets each displayable piece and returns `false` to cancel.
    fn generate(
        &mut self,
        req: &GenerateRequest,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerateOutput, EngineError>;
    /// KV positions currently holding a cached prefix.
    fn kv_used(&self) -> usize;
    /// Forgets any cached state (after a failure).
    fn reset(&mut self);
    /// Prompt-cache counters, when there is a cache.
    fn cache_stats(&self) -> Option<PromptCacheStats> {
        None
    }
    /// The KV cache's scheme and per-layer state, when there is a real cache.
    fn kv_report(&self) -> Option<KvReport> {
        None
    }
}

impl<B: Backend + 'static> Generator for Engine<B>
where
    Engine<B>: Send,
{
    fn generate(
        &mut self,
        req: &GenerateRequest,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerateOutput, EngineError> {
        Engine::generate(self, req, on_text)
    }

    fn kv_used(&self) -> usize {
        self.cached_len()
    }

    fn reset(&mut self) {
        Engine::reset(self)
    }

    fn cache_stats(&self) -> Option<PromptCacheStats> {
        self.prompt_cache_stats()
    }

    fn kv_report(&self) -> Option<KvReport> {
        Some(Engine::kv_report(self))
    }
}

/// What the engine thread reports about one request.
#[derive(Debug)]
pub enum Event {
    /// Text that is safe to show (stop strings and partial UTF-8 already held back).
    Text(String),
    /// Generation finished (including cancelled).
    Done(Box<GenerateOutput>),
    /// Generation failed; the message is safe to show.
    Failed(String),
}

/// Why a request was not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GatewayError {
    /// The wait queue is full.
    #[error("the server is busy: {0} requests are already waiting")]
    Busy(usize),
    /// The server is shutting down.
    #[error("the server is shutting down")]
    Closed,
}

/// Live counters, read by `/stats` and `/metrics`.
#[derive(Debug, Default)]
pub struct GatewayMetrics {
    /// Requests generating now (0 or 1).
    pub running: AtomicUsize,
    /// Requests queued.
    pub waiting: AtomicUsize,
    /// KV positions holding the cached prefix.
    pub kv_used: AtomicUsize,
    /// Requests finished (any reason).
    pub finished: AtomicU64,
    /// Requests cancelled by their client (while running or queued).
    pub cancelled: AtomicU64,
    /// Requests that failed in the engine.
    pub failed: AtomicU64,
    /// Requests turned away with 503.
    pub rejected: AtomicU64,
    /// Prompt tokens of finished requests.
    pub prompt_tokens: AtomicU64,
    /// Of those, tokens reused from the cached prefix.
    pub cached_tokens: AtomicU64,
    /// Tokens generated.
    pub generated_tokens: AtomicU64,
    /// Requests that reused a cached prefix.
    pub cache_hits: AtomicU64,
    /// Requests that reused nothing.
    pub cache_misses: AtomicU64,
    /// Sum of decode seconds ×1e6 (for average tok/s).
    pub decode_micros: AtomicU64,
    /// Saved prompt-cache entries (besides the live slot).
    pub cache_entries: AtomicUsize,
    /// Bytes they hold.
    pub cache_bytes: AtomicUsize,
    /// Entries evicted to stay under the cap.
    pub cache_evictions: AtomicU64,
    /// The KV cache after the last request (scheme, per-layer formats, conversions).
    pub kv_report: Mutex<Option<KvReport>>,
}

struct Job {
    req: GenerateRequest,
    events: UnboundedSender<Event>,
}

/// Decides when a generation may start; the returned guard is held for the generation's whole
/// life. The job host implements it for `--job-policy exclusive` (generations wait while a heavy
/// job runs); the call blocks the engine thread, which is what waiting means here.
pub trait Admission: Send + Sync {
    /// Blocks until a generation may start.
    fn admit(&self) -> Box<dyn Send>;
}

/// Handle to the engine thread.
pub struct Gateway {
    tx: Mutex<Option<SyncSender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    capacity: usize,
    /// Live counters.
    pub metrics: Arc<GatewayMetrics>,
}

impl Gateway {
    /// Starts the engine thread; at most `queue` requests wait behind the running one. With an
    /// `admission`, each generation first waits for its permit.
    pub fn start<G: Generator>(
        generator: G,
        queue: usize,
        admission: Option<Arc<dyn Admission>>,
    ) -> Self {
        Self::start_with(generator, queue, admission, true)
    }

    /// [`Gateway::start`]; with `reuse_prefix` false every request starts from an empty cache
    /// (`--prompt-cache-bytes 0`).
    pub fn start_with<G: Generator>(
        generator: G,
        queue: usize,
        admission: Option<Arc<dyn Admission>>,
        reuse_prefix: bool,
    ) -> Self {
        let (tx, rx) = sync_channel::<Job>(queue.max(1));
        let metrics = Arc::new(GatewayMetrics::default());
        let m = metrics.clone();
        let thread = std::thread::Builder::new()
            .name("kiln-engine".into())
            .spawn(move || engine_loop(generator, rx, &m, reuse_prefix, admission.as_deref()))
            .ok();
        Self {
            tx: Mutex::new(thread.as_ref().map(|_| tx)),
            thread: Mutex::new(thread),
            capacity: queue.max(1),
            metrics,
        }
    }

    /// Queues `req`; events arrive on the returned receiver. Dropping the receiver cancels the
    /// request (at once when running, on dequeue when waiting).
    pub fn submit(&self, req: GenerateRequest) -> Result<UnboundedReceiver<Event>, GatewayError> {
        let guard = self.tx.lock().map_err(|_| GatewayError::Closed)?;
        let tx = guard.as_ref().ok_or(GatewayError::Closed)?;
        let (events, rx) = unbounded_channel();
        // Counted before sending so the engine thread never decrements below zero.
        self.metrics.waiting.fetch_add(1, Ordering::SeqCst);
        match tx.try_send(Job { req, events }) {
            Ok(()) => Ok(rx),
            Err(e) => {
                self.metrics.waiting.fetch_sub(1, Ordering::SeqCst);
                match e {
                    TrySendError::Full(_) => {
                        self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                        Err(GatewayError::Busy(self.capacity))
                    }
                    TrySendError::Disconnected(_) => Err(GatewayError::Closed),
                }
            }
        }
    }

    /// Whether requests are still accepted.
    pub fn is_open(&self) -> bool {
        self.tx.lock().map(|g| g.is_some()).unwrap_or(false)
    }

    /// Most requests that may wait.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Stops accepting requests, lets queued ones finish, and joins the engine thread.
    pub fn shutdown(&self) {
        if let Ok(mut g) = self.tx.lock() {
            g.take();
        }
        let handle = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

fn engine_loop<G: Generator>(
    mut generator: G,
    rx: Receiver<Job>,
    m: &GatewayMetrics,
    reuse_prefix: bool,
    admission: Option<&dyn Admission>,
) {
    publish_kv(m, &generator);
    while let Ok(job) = rx.recv() {
        m.waiting.fetch_sub(1, Ordering::SeqCst);
        if job.events.is_closed() {
            // Its client left while it waited: skip it without computing anything.
            m.cancelled.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let _permit = admission.map(|a| a.admit());
        if job.events.is_closed() {
            m.cancelled.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if !reuse_prefix {
            generator.reset();
        }
        m.running.store(1, Ordering::SeqCst);
        let events = job.events.clone();
        let mut on_text = |piece: &str| events.send(Event::Text(piece.to_owned())).is_ok();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            generator.generate(&job.req, &mut on_text)
        }));
        let event = match result {
            Ok(Ok(out)) => {
                record(m, &out);
                Event::Done(Box::new(out))
            }
            Ok(Err(e)) => {
                m.failed.fetch_add(1, Ordering::Relaxed);
                generator.reset();
                Event::Failed(e.to_string())
            }
            Err(_) => {
                m.failed.fetch_add(1, Ordering::Relaxed);
                generator.reset();
                tracing::error!("the engine panicked; its cache was reset");
                Event::Failed("internal error in the engine".into())
            }
        };
        m.kv_used.store(generator.kv_used(), Ordering::Relaxed);
        if let Some(c) = generator.cache_stats() {
            m.cache_entries.store(c.entries, Ordering::Relaxed);
            m.cache_bytes.store(c.bytes, Ordering::Relaxed);
            m.cache_evictions.store(c.evictions, Ordering::Relaxed);
        }
        publish_kv(m, &generator);
        m.running.store(0, Ordering::SeqCst);
        let _ = job.events.send(event);
    }
}

fn publish_kv<G: Generator>(m: &GatewayMetrics, generator: &G) {
    if let Ok(mut slot) = m.kv_report.lock() {
        *slot = generator.kv_report();
    }
}

fn record(m: &GatewayMetrics, out: &GenerateOutput) {
    let s = &out.stats;
    m.finished.fetch_add(1, Ordering::Relaxed);
    if out.finish_reason == kiln_engine::FinishReason::Cancelled {
        m.cancelled.fetch_add(1, Ordering::Relaxed);
    }
    m.prompt_tokens
        .fetch_add(s.prompt_tokens as u64, Ordering::Relaxed);
    m.cached_tokens
        .fetch_add(s.cached_tokens as u64, Ordering::Relaxed);
    m.generated_tokens
        .fetch_add(out.tokens.len() as u64, Ordering::Relaxed);
    m.decode_micros
        .fetch_add((s.decode_secs * 1e6) as u64, Ordering::Relaxed);
    if s.cached_tokens > 0 {
        m.cache_hits.fetch_add(1, Ordering::Relaxed);
    } else {
        m.cache_misses.fetch_add(1, Ordering::Relaxed);
    }
}
