//! The generation loop: chunked prefill (reusing the slot's common prefix), then decode with
//! sampling, EOS, stop strings and incremental detokenization.

use std::time::Instant;

use kiln_model::arch::LogitsWanted;
use kiln_model::backend::{Backend, BatchLayout, KvLayerState, KvLayout, KvStore};

use crate::EngineError;
use crate::detok::IncrementalDecoder;
use crate::kv_scheme::{DenseDtype, KvModelShape, KvScheme};
use crate::load::LoadedModel;
use crate::prompt_cache::{PromptCache, PromptCacheStats};
use crate::sampler::{Sampler, SamplingParams};
use crate::stats::{GenerationStats, peak_rss_bytes, per_sec};
use crate::stop::StopMatcher;

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
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            context_len: 4096,
            prefill_chunk: 512,
            kv_scheme: KvScheme::dense(DenseDtype::default()),
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

/// One generation request, already tokenized.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerateRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampler settings.
    pub sampling: SamplingParams,
    /// Stop strings, matched on decoded text.
    pub stop: Vec<String>,
    /// Keep going past EOS tokens (benchmarks).
    pub ignore_eos: bool,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An EOS token or a stop string.
    Stop,
    /// `max_tokens` or the context was reached.
    Length,
    /// The caller asked to stop.
    Cancelled,
}

/// Log-probabilities of one generated token.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenLogprob {
    /// The token.
    pub id: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely alternatives, descending.
    pub top: Vec<(u32, f32)>,
}

/// The result of a generation.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOutput {
    /// Generated ids (EOS excluded; tokens after a stop-string match included).
    pub tokens: Vec<u32>,
    /// Generated text, up to (not including) a matched stop string.
    pub text: String,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Index of the stop string that matched, if one did.
    pub stop_index: Option<usize>,
    /// Per-token log-probabilities, when asked for.
    pub logprobs: Vec<TokenLogprob>,
    /// Timings and memory.
    pub stats: GenerationStats,
}

/// A loaded model with its KV cache: runs one generation at a time.
pub struct Engine<B: Backend> {
    backend: B,
    model: LoadedModel<B>,
    kv: B::Kv,
    options: EngineOptions,
    /// Tokens whose KV slot 0 currently holds, so the next prompt can reuse a common prefix.
    slot_tokens: Vec<u32>,
    /// Saved prefixes other than the slot's (off unless enabled).
    prompt_cache: Option<PromptCache>,
}

