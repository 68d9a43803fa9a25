//! One request's side of generation, whatever else shares the forward: its tokens, sampler,
//! stop matcher, incremental detokenizer, budget and the output being built. The scheduler
//! feeds it one logits row whenever the sequence's last token has been computed.

use std::time::Instant;

use crate::EngineError;
use crate::detok::IncrementalDecoder;
use crate::load::LoadedModel;
use crate::request::{FinishReason, GenerateOutput, GenerateRequest, TokenLogprob};
use crate::sampler::Sampler;
use crate::stats::{GenerationStats, peak_rss_bytes, per_sec};
use crate::stop::StopMatcher;
use crate::structured::Constraint;

/// The decoding state of one sequence.
pub(crate) struct Decoding {
    sampler: Sampler,
    stops: StopMatcher,
    detok: IncrementalDecoder,
    /// The grammar the output must follow, if any: applied to the logits before sampling.
    constraint: Option<Constraint>,
    eos: Vec<u32>,
    ignore_eos: bool,
    /// Prompt then generated tokens: what the KV must hold before the next sample, the last
    /// one (once generation started) still to be computed.
    pub(crate) history: Vec<u32>,
    prompt_len: usize,
    budget: usize,
    out: GenerateOutput,
    /// Logprob entries already handed out with emitted text.
    logprobs_sent: usize,
    /// Time spent in the constraint (masks and grammar steps).
    grammar_time: std::time::Duration,
    started: Instant,
    prefilled_at: Option<Instant>,
    first_token_at: Option<Instant>,
    /// Prompt tokens reused from a cache when the prompt was first computed.
    pub(crate) cached: usize,
    /// Prompt tokens computed (not reused), counting a preempted sequence's recomputation.
    computed_prompt: usize,
    done: bool,
}

/// Receives released text with the logprob entries of the tokens that produced it (empty when
/// logprobs were not asked for); `false` cancels.
pub(crate) type Emit<'a> = dyn FnMut(&str, &[TokenLogprob]) -> bool + 'a;

/// What a sample left the sequence doing.
pub(crate) enum Next {
    /// The sampled token (now last in the history) is to be computed next.
    Feed,
    /// Finished; [`Decoding::finish`] gives the output.
    Done,
}

/// What decoding needs of a model: its vocabulary, end tokens and detokenizer.
pub(crate) struct Vocab {
    /// Logits per row.
    pub(crate) size: usize,
    /// Tokens that end generation.
    pub(crate) eos: Vec<u32>,
    /// The tokens of `"\n"`, which XTC never removes (with the EOS tokens).
    pub(crate) newline: Vec<u32>,
    /// Decodes generated tokens to text.
    pub(crate) tokenizer: std::sync::Arc<tokenizers::Tokenizer>,
}

impl Decoding {
    /// Checks `req` against the model and a context of `context_len` positions.
    pub(crate) fn new<B: kiln_model::backend::Backend>(
        model: &LoadedModel<B>,
        req: &GenerateRequest,
        context_len: usize,
    ) -> Result<Self, EngineError> {
        let vocab = Vocab {
            size: model.config.vocab_size,
            eos: model.eos_ids.clone(),
            newline: model.tokenizer.encode("\n", false)?,
            tokenizer: model.hf_tokenizer.clone(),
        };
        Self::with_vocab(&vocab, req, context_len)
    }

    /// [`Decoding::new`] for a model described only by its `vocab`.
    pub(crate) fn with_vocab(
        vocab: &Vocab,
        req: &GenerateRequest,
        context_len: usize,
    ) -> Result<Self, EngineError> {
        check_fits(req.prompt.len(), context_len)?;
        req.sampling.validate_for_vocab(vocab.size)?;
        let mut xtc_special = vocab.eos.clone();
        xtc_special.extend(&vocab.newline);
        let room = context_len - req.prompt.len();
        Ok(Self {
            sampler: Sampler::new(req.sampling.clone(), xtc_special)?,
            stops: StopMatcher::new(req.stop.clone())?,
            detok: IncrementalDecoder::with_context(vocab.tokenizer.clone(), true, &req.prompt),
            constraint: req.grammar.as_ref().map(|g| g.start()),
            eos: vocab.eos.clone(),
            ignore_eos: req.ignore_eos,
            history: req.prompt.clone(),
            prompt_len: req.prompt.len(),
            budget: req.max_tokens.min(room),
            out: GenerateOutput::default(),
            logprobs_sent: 0,
            grammar_time: std::time::Duration::ZERO,
            started: Instant::now(),
            prefilled_at: None,
            first_token_at: None,
            cached: 0,
            computed_prompt: 0,
            done: false,
        })
    }

    /// Tokens generated so far.
    pub(crate) fn generated(&self) -> usize {
        self.out.tokens.len()
    }

    /// Counts `n` computed positions of the prompt.
    pub(crate) fn computed_prompt_tokens(&mut self, n: usize) {
        self.computed_prompt += n;
    }

