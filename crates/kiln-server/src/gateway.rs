//! The generation gateway: the engine runs on its own OS thread and receives typed requests over
//! a bounded channel; its scheduler (`kiln_engine::sched`) batches them, and each request's text
//! streams back over its own tokio channel. The HTTP side never touches the engine: it adds a
//! request, drops its receiver to cancel, and reads events.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kiln_engine::prompt_cache::PromptCacheStats;
use kiln_engine::{
    Engine, EngineError, GenerateOutput, GenerateRequest, KvReport, SchedulerStats, SequenceSink,
    StartGate, StepReport,
};
use kiln_model::backend::Backend;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// Something that generates, step by step: the engine's scheduler, or a one-at-a-time stand-in
/// ([`Serial`]) in tests.
pub trait Generator: Send + 'static {
    /// Queues a request; its events go to `sink`. `Err` refuses it before any compute.
    fn add(
        &mut self,
        req: &GenerateRequest,
        sink: Box<dyn SequenceSink>,
    ) -> Result<(), EngineError>;
    /// Runs one step (one forward for the engine).
    fn step(&mut self) -> Result<StepReport, EngineError>;
    /// Whether anything is queued or running.
    fn has_work(&self) -> bool;
    /// Fails every running request (after a panic inside a step).
    fn fail_running(&mut self, message: &str);
    /// Gates the start of new requests (`--job-policy exclusive`).
    fn set_start_gate(&mut self, gate: Arc<dyn StartGate>) {
        let _ = gate;
    }
    /// Whether a request may start from a cached prefix (`--prompt-cache-bytes 0`: no).
    fn set_prefix_reuse(&mut self, reuse: bool) {
        let _ = reuse;
    }
    /// KV positions free slots keep for reuse.
    fn kv_used(&self) -> usize {
        0
    }
    /// Prompt-cache counters, when there is a cache.
    fn cache_stats(&self) -> Option<PromptCacheStats> {
        None
    }
    /// The KV cache's scheme and per-layer state, when there is a real cache.
    fn kv_report(&self) -> Option<KvReport> {
        None
    }
    /// The scheduler's counters, when there is a scheduler.
    fn scheduler_stats(&self) -> Option<SchedulerStats> {
        None
    }
    /// The pooled, unnormalized embedding of each input (an embedding model's engine), with
    /// each input's token types when given (a reranker's pairs: one score each).
    fn embed(
        &mut self,
        inputs: &[Vec<u32>],
        types: Option<&[Vec<u32>]>,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let _ = (inputs, types);
        Err(EngineError::Request(
            "this model is not an embedding model".into(),
        ))
    }
}

impl<B: Backend + 'static> Generator for Engine<B>
where
    Engine<B>: Send,
{
    fn add(
        &mut self,
        req: &GenerateRequest,
        sink: Box<dyn SequenceSink>,
    ) -> Result<(), EngineError> {
        Engine::add(self, req, sink).map(|_| ())
    }

    fn step(&mut self) -> Result<StepReport, EngineError> {
        Engine::step(self)
    }

    fn has_work(&self) -> bool {
        Engine::has_work(self)
    }

    fn fail_running(&mut self, message: &str) {
        Engine::fail_running(self, message)
    }

    fn set_start_gate(&mut self, gate: Arc<dyn StartGate>) {
        Engine::set_start_gate(self, gate)
    }

    fn set_prefix_reuse(&mut self, reuse: bool) {
        Engine::set_prefix_reuse(self, reuse)
    }

    fn kv_used(&self) -> usize {
        self.cached_len()
    }

    fn cache_stats(&self) -> Option<PromptCacheStats> {
        self.prompt_cache_stats()
    }

    fn kv_report(&self) -> Option<KvReport> {
        Some(Engine::kv_report(self))
    }

    fn scheduler_stats(&self) -> Option<SchedulerStats> {
        Some(Engine::scheduler_stats(self))
    }

    fn embed(
        &mut self,
        inputs: &[Vec<u32>],
        types: Option<&[Vec<u32>]>,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        Engine::embed_typed(self, inputs, types)
    }
}

