//! The engine: a loaded model, its KV store and the scheduler that shares the store between
//! sequences. Each [`Engine::step`] asks the scheduler for a batch, runs its forward and hands
//! the logits back (`crate::sched` decides everything else); `generate` runs one request to
//! its end.

use std::sync::{Arc, Mutex};

use kiln_model::arch::LogitsWanted;
use kiln_model::backend::{Backend, BatchLayout, KvLayerState, KvLayout, KvStore};
use kiln_model::lora::AdapterStack;

use crate::EngineError;
use crate::kv_scheme::memory::KvGeometry;
use crate::kv_scheme::{DenseDtype, KvModelShape, KvScheme};
use crate::load::LoadedModel;
use crate::prompt_cache::PromptCacheStats;
use crate::request::{GenerateOutput, GenerateRequest, TokenLogprob};
use crate::sched::{
    KvBudget, Lane, Scheduler, SchedulerStats, SequenceSink, StartGate, StepReport,
};
use crate::sequence::{Decoding, check_fits};

/// Engine-wide settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOptions {
    /// Positions the KV cache holds (prompt + generated).
    pub context_len: usize,
    /// Prompt tokens computed per forward during prefill.
    pub prefill_chunk: usize,
    /// How the KV cache is stored. The default is dense f16; a backend that stores f32 only
    /// (the naive reference backend) needs `KvScheme::dense(DenseDtype::F32)`.
    pub kv_scheme: KvScheme,
    /// KV slots: the most sequences that run at once (`--parallel`).
    pub slots: usize,
    /// Most tokens one forward takes: every decoding sequence's token, then whole prefill
    /// chunks up to this (one chunk always goes, so a prompt never starves).
    pub batch_tokens: usize,
    /// Bytes the KV cache (every slot and the prompt cache) may hold; `None`: no limit.
    pub kv_budget_bytes: Option<u64>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            context_len: 4096,
            prefill_chunk: 512,
            kv_scheme: KvScheme::dense(DenseDtype::default()),
            slots: 1,
            batch_tokens: 512,
            kv_budget_bytes: None,
        }
    }
}

/// The KV cache as `/stats` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KvReport {
    /// The scheme's cache key (`f16`, `kv4`, `turbo-k8v3`…).
    pub scheme: String,
    /// Its label (`uniform-kv4`…).
    pub label: String,
    /// Length at which a sequence converts (0 for dense).
    pub start: usize,
    /// Per layer: what it converts to (`affine4-g64`, `turbo-k8v3`) or its dense storage.
    pub layers: Vec<String>,
    /// Per layer: what the current sequence holds now.
    pub current: Vec<String>,
    /// Layer conversions since the engine started.
    pub conversions: u64,
    /// Positions the current sequence holds.
    pub positions: usize,
    /// Bytes those positions take.
    pub bytes: usize,
    /// Bytes reserved for the cache (committed only as written).
    pub reserved_bytes: usize,
}

/// A loaded model with its KV slots and the scheduler that shares them between sequences
/// (`crate::sched`).
pub struct Engine<B: Backend> {
    pub(crate) backend: B,
    pub(crate) model: LoadedModel<B>,
    pub(crate) kv: B::Kv,
    pub(crate) options: EngineOptions,
    /// Sequences, slots, the prompt cache and the memory budget.
    sched: Scheduler,
}

impl<B: Backend> Engine<B> {
    /// Wraps a loaded model, allocating its KV slots.
    pub fn new(
        backend: B,
        model: LoadedModel<B>,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        if options.context_len == 0
            || options.prefill_chunk == 0
            || options.slots == 0
            || options.batch_tokens == 0
        {
            return Err(EngineError::Request(
                "context length, prefill chunk, slots and batch tokens must be positive".into(),
            ));
        }
        let kv = new_store(&backend, &model, &options)?;
        let sched = new_scheduler(&backend, &model, &options);
        Ok(Self {
            backend,
            model,
            kv,
            options,
            sched,
        })
    }

