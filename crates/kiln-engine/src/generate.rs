//! The generation loop: chunked prefill (reusing the slot's common prefix), then decode with
//! sampling, EOS, stop strings and incremental detokenization.

use std::time::Instant;

use kiln_model::arch::LogitsWanted;
use kiln_model::backend::{Backend, BatchLayout, KvLayout, KvStore};

use crate::EngineError;
use crate::detok::IncrementalDecoder;
use crate::load::LoadedModel;
use crate::prompt_cache::{PromptCache, PromptCacheStats};
use crate::sampler::{Sampler, SamplingParams};
use crate::stats::{GenerationStats, peak_rss_bytes, per_sec};
use crate::stop::StopMatcher;

/// Engine-wide settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// Positions the KV cache holds (prompt + generated).
    pub context_len: usize,
    /// Prompt tokens computed per forward during prefill.
    pub prefill_chunk: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            context_len: 4096,
            prefill_chunk: 512,
        }
    }
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
        let layout = KvLayout::for_model(cfg, 1, options.context_len);
        let kv = backend.new_kv(layout)?;
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
    pub fn options(&self) -> EngineOptions {
        self.options
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

    /// One forward of slot 0 returning the last position's logits, without prompt bookkeeping
    /// (benchmarks); call [`Engine::reset`] before reusing the engine for generation.
    pub fn forward_raw(
        &mut self,
        tokens: &[u32],
        batch: &BatchLayout,
    ) -> Result<Vec<f32>, EngineError> {
        self.slot_tokens.clear();
        Ok(self.model.model.forward(
            &self.backend,
            &mut self.kv,
            tokens,
            batch,
            LogitsWanted::LastOfEach,
        )?)
    }

    /// Logits for every position of `tokens`, computed from an empty cache (evaluation).
    pub fn logits_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.check_fits(tokens.len())?;
        self.reset();
        let mut out = Vec::with_capacity(tokens.len() * self.model.config.vocab_size);
        for (i, chunk) in tokens.chunks(self.options.prefill_chunk).enumerate() {
            let start = i * self.options.prefill_chunk;
            let batch = BatchLayout::single(0, start, chunk.len());
            out.extend(self.model.model.forward(
                &self.backend,
                &mut self.kv,
                chunk,
                &batch,
                LogitsWanted::All,
            )?);
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
            logits = self.model.model.forward(
                &self.backend,
                &mut self.kv,
                chunk,
                &batch,
                LogitsWanted::LastOfEach,
            )?;
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
            logits = self.model.model.forward(
                &self.backend,
                &mut self.kv,
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