/// A generator that runs one request at a time to the end (scripted stand-ins in tests).
pub trait OneAtATime: Send + 'static {
    /// Runs one request; `on_text` gets each displayable piece and returns `false` to cancel.
    fn generate(
        &mut self,
        req: &GenerateRequest,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerateOutput, EngineError>;
}

/// A [`OneAtATime`] generator behind the step interface: each step runs one queued request.
pub struct Serial<G> {
    inner: G,
    queue: VecDeque<(GenerateRequest, Box<dyn SequenceSink>)>,
    gate: Option<Arc<dyn StartGate>>,
}

impl<G> Serial<G> {
    /// Wraps `inner`.
    pub fn new(inner: G) -> Self {
        Self {
            inner,
            queue: VecDeque::new(),
            gate: None,
        }
    }
}

impl<G: OneAtATime> Generator for Serial<G> {
    fn add(
        &mut self,
        req: &GenerateRequest,
        sink: Box<dyn SequenceSink>,
    ) -> Result<(), EngineError> {
        self.queue.push_back((req.clone(), sink));
        Ok(())
    }

    fn step(&mut self) -> Result<StepReport, EngineError> {
        self.queue.retain(|(_, sink)| !sink.is_closed());
        let permit = match &self.gate {
            Some(g) => match g.try_start() {
                Some(p) => Some(p),
                None => return Ok(StepReport::default()),
            },
            None => None,
        };
        let Some((req, mut sink)) = self.queue.pop_front() else {
            return Ok(StepReport::default());
        };
        let result = self.inner.generate(&req, &mut |t| sink.text(t, &[]));
        drop(permit);
        match result {
            Ok(out) => sink.finished(out),
            Err(e) => sink.failed(&e.to_string()),
        }
        Ok(StepReport {
            sequences: 1,
            tokens: 1,
        })
    }

    fn has_work(&self) -> bool {
        !self.queue.is_empty()
    }

    fn fail_running(&mut self, _message: &str) {}

    fn set_start_gate(&mut self, gate: Arc<dyn StartGate>) {
        self.gate = Some(gate);
    }
}

/// What the engine thread reports about one request.
#[derive(Debug)]
pub enum Event {
    /// Text that is safe to show (stop strings and partial UTF-8 already held back), with the
    /// logprobs of the tokens behind it (empty unless asked for).
    Text {
        text: String,
        logprobs: Vec<kiln_engine::request::TokenLogprob>,
    },
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
    /// Requests in the running batch.
    pub running: AtomicUsize,
    /// Requests queued (preempted ones included).
    pub waiting: AtomicUsize,
    /// Requests accepted and not yet finished (running, waiting, or on their way in).
    pub in_flight: AtomicUsize,
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
    /// The KV cache after the last step (scheme, per-layer formats, conversions).
    pub kv_report: Mutex<Option<KvReport>>,
    /// The scheduler after the last step (lane, batch sizes, preemptions, memory bill).
    pub scheduler: Mutex<Option<SchedulerStats>>,
    /// The engine panicked and stopped: the model must be loaded again.
    pub broken: AtomicBool,
}

/// An embedding job's answer: one pooled vector per input, or why the engine refused.
pub type EmbedResult = Result<Vec<Vec<f32>>, String>;

/// What the engine thread is asked to do.
enum Job {
    /// Generate for `req`, events to `events`.
    Generate {
        req: Box<GenerateRequest>,
        events: UnboundedSender<Event>,
        done: InFlight,
    },
    /// Embed `inputs`; the answer goes to `reply`, `done` ends the request's in-flight count.
    Embed {
        inputs: Vec<Vec<u32>>,
        types: Option<Vec<Vec<u32>>>,
        reply: tokio::sync::oneshot::Sender<EmbedResult>,
        done: InFlight,
    },
}