    /// The loaded model.
    pub fn model(&self) -> &LoadedModel<B> {
        &self.model
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Engine settings.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// The lane the KV scheme allows on this backend.
    pub fn lane(&self) -> &Lane {
        self.sched.lane()
    }

    /// Replaces the KV cache with an empty one under `scheme` (saved prompts are dropped: they
    /// hold the old scheme's data). Refused while sequences are in flight.
    pub fn set_kv_scheme(&mut self, scheme: KvScheme) -> Result<(), EngineError> {
        if self.has_work() {
            return Err(EngineError::Request(
                "the KV scheme cannot change while sequences run".into(),
            ));
        }
        let mut options = self.options.clone();
        options.kv_scheme = scheme;
        self.kv = new_store(&self.backend, &self.model, &options)?;
        let mut sched = new_scheduler(&self.backend, &self.model, &options);
        sched.keep_settings_of(&self.sched);
        self.sched = sched;
        self.options = options;
        Ok(())
    }

    /// The KV store.
    pub fn kv(&self) -> &B::Kv {
        &self.kv
    }

    /// The KV cache's scheme, per-layer formats and current contents (`current`: the most
    /// recently used slot).
    pub fn kv_report(&self) -> KvReport {
        let scheme = &self.options.kv_scheme;
        let plan = scheme.plan(&KvModelShape::from_config(&self.model.config));
        let current = self.sched.slots().current();
        let n = self.kv.layout().n_slots;
        KvReport {
            scheme: scheme.cache_key(),
            label: scheme.label(),
            start: plan.start,
            layers: plan
                .quantized
                .iter()
                .map(|q| match q {
                    Some(f) => KvLayerState::Quantized(*f).name(),
                    None => KvLayerState::Dense(plan.dense).name(),
                })
                .collect(),
            current: self
                .kv
                .layer_states(current)
                .iter()
                .map(|s| s.name())
                .collect(),
            conversions: self.kv.conversions(),
            positions: (0..n).map(|i| self.kv.seq_len(i)).sum(),
            bytes: (0..n).map(|i| self.kv.slot_bytes(i)).sum(),
            reserved_bytes: self.kv.allocated_bytes(),
        }
    }

    /// KV positions free slots keep for prefix reuse.
    pub fn cached_len(&self) -> usize {
        self.sched.slots().parked_positions()
    }

    /// Keeps up to `max_bytes` of KV snapshots of earlier prompts (spec §11.1), so switching
    /// between conversations re-prefills only the new turn; 0 turns the cache off (a free
    /// slot's own prefix is still reused).
    pub fn set_prompt_cache_bytes(&mut self, max_bytes: usize) {
        self.sched.set_prompt_cache_bytes(max_bytes);
    }

    /// Counters of the prompt cache, when it is on.
    pub fn prompt_cache_stats(&self) -> Option<PromptCacheStats> {
        self.sched.prompt_cache_stats()
    }

    /// Forgets every free slot's prefix (running sequences keep theirs).
    pub fn reset(&mut self) {
        let slots = self.sched.slots_mut();
        for slot in 0..slots.len() {
            if slots.is_free(slot) {
                let freed = self.kv.release(slot);
                slots.released(slot, freed);
            }
        }
    }

    /// Cuts slot 0 back to its first `len` positions (benchmarks); converted layers stay
    /// converted, as they do when a prompt reuses a prefix.
    pub fn truncate_cache(&mut self, len: usize) {
        self.sched.slots_mut().truncate(0, len);
        self.kv.set_seq_len(0, len.min(self.kv.seq_len(0)));
    }

    /// Cuts `slot` back to its first `len` positions (benchmarks of batched decode).
    pub fn truncate_slot(&mut self, slot: usize, len: usize) {
        self.sched.slots_mut().truncate(slot, len);
        self.kv.set_seq_len(slot, len.min(self.kv.seq_len(slot)));
    }

    /// One forward of any layout over the engine's slots, returning the last position's logits
    /// of each span, then the conversions due in every slot it touched, without prompt
    /// bookkeeping (benchmarks and evaluations, with no sequence in flight); call
    /// [`Engine::reset`] before reusing the engine for generation.
    pub fn forward_batch(
        &mut self,
        tokens: &[u32],
        batch: &BatchLayout,
    ) -> Result<Vec<f32>, EngineError> {
        self.forward_batch_with(tokens, batch, None)
    }

    /// [`Engine::forward_batch`] with `adapters` on every span (benchmarks). The slots it
    /// writes keep no prefix for reuse.
    pub fn forward_batch_with(
        &mut self,
        tokens: &[u32],
        batch: &BatchLayout,
        adapters: Option<&AdapterStack>,
    ) -> Result<Vec<f32>, EngineError> {
        self.refuse_while_busy()?;
        self.check_adapters(adapters)?;
        let stacks = vec![adapters; batch.spans.len()];
        for span in &batch.spans {
            self.sched.slots_mut().truncate(span.slot, 0);
        }
        self.forward_spans(tokens, batch, LogitsWanted::LastOfEach, &stacks)
    }

    /// Queues `req`; its events go to `sink`. Requests the engine can never serve (empty,
    /// longer than the context, bad sampling settings) are refused here.
    pub fn add(
        &mut self,
        req: &GenerateRequest,
        sink: Box<dyn SequenceSink>,
    ) -> Result<u64, EngineError> {
        if self.is_embedding_model() {
            return Err(EngineError::Request(
                "this is an embedding model: it answers /v1/embeddings, not generation".into(),
            ));
        }
        let adapters = req.adapters.clone().filter(|a| !a.is_empty());
        self.check_adapters(adapters.as_deref())?;
        let dec = Decoding::new(&self.model, req, self.options.context_len)?;
        Ok(self.sched.add(dec, sink, adapters))
    }

    /// Whether any sequence is waiting or running.
    pub fn has_work(&self) -> bool {
        self.sched.has_work()
    }

    /// Gates the start of new sequences (`--job-policy exclusive`).
    pub fn set_start_gate(&mut self, gate: Arc<dyn StartGate>) {
        self.sched.set_start_gate(gate);
    }

    /// Whether a new request may start from a prefix a free slot or the prompt cache holds.
    pub fn set_prefix_reuse(&mut self, reuse: bool) {
        self.sched.set_prefix_reuse(reuse);
    }

    /// The scheduler's counters.
    pub fn scheduler_stats(&self) -> SchedulerStats {
        self.sched.stats()
    }

    /// Fails every running sequence with `message` and gives their slots back (after a panic
    /// inside a forward: their KV may be half written). Waiting sequences stay queued.
    pub fn fail_running(&mut self, message: &str) {
        self.sched.fail_running(&mut self.kv, message);
    }

    /// One scheduling step: the scheduler drops cancelled sequences, admits waiting ones and
    /// plans a batch within the budgets; one forward runs it (each span with its own
    /// sequence's adapters); the scheduler samples where a sequence's tokens are all computed.
    /// A forward error fails the sequences in it and is returned.
    pub fn step(&mut self) -> Result<StepReport, EngineError> {
        let batch = self.sched.schedule(&mut self.kv);
        if batch.is_empty() {
            return Ok(StepReport::default());
        }
        let stacks: Vec<Option<&AdapterStack>> =
            batch.adapters.iter().map(Option::as_deref).collect();
        let logits = self.forward_spans(
            &batch.tokens,
            &batch.layout,
            LogitsWanted::LastOfEach,
            &stacks,
        );
        match logits {
            Ok(logits) => Ok(self.sched.update(&mut self.kv, &batch, logits)),
            Err(e) => {
                self.sched.fail_batch(&mut self.kv, &batch, &e.to_string());
                Err(e)
            }
        }
    }

    /// One forward of `layout` (span `i` with the adapters `adapters[i]`; an empty slice: the
    /// base model for all), then the conversion of every layer due in each of its slots.
    fn forward_spans(
        &mut self,
        tokens: &[u32],
        layout: &BatchLayout,
        want: LogitsWanted,
        adapters: &[Option<&AdapterStack>],
    ) -> Result<Vec<f32>, EngineError> {
        let logits = self.model.model.forward_with(
            &self.backend,
            &mut self.kv,
            tokens,
            layout,
            want,
            adapters,
        )?;
        // The forward wrote the positions, whether or not a conversion below fails.
        self.sched.wrote(layout);
        for span in &layout.spans {
            self.kv.convert_due(span.slot)?;
        }
        Ok(logits)
    }

    /// Refuses a stack that was not checked against this model.
    pub(crate) fn check_adapters(
        &self,
        adapters: Option<&AdapterStack>,
    ) -> Result<(), EngineError> {
        match adapters {
            Some(s) if !s.fits(&self.model.config) => Err(EngineError::Request(format!(
                "adapter {} does not fit the served model",
                s.key()
            ))),
            _ => Ok(()),
        }
    }

    /// Benchmarks and evaluations write slots directly: never under running sequences.
    fn refuse_while_busy(&self) -> Result<(), EngineError> {
        if self.has_work() {
            return Err(EngineError::Request(
                "benchmark and evaluation forwards need an engine with no sequences in flight"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Logits for every position of `tokens`, computed from an empty cache (evaluation) in
    /// forwards of the engine's prefill chunk.
    pub fn logits_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.logits_all_chunked(tokens, self.options.prefill_chunk)
    }

    /// [`Engine::logits_all`] in forwards of `chunk` tokens (teacher forcing: with a quantized
    /// cache, every chunk after the first attends over converted layers).
    pub fn logits_all_chunked(
        &mut self,
        tokens: &[u32],
        chunk: usize,
    ) -> Result<Vec<f32>, EngineError> {
        self.logits_all_with(tokens, chunk, None)
    }

    /// [`Engine::logits_all_chunked`] with LoRA `adapters` (what serving them computes).
    pub fn logits_all_with(
        &mut self,
        tokens: &[u32],
        chunk: usize,
        adapters: Option<&AdapterStack>,
    ) -> Result<Vec<f32>, EngineError> {
        check_fits(tokens.len(), self.options.context_len)?;
        self.refuse_while_busy()?;
        self.check_adapters(adapters)?;
        if chunk == 0 {
            return Err(EngineError::Request("the chunk must be positive".into()));
        }
        self.reset();
        let mut out = Vec::with_capacity(tokens.len() * self.model.config.vocab_size);
        for (i, part) in tokens.chunks(chunk).enumerate() {
            let batch = BatchLayout::single(0, i * chunk, part.len());
            out.extend(self.forward_spans(part, &batch, LogitsWanted::All, &[adapters])?);
        }
        let namespace = adapters.map_or("", |a| a.namespace());
        self.sched.slots_mut().record(0, tokens, namespace);
        Ok(out)
    }

    /// Generates for `req` alone (with whatever else is queued), calling `on_text` with each
    /// piece of text that is safe to show; `on_text` returning `false` cancels.
    pub fn generate(
        &mut self,
        req: &GenerateRequest,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<GenerateOutput, EngineError> {
        let shared = Arc::new(Mutex::new(Collected::default()));
        self.add(req, Box::new(CollectSink(shared.clone())))?;
        loop {
            let stepped = self.step();
            if matches!(stepped, Ok(r) if r.sequences == 0) {
                // Nothing could run (a start gate refusing): wait rather than spin.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let mut c = shared.lock().unwrap_or_else(|p| p.into_inner());
            for piece in std::mem::take(&mut c.pieces) {
                if !c.closed && !on_text(&piece) {
                    c.closed = true;
                }
            }
            // A forward error is returned as itself, not as the sink's message of it.
            stepped?;
            if let Some(result) = c.result.take() {
                return result;
            }
        }
    }
}

/// The KV store `options` describe for `model` on `backend`.
fn new_store<B: Backend>(
    backend: &B,
    model: &LoadedModel<B>,
    options: &EngineOptions,
) -> Result<B::Kv, EngineError> {
    let cfg = &model.config;
    let shape = KvModelShape::from_config(cfg);
    let scheme = &options.kv_scheme;
    scheme
        .check_model(&shape, cfg.head_dim)
        .map_err(|e| EngineError::Request(format!("KV scheme {}: {e}", scheme.cache_key())))?;
    let layout = KvLayout::for_model(cfg, options.slots, options.context_len);
    Ok(backend.new_kv_planned(layout, &scheme.plan(&shape))?)
}

/// The scheduler `options` describe: its lane from the scheme and the backend, its budget.
fn new_scheduler<B: Backend>(
    backend: &B,
    model: &LoadedModel<B>,
    options: &EngineOptions,
) -> Scheduler {
    let cfg = &model.config;
    let shape = KvModelShape::from_config(cfg);
    let lane = Lane::for_backend(backend, &options.kv_scheme, &shape, cfg.head_dim);
    let budget = options.kv_budget_bytes.map(|room| {
        let caps_sliding = backend.memory_profile().caps_sliding;
        let geometry = KvGeometry::new(cfg, &options.kv_scheme, caps_sliding);
        KvBudget::new(room, geometry, options.prefill_chunk)
    });
    Scheduler::new(
        options.slots,
        lane,
        options.batch_tokens,
        options.prefill_chunk,
        budget,
    )
}

/// What [`Engine::generate`]'s sequence reported.
#[derive(Default)]
struct Collected {
    pieces: Vec<String>,
    closed: bool,
    result: Option<Result<GenerateOutput, EngineError>>,
}

struct CollectSink(Arc<Mutex<Collected>>);

impl CollectSink {
    fn with<T>(&self, f: impl FnOnce(&mut Collected) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl SequenceSink for CollectSink {
    fn text(&mut self, piece: &str, _logprobs: &[TokenLogprob]) -> bool {
        self.with(|c| {
            c.pieces.push(piece.to_owned());
            !c.closed
        })
    }

    fn is_closed(&self) -> bool {
        self.with(|c| c.closed)
    }

    fn finished(&mut self, out: GenerateOutput) {
        self.with(|c| c.result = Some(Ok(out)));
    }

    fn failed(&mut self, message: &str) {
        let message = message.to_owned();
        self.with(|c| c.result = Some(Err(EngineError::Request(message))));
    }
}
