//! `kiln bench`: llama-bench-style prompt processing (ppN) and text generation (tgN) runs.

use std::time::Instant;

use kiln_model::backend::{Backend, BatchLayout, KvStore, OpProfile, SeqSpan};
use kiln_model::lora::AdapterStack;
use serde::Serialize;

use crate::{Engine, EngineError};

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchConfig {
    /// Prompt length of the prefill test (0 skips it).
    pub prompt_tokens: usize,
    /// Tokens of the generation test (0 skips it).
    pub gen_tokens: usize,
    /// Repetitions of each test (after one warm-up).
    pub repetitions: usize,
    /// Positions filled before each test (llama-bench's `-d`), so decode is measured against a
    /// cache of that length in the engine's KV scheme.
    pub depth: usize,
    /// Sequences in each generation step, one KV slot each (the engine needs that many
    /// slots); 1 is single-sequence decode.
    pub batch: usize,
}

/// Results of one test over its repetitions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchResult {
    /// `pp512`, `tg128`…
    pub test: String,
    /// Tokens per second of each repetition.
    pub samples: Vec<f64>,
    /// Mean tokens per second.
    pub mean: f64,
    /// Sample standard deviation.
    pub stddev: f64,
    /// Slowest repetition.
    pub min: f64,
    /// Median repetition.
    pub median: f64,
    /// Fastest repetition.
    pub max: f64,
    /// Where the time went over all repetitions, when the backend records it.
    pub profile: Option<OpProfile>,
}

fn summarize(test: String, samples: Vec<f64>, profile: Option<OpProfile>) -> BenchResult {
    let n = samples.len().max(1) as f64;
    let mean = samples.iter().sum::<f64>() / n;
    let var = if samples.len() > 1 {
        samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    let mut sorted = samples.clone();
    sorted.sort_by(f64::total_cmp);
    let median = if sorted.is_empty() {
        0.0
    } else if sorted.len() % 2 == 1 {
        sorted[sorted.len() / 2]
    } else {
        (sorted[sorted.len() / 2 - 1] + sorted[sorted.len() / 2]) / 2.0
    };
    BenchResult {
        test,
        mean,
        stddev: var.sqrt(),
        min: sorted.first().copied().unwrap_or(0.0),
        median,
        max: sorted.last().copied().unwrap_or(0.0),
        samples,
        profile,
    }
}

/// Deterministic pseudo-random prompt ids (llama-bench also feeds random tokens).
fn prompt_ids(n: usize, vocab: usize) -> Vec<u32> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab as u64) as u32
        })
        .collect()
}

impl<B: Backend> Engine<B> {
    /// Runs the configured tests and returns one result per test.
    pub fn bench(&mut self, cfg: &BenchConfig) -> Result<Vec<BenchResult>, EngineError> {
        self.bench_with(cfg, None)
    }

    /// [`Engine::bench`] with every forward running LoRA `adapters` (`kiln bench --adapter`).
    pub fn bench_with(
        &mut self,
        cfg: &BenchConfig,
        adapters: Option<&AdapterStack>,
    ) -> Result<Vec<BenchResult>, EngineError> {
        let mut results = vec![];
        let need = cfg
            .depth
            .saturating_add(cfg.prompt_tokens.max(cfg.gen_tokens));
        if need > self.options().context_len {
            return Err(EngineError::Request(format!(
                "depth {} + pp{} / tg{} does not fit the {}-token context",
                cfg.depth,
                cfg.prompt_tokens,
                cfg.gen_tokens,
                self.options().context_len
            )));
        }
        let vocab = self.model().config.vocab_size;
        let suffix = if cfg.depth > 0 {
            format!(" @ d{}", cfg.depth)
        } else {
            String::new()
        };
        let batch = cfg.batch.max(1);
        if batch > self.kv().layout().n_slots {
            return Err(EngineError::Request(format!(
                "a batch of {batch} needs {batch} KV slots; the engine has {}",
                self.kv().layout().n_slots
            )));
        }
        // The depth is filled once per slot (it converts a quantized cache); each repetition
        // cuts the cache back to it.
        let fill = prompt_ids(cfg.depth + 1, vocab)[1..].to_vec();
        self.reset();
        let chunk = self.options().prefill_chunk;
        for slot in 0..batch {
            for (i, part) in fill.chunks(chunk).enumerate() {
                let layout = BatchLayout::single(slot, i * chunk, part.len());
                self.forward_batch_with(part, &layout, adapters)?;
            }
        }
        let depth = cfg.depth;
        if cfg.prompt_tokens > 0 {
            let ids = prompt_ids(cfg.prompt_tokens, vocab);
            let mut samples = vec![];
            for rep in 0..=cfg.repetitions {
                if rep == 1 {
                    self.backend().take_profile();
                }
                self.truncate_cache(depth);
                let t = Instant::now();
                let batch = BatchLayout::single(0, depth, ids.len());
                self.forward_batch_with(&ids, &batch, adapters)?;
                if rep > 0 {
                    samples.push(ids.len() as f64 / t.elapsed().as_secs_f64());
                }
            }
            results.push(summarize(
                format!("pp{}{suffix}", cfg.prompt_tokens),
                samples,
                self.backend().take_profile(),
            ));
        }
        if cfg.gen_tokens > 0 {
            let mut samples = vec![];
            for rep in 0..=cfg.repetitions {
                if rep == 1 {
                    self.backend().take_profile();
                }
                for slot in 0..batch {
                    self.truncate_slot(slot, depth);
                }
                let mut tokens = vec![prompt_ids(1, vocab)[0]; batch];
                let t = Instant::now();
                for pos in depth..depth + cfg.gen_tokens {
                    let layout = BatchLayout {
                        spans: (0..batch)
                            .map(|slot| SeqSpan {
                                slot,
                                start_pos: pos,
                                n_tokens: 1,
                            })
                            .collect(),
                    };
                    let logits = self.forward_batch_with(&tokens, &layout, adapters)?;
                    for (token, row) in tokens.iter_mut().zip(logits.chunks_exact(vocab)) {
                        *token = argmax(row);
                    }
                }
                if rep > 0 {
                    samples.push((batch * cfg.gen_tokens) as f64 / t.elapsed().as_secs_f64());
                }
            }
            let rows = if batch > 1 {
                format!(" x{batch}")
            } else {
                String::new()
            };
            results.push(summarize(
                format!("tg{}{rows}{suffix}", cfg.gen_tokens),
                samples,
                self.backend().take_profile(),
            ));
        }
        self.reset();
        Ok(results)
    }
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}