    /// Samples the next token from `logits` (the row after the sequence's last token), emits
    /// the text it releases through `emit` (`false` from `emit` cancels), and says what next.
    pub(crate) fn accept(
        &mut self,
        logits: &mut [f32],
        emit: &mut Emit<'_>,
    ) -> Result<Next, EngineError> {
        if self.done || self.budget == 0 {
            self.done = true;
            return Ok(Next::Done);
        }
        self.prefilled_at.get_or_insert_with(Instant::now);
        let step = self.out.tokens.len();
        // A grammar that completes ends the sequence on that token (below), so none is
        // finished here.
        if let Some(c) = &mut self.constraint {
            let t = Instant::now();
            c.mask(logits)?;
            self.grammar_time += t.elapsed();
        }
        self.sampler.set_step(step as u64);
        let picked = self.sampler.sample(logits, &self.history);
        self.first_token_at.get_or_insert_with(Instant::now);
        if !self.ignore_eos && self.eos.contains(&picked.id) {
            self.out.finish_reason = FinishReason::Stop;
            self.done = true;
            return Ok(Next::Done);
        }
        let mut grammar_done = false;
        if let Some(c) = &mut self.constraint {
            let t = Instant::now();
            c.accept(picked.id)?;
            grammar_done = c.finished();
            self.grammar_time += t.elapsed();
        }
        self.out.tokens.push(picked.id);
        self.history.push(picked.id);
        if let Some(lp) = picked.logprob {
            self.out.logprobs.push(TokenLogprob {
                id: picked.id,
                logprob: lp,
                top: picked.top_logprobs.clone(),
            });
        }
        let piece = self
            .detok
            .push(picked.id)
            .map_err(|e| EngineError::Detok(e.to_string()))?;
        let released = self.stops.push(&piece);
        self.out.text.push_str(&released.emit);
        let cancelled = !released.emit.is_empty()
            && !emit_with(
                &self.out.logprobs,
                &mut self.logprobs_sent,
                &released.emit,
                emit,
            );
        if let Some(i) = released.stopped {
            self.out.stop_index = Some(i);
            self.out.finish_reason = FinishReason::Stop;
        } else if cancelled {
            self.out.finish_reason = FinishReason::Cancelled;
        } else if grammar_done {
            // The grammar is complete with this token: the answer ends here, as at an EOS.
            self.out.finish_reason = FinishReason::Stop;
        } else if step + 1 < self.budget {
            return Ok(Next::Feed);
        }
        self.done = true;
        Ok(Next::Done)
    }

    /// Marks the sequence cancelled (its client left).
    pub(crate) fn cancel(&mut self) {
        self.out.finish_reason = FinishReason::Cancelled;
        self.done = true;
    }

    /// The output, after flushing held-back text through `emit` (unless a stop string matched
    /// or the sequence was cancelled).
    pub(crate) fn finish(mut self, emit: &mut Emit<'_>) -> Result<GenerateOutput, EngineError> {
        if self.out.stop_index.is_none() && self.out.finish_reason != FinishReason::Cancelled {
            let rest = self
                .detok
                .flush()
                .map_err(|e| EngineError::Detok(e.to_string()))?;
            let released = self.stops.push(&rest);
            let mut tail = released.emit;
            if let Some(i) = released.stopped {
                self.out.stop_index = Some(i);
                self.out.finish_reason = FinishReason::Stop;
            } else {
                tail.push_str(&self.stops.finish());
            }
            if !tail.is_empty() {
                emit_with(&self.out.logprobs, &mut self.logprobs_sent, &tail, emit);
            }
            self.out.text.push_str(&tail);
        }
        let mut out = std::mem::take(&mut self.out);
        let end = Instant::now();
        let since = |t: Option<Instant>| t.map_or(0.0, |t| (t - self.started).as_secs_f64());
        let prefill_secs = since(self.prefilled_at);
        let decode_secs = self.first_token_at.map_or(0.0, |t| (end - t).as_secs_f64());
        out.stats = GenerationStats {
            prompt_tokens: self.prompt_len,
            cached_tokens: self.cached,
            generated_tokens: out.tokens.len(),
            prefill_secs,
            decode_secs,
            time_to_first_token_secs: since(self.first_token_at),
            prompt_tokens_per_sec: per_sec(self.computed_prompt, prefill_secs),
            decode_tokens_per_sec: per_sec(out.tokens.len().saturating_sub(1), decode_secs),
            grammar_secs: self.grammar_time.as_secs_f64(),
            peak_rss_bytes: peak_rss_bytes(),
        };
        Ok(out)
    }
}

/// Hands `text` to `emit` with the logprob entries after the first `sent` (the tokens generated
/// since the last emission), so streams carry each token's logprobs with its text.
fn emit_with(all: &[TokenLogprob], sent: &mut usize, text: &str, emit: &mut Emit<'_>) -> bool {
    let fresh = &all[(*sent).min(all.len())..];
    *sent = all.len();
    emit(text, fresh)
}

/// A prompt of `prompt` tokens must leave room for one generated token in the context.
pub(crate) fn check_fits(prompt: usize, context_len: usize) -> Result<(), EngineError> {
    if prompt == 0 {
        return Err(EngineError::Request("the prompt is empty".into()));
    }
    if prompt >= context_len {
        return Err(EngineError::Request(format!(
            "the prompt has {prompt} tokens; the context holds {context_len} (prompt plus at least one generated token)"
        )));
    }
    Ok(())
}