/// One accepted request's share of [`GatewayMetrics::in_flight`], given back when dropped.
struct InFlight(Arc<GatewayMetrics>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Hands a request's events to its HTTP handler and counts them; dropped, it ends the
/// request's in-flight count.
struct GatewaySink {
    events: UnboundedSender<Event>,
    metrics: Arc<GatewayMetrics>,
    _done: InFlight,
}

impl SequenceSink for GatewaySink {
    fn text(&mut self, piece: &str, logprobs: &[kiln_engine::request::TokenLogprob]) -> bool {
        let event = Event::Text {
            text: piece.to_owned(),
            logprobs: logprobs.to_vec(),
        };
        self.events.send(event).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.events.is_closed()
    }

    fn finished(&mut self, out: GenerateOutput) {
        record(&self.metrics, &out);
        let _ = self.events.send(Event::Done(Box::new(out)));
    }

    fn failed(&mut self, message: &str) {
        self.metrics.failed.fetch_add(1, Ordering::Relaxed);
        let _ = self.events.send(Event::Failed(message.to_owned()));
    }
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
    /// Starts the engine thread; at most `queue` requests wait beyond those the generator
    /// runs at once. With an `admission` gate, new requests start only when it allows.
    pub fn start<G: Generator>(
        generator: G,
        queue: usize,
        admission: Option<Arc<dyn StartGate>>,
    ) -> Self {
        Self::start_with(generator, queue, admission, true)
    }

    /// [`Gateway::start`]; with `reuse_prefix` false every request starts from an empty cache
    /// (`--prompt-cache-bytes 0`).
    pub fn start_with<G: Generator>(
        mut generator: G,
        queue: usize,
        admission: Option<Arc<dyn StartGate>>,
        reuse_prefix: bool,
    ) -> Self {
        if let Some(gate) = admission {
            generator.set_start_gate(gate);
        }
        generator.set_prefix_reuse(reuse_prefix);
        let running_max = generator
            .scheduler_stats()
            .map_or(1, |s| s.max_sequences.max(1));
        let capacity = queue.max(1) + running_max;
        let (tx, rx) = sync_channel::<Job>(capacity);
        let metrics = Arc::new(GatewayMetrics::default());
        let m = metrics.clone();
        let thread = std::thread::Builder::new()
            .name("kiln-engine".into())
            .spawn(move || engine_loop(generator, rx, &m))
            .ok();
        Self {
            tx: Mutex::new(thread.as_ref().map(|_| tx)),
            thread: Mutex::new(thread),
            capacity,
            metrics,
        }
    }

    /// Queues `req`; events arrive on the returned receiver. Dropping the receiver cancels the
    /// request at the engine's next step, whether it runs, prefills or waits.
    pub fn submit(&self, req: GenerateRequest) -> Result<UnboundedReceiver<Event>, GatewayError> {
        let (events, rx) = unbounded_channel();
        self.send(|done| Job::Generate {
            req: Box::new(req),
            events,
            done,
        })?;
        Ok(rx)
    }

    /// Queues the embedding of `inputs` (token ids); the pooled, unnormalized vectors (or the
    /// engine's refusal) arrive on the returned receiver.
    pub fn submit_embed(
        &self,
        inputs: Vec<Vec<u32>>,
        types: Option<Vec<Vec<u32>>>,
    ) -> Result<tokio::sync::oneshot::Receiver<EmbedResult>, GatewayError> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.send(|done| Job::Embed {
            inputs,
            types,
            reply,
            done,
        })?;
        Ok(rx)
    }

    /// Counts a request in flight (refusing it past the capacity) and sends its job; the job
    /// carries the count and gives it back when it is dropped, wherever that happens.
    fn send(&self, job: impl FnOnce(InFlight) -> Job) -> Result<(), GatewayError> {
        let guard = self.tx.lock().map_err(|_| GatewayError::Closed)?;
        let tx = guard.as_ref().ok_or(GatewayError::Closed)?;
        let m = &self.metrics;
        if m.in_flight.fetch_add(1, Ordering::SeqCst) >= self.capacity {
            m.in_flight.fetch_sub(1, Ordering::SeqCst);
            m.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(GatewayError::Busy(self.capacity));
        }
        match tx.try_send(job(InFlight(m.clone()))) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                m.rejected.fetch_add(1, Ordering::Relaxed);
                Err(GatewayError::Busy(self.capacity))
            }
            Err(TrySendError::Disconnected(_)) => Err(GatewayError::Closed),
        }
    }

    /// Whether the engine panicked and stopped (its model is then loaded again).
    pub fn is_broken(&self) -> bool {
        self.metrics.broken.load(Ordering::SeqCst)
    }

    /// Whether requests are still accepted.
    pub fn is_open(&self) -> bool {
        self.tx.lock().map(|g| g.is_some()).unwrap_or(false)
    }

    /// Most requests accepted at once (running plus waiting).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Stops accepting requests, lets accepted ones finish, and joins the engine thread.
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