impl<B: Backend> Engine<B> {
    /// Wraps a loaded model, allocating its KV cache.
    pub fn new(
        backend: B,
        model: LoadedModel<B>,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        if options.context_len == 0 || options.prefill_chunk == 0 {
            return Err(EngineError::Request(
                "context length and prefill chunk must be positive".into(),
            ));
        }
        let cfg = &model.config;
        let shape = KvModelShape::from_config(cfg);
        options
            .kv_scheme
            .check_model(&shape, cfg.head_dim)
            .map_err(|e| {
                EngineError::Request(format!("KV scheme {}: {e}", options.kv_scheme.cache_key()))
            })?;
        let layout = KvLayout::for_model(cfg, 1, options.context_len);
        let kv = backend.new_kv_planned(layout, &options.kv_scheme.plan(&shape))?;
        Ok(Self {
            backend,
            model,
            kv,
            options,
            slot_tokens: Vec::new(),
            prompt_cache: None,
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

    /// Replaces the KV cache with an empty one under `scheme` (saved prompts are dropped: they
    /// hold the old scheme's data).
    pub fn set_kv_scheme(&mut self, scheme: KvScheme) -> Result<(), EngineError> {
        let cfg = &self.model.config;
        let shape = KvModelShape::from_config(cfg);
        scheme
            .check_model(&shape, cfg.head_dim)
            .map_err(|e| EngineError::Request(format!("KV scheme {}: {e}", scheme.cache_key())))?;
        let layout = KvLayout::for_model(cfg, 1, self.options.context_len);
        self.kv = self.backend.new_kv_planned(layout, &scheme.plan(&shape))?;
        self.options.kv_scheme = scheme;
        self.slot_tokens.clear();
        if let Some(cache) = &self.prompt_cache {
            self.prompt_cache = Some(PromptCache::new(cache.stats().max_bytes));
        }
        Ok(())
    }

    /// The KV store.
    pub fn kv(&self) -> &B::Kv {
        &self.kv
    }

    /// The KV cache's scheme, per-layer formats and current contents.
    pub fn kv_report(&self) -> KvReport {
        let scheme = &self.options.kv_scheme;
        let plan = scheme.plan(&KvModelShape::from_config(&self.model.config));
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
            current: self.kv.layer_states(0).iter().map(|s| s.name()).collect(),
            conversions: self.kv.conversions(),
            positions: self.kv.seq_len(0),
            bytes: self.kv.slot_bytes(0),
            reserved_bytes: self.kv.allocated_bytes(),
        }
    }

    /// One forward of slot 0, then the conversion of every layer the scheme says is due.
    fn step(
        &mut self,
        tokens: &[u32],
        batch: &BatchLayout,
        want: LogitsWanted,
    ) -> Result<Vec<f32>, EngineError> {
        let logits = self
            .model
            .model
            .forward(&self.backend, &mut self.kv, tokens, batch, want)?;
        self.kv.convert_due(0)?;
        Ok(logits)
    }

    /// Positions of slot 0's KV that hold the previous request's tokens (prompt cache).
    pub fn cached_len(&self) -> usize {
        self.slot_tokens.len()
    }

    /// Keeps up to `max_bytes` of KV snapshots of earlier prompts (spec §11.1), so switching
    /// between conversations re-prefills only the new turn; 0 turns the cache off (the slot's
    /// own prefix is still reused).
    pub fn set_prompt_cache_bytes(&mut self, max_bytes: usize) {
        self.prompt_cache = (max_bytes > 0).then(|| PromptCache::new(max_bytes));
    }

    /// Counters of the prompt cache, when it is on.
    pub fn prompt_cache_stats(&self) -> Option<PromptCacheStats> {
        self.prompt_cache.as_ref().map(PromptCache::stats)
    }

    /// Forgets the cached prefix.
    pub fn reset(&mut self) {
        self.slot_tokens.clear();
        self.kv.set_seq_len(0, 0);
    }

    /// Cuts slot 0 back to its first `len` positions (benchmarks); converted layers stay
    /// converted, as they do when a prompt reuses a prefix.
    pub fn truncate_cache(&mut self, len: usize) {
        self.slot_tokens.truncate(len);
        self.kv.set_seq_len(0, len.min(self.kv.seq_len(0)));
    }

    /// One forward of slot 0 returning the last position's logits, without prompt bookkeeping
    /// (benchmarks); call [`Engine::reset`] before reusing the engine for generation.
    pub fn forward_raw(
        &mut self,
        tokens: &[u32],
        batch: &BatchLayout,
    ) -> Result<Vec<f32>, EngineError> {
        self.slot_tokens.clear();
        self.step(tokens, batch, LogitsWanted::LastOfEach)
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
        self.check_fits(tokens.len())?;
        if chunk == 0 {
            return Err(EngineError::Request("the chunk must be positive".into()));
        }
        self.reset();
        let mut out = Vec::with_capacity(tokens.len() * self.model.config.vocab_size);
        for (i, part) in tokens.chunks(chunk).enumerate() {
            let batch = BatchLayout::single(0, i * chunk, part.len());
            out.extend(self.step(part, &batch, LogitsWanted::All)?);
        }
        self.slot_tokens = tokens.to_vec();
        Ok(out)
    }

    fn check_fits(&self, prompt: usize) -> Result<(), EngineError> {
        if prompt == 0 {
            return Err(EngineError::Request("the prompt is empty".into()));
        }
        if prompt >= self.options.context_len {
            return Err(EngineError::Request(format!(
                "the prompt has {prompt} tokens; the context holds {} (prompt plus at least one generated token)",
                self.options.context_len
            )));
        }
        Ok(())
    }

    /// Prefills the prompt, reusing the longest prefix already in the cache; returns the
    /// last position's logits and how many prompt tokens were reused.
    fn prefill(&mut self, prompt: &[u32]) -> Result<(Vec<f32>, usize), EngineError> {
        // At least one token must be computed to get logits.
        let mut common = self
            .slot_tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        if let Some(cache) = self.prompt_cache.as_mut() {
            common = cache.swap_in(&mut self.kv, &mut self.slot_tokens, prompt, common);
        }
        self.slot_tokens.truncate(common);
        let mut logits = Vec::new();
        let mut pos = common;
        for chunk in prompt[common..].chunks(self.options.prefill_chunk) {
            let batch = BatchLayout::single(0, pos, chunk.len());
            logits = self.step(chunk, &batch, LogitsWanted::LastOfEach)?;
            pos += chunk.len();
            self.slot_tokens.extend_from_slice(chunk);
        }
        Ok((logits, common))
    }

    /// Generates for `req`, calling `on_text` with each piece of text that is safe to show;
    /// `on_text` returning `false` cancels.
    pub fn generate(
        &mut self,
        req: &GenerateRequest,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<GenerateOutput, EngineError> {
        let started = Instant::now();
        self.check_fits(req.prompt.len())?;
        let vocab = self.model.config.vocab_size;
        req.sampling.validate_for_vocab(vocab)?;
        let mut xtc_special = self.model.eos_ids.clone();
        xtc_special.extend(self.model.tokenizer.encode("\n", false)?);
        let mut sampler = Sampler::new(req.sampling.clone(), xtc_special)?;
        let mut stops = StopMatcher::new(req.stop.clone())?;
        let mut detok =
            IncrementalDecoder::with_context(self.model.hf_tokenizer.clone(), true, &req.prompt);

        let (mut logits, cached) = self.prefill(&req.prompt)?;
        let prefill_secs = started.elapsed().as_secs_f64();
        let mut history: Vec<u32> = req.prompt.clone();
        let mut out = GenerateOutput {
            tokens: vec![],
            text: String::new(),
            finish_reason: FinishReason::Length,
            stop_index: None,
            logprobs: vec![],
            stats: GenerationStats::default(),
        };
        let mut first_token_at = None;
        let room = self.options.context_len - req.prompt.len();
        let budget = req.max_tokens.min(room);
        let mut cancelled = false;
        for step in 0..budget {
            sampler.set_step(step as u64);
            let picked = sampler.sample(&mut logits, &history);
            first_token_at.get_or_insert_with(Instant::now);
            if !req.ignore_eos && self.model.eos_ids.contains(&picked.id) {
                out.finish_reason = FinishReason::Stop;
                break;
            }
            out.tokens.push(picked.id);
            history.push(picked.id);
            if let Some(lp) = picked.logprob {
                out.logprobs.push(TokenLogprob {
                    id: picked.id,
                    logprob: lp,
                    top: picked.top_logprobs.clone(),
                });
            }
            let piece = detok
                .push(picked.id)
                .map_err(|e| EngineError::Detok(e.to_string()))?;
            let released = stops.push(&piece);
            out.text.push_str(&released.emit);
            if !released.emit.is_empty() && !on_text(&released.emit) {
                cancelled = true;
            }
            if let Some(i) = released.stopped {
                out.stop_index = Some(i);
                out.finish_reason = FinishReason::Stop;
                break;
            }
            if cancelled {
                out.finish_reason = FinishReason::Cancelled;
                break;
            }
            if step + 1 == budget {
                break;
            }
            let pos = self.slot_tokens.len();
            logits = self.step(
                &[picked.id],
                &BatchLayout::single(0, pos, 1),
                LogitsWanted::LastOfEach,
            )?;
            self.slot_tokens.push(picked.id);
        }
        if out.stop_index.is_none() && !cancelled {
            let rest = detok
                .flush()
                .map_err(|e| EngineError::Detok(e.to_string()))?;
            let released = stops.push(&rest);
            let mut tail = released.emit;
            if let Some(i) = released.stopped {
                out.stop_index = Some(i);
                out.finish_reason = FinishReason::Stop;
            } else {
                tail.push_str(&stops.finish());
            }
            if !tail.is_empty() {
                on_text(&tail);
            }
            out.text.push_str(&tail);
        }
        let end = Instant::now();
        let ttft = first_token_at.map_or(0.0, |t| (t - started).as_secs_f64());
        let decode_secs = first_token_at.map_or(0.0, |t| (end - t).as_secs_f64());
        let computed = req.prompt.len() - cached;
        out.stats = GenerationStats {
            prompt_tokens: req.prompt.len(),
            cached_tokens: cached,
            generated_tokens: out.tokens.len(),
            prefill_secs,
            decode_secs,
            time_to_first_token_secs: ttft,
            prompt_tokens_per_sec: per_sec(computed, prefill_secs),
            decode_tokens_per_sec: per_sec(out.tokens.len().saturating_sub(1), decode_secs),
            peak_rss_bytes: peak_rss_bytes(),
        };
        Ok(out)
    }
}