/// How long the engine thread sleeps when work is queued but nothing may run (a heavy job
/// holds the gate, or memory is short until a running request ends).
const BLOCKED_POLL: Duration = Duration::from_millis(10);

/// How often the engine thread refreshes `/stats` while it works (and always when it goes
/// idle): the KV report costs tens of microseconds, a decode step a few milliseconds.
const PUBLISH_EVERY: Duration = Duration::from_millis(25);

fn engine_loop<G: Generator>(mut generator: G, rx: Receiver<Job>, m: &Arc<GatewayMetrics>) {
    publish(m, &generator);
    let mut published = Instant::now();
    let mut open = true;
    loop {
        if !generator.has_work() {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(job) => add_job(&mut generator, job, m),
                Err(_) => return,
            }
        }
        while open {
            match rx.try_recv() {
                Ok(job) => add_job(&mut generator, job, m),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| generator.step()));
        match result {
            Ok(Ok(report)) => {
                if report.sequences == 0 && generator.has_work() {
                    publish(m, &generator);
                    std::thread::sleep(BLOCKED_POLL);
                }
            }
            Ok(Err(e)) => tracing::warn!("a forward failed: {e}"),
            Err(_) => {
                // A panic may leave the engine's state half-updated: fail what it holds and
                // stop, so the model is loaded afresh for the next request.
                // Broken first: a client told of the failure must find the model gone, so
                // its next request loads it again instead of reaching this closing engine.
                m.broken.store(true, Ordering::SeqCst);
                generator.fail_running("internal error in the engine");
                publish(m, &generator);
                tracing::error!("the engine panicked; its requests failed and it stopped");
                return;
            }
        }
        if !generator.has_work() || published.elapsed() >= PUBLISH_EVERY {
            publish(m, &generator);
            published = Instant::now();
        }
    }
}

fn add_job<G: Generator>(generator: &mut G, job: Job, m: &Arc<GatewayMetrics>) {
    let (req, events, done) = match job {
        Job::Generate { req, events, done } => (req, events, done),
        Job::Embed {
            inputs,
            types,
            reply,
            done,
        } => {
            let result = generator
                .embed(&inputs, types.as_deref())
                .map_err(|e| e.to_string());
            if result.is_err() {
                m.failed.fetch_add(1, Ordering::Relaxed);
            } else {
                m.finished.fetch_add(1, Ordering::Relaxed);
                m.prompt_tokens.fetch_add(
                    inputs.iter().map(|i| i.len() as u64).sum(),
                    Ordering::Relaxed,
                );
            }
            let _ = reply.send(result);
            drop(done);
            return;
        }
    };
    // Dropping the sink (here, or with a refused request) ends the request's in-flight count.
    let sink = GatewaySink {
        events: events.clone(),
        metrics: m.clone(),
        _done: done,
    };
    if sink.is_closed() {
        m.cancelled.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if let Err(e) = generator.add(&req, Box::new(sink)) {
        m.failed.fetch_add(1, Ordering::Relaxed);
        let _ = events.send(Event::Failed(e.to_string()));
    }
}

fn publish<G: Generator>(m: &GatewayMetrics, generator: &G) {
    m.kv_used.store(generator.kv_used(), Ordering::Relaxed);
    if let Some(c) = generator.cache_stats() {
        m.cache_entries.store(c.entries, Ordering::Relaxed);
        m.cache_bytes.store(c.bytes, Ordering::Relaxed);
        m.cache_evictions.store(c.evictions, Ordering::Relaxed);
    }
    let sched = generator.scheduler_stats();
    let (running, waiting) = match &sched {
        Some(s) => (s.running, s.waiting),
        None => (0, usize::from(generator.has_work())),
    };
    m.running.store(running, Ordering::SeqCst);
    m.waiting.store(waiting, Ordering::SeqCst);
    if let Ok(mut slot) = m.scheduler.lock() {
        *slot = sched;
    }
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
