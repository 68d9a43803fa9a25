//! Token sampling: logits processors, log-softmax and the filter chain of spec §10.
//!
//! One [`Sampler`] serves one request (one sequence): it owns the per-step RNG position and
//! vocabulary-sized scratch buffers so steady-state sampling does not allocate.

mod filters;
mod params;
mod processors;
mod rng;

pub use params::{DEFAULT_PENALTY_CONTEXT, MAX_TOP_LOGPROBS, SamplingParams};
pub use rng::step_key;

use thiserror::Error;

/// Errors from building a sampler.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SamplerError {
    /// A sampling parameter is out of range; the message names the field.
    #[error("{0}")]
    InvalidParam(String),
}

/// The outcome of one sampling step.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    /// The chosen token id.
    pub id: u32,
    /// Log-probability of `id` under the processed distribution (after bias and penalties,
    /// before filters and temperature); `Some` only when logprobs were requested.
    pub logprob: Option<f32>,
    /// The `top_logprobs` most likely tokens of that same distribution, descending.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Per-sequence sampler implementing spec §10's processor and sampler chain.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    xtc_special: Vec<u32>,
    step: u64,
    /// Log-probabilities of the processed logits, kept intact for the logprobs output.
    lp: Vec<f32>,
    /// Copy of `lp` that the filters cut down.
    work: Vec<f32>,
    /// Ordering scratch for top_p / min_p / top_k.
    idx: Vec<u64>,
    /// Per-token occurrence counts for the penalties; all zeros between uses.
    counts: Vec<u32>,
}

impl Sampler {
    /// Validates `params` and builds a sampler positioned at step 0.
    ///
    /// `xtc_special` lists the ids XTC never removes: every EOS id plus the id(s) of `"\n"`
    /// encoded without special tokens (spec §10).
    pub fn new(params: SamplingParams, xtc_special: Vec<u32>) -> Result<Self, SamplerError> {
        params.validate()?;
        Ok(Self {
            params,
            xtc_special,
            step: 0,
            lp: Vec::new(),
            work: Vec::new(),
            idx: Vec::new(),
            counts: Vec::new(),
        })
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The index of the next step (the number of tokens sampled so far).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Repositions the RNG, e.g. to replay a run from a known step.
    pub fn set_step(&mut self, step: u64) {
        self.step = step;
    }

    /// Chooses the next token.
    ///
    /// `logits` is the model's last-position row; it is modified in place by the processors
    /// (bias, penalties), so after the call it holds the processed logits. `history` is the
    /// prompt plus generated tokens; only the penalties read it, so it may be empty when none
    /// is active. Non-finite logits are tolerated: NaN counts as `-inf`, `+inf` tokens share the
    /// probability mass, and an all-`-inf` row yields token 0 (lowest id) with logprob `-inf`.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> SampledToken {
        let n = logits.len();
        if self.lp.len() != n {
            self.resize(n);
        }
        let p = &self.params;

        processors::apply_logit_bias(logits, &p.logit_bias);
        if p.repetition_penalty != 0.0 {
            let w = processors::window(history, p.repetition_context_size);
            processors::apply_repetition_penalty(logits, w, p.repetition_penalty, &mut self.counts);
        }
        if p.presence_penalty != 0.0 {
            let w = processors::window(history, p.presence_context_size);
            processors::apply_presence_penalty(logits, w, p.presence_penalty, &mut self.counts);
        }
        if p.frequency_penalty != 0.0 {
            let w = processors::window(history, p.frequency_context_size);
            processors::apply_frequency_penalty(logits, w, p.frequency_penalty, &mut self.counts);
        }

        let mut rng = rng::StepRng::new(p.seed, self.step);
        self.step = self.step.wrapping_add(1);

        // Greedy decoding without logprobs never needs the normalised distribution: the argmax
        // of the logits is the argmax of the log-probabilities.
        if p.temperature == 0.0 && !p.wants_logprobs() {
            return SampledToken {
                id: filters::argmax(logits),
                logprob: None,
                top_logprobs: Vec::new(),
            };
        }

        filters::log_softmax(logits, &mut self.lp);

        let id = if n == 0 {
            0
        } else if p.temperature == 0.0 {
            filters::argmax(&self.lp)
        } else {
            self.work.copy_from_slice(&self.lp);
            if p.top_p > 0.0 && p.top_p < 1.0 {
                filters::top_p(&mut self.work, &mut self.idx, p.top_p);
            }
            if p.min_p != 0.0 {
                filters::min_p(&mut self.work, &mut self.idx, p.min_p, p.min_tokens_to_keep);
            }
            if p.xtc_probability > 0.0 {
                let u = rng.xtc_uniform();
                filters::xtc(
                    &mut self.work,
                    u,
                    p.xtc_probability,
                    p.xtc_threshold,
                    &self.xtc_special,
                );
            }
            if p.top_k > 0 {
                filters::top_k(&mut self.work, &mut self.idx, p.top_k);
            }
            let u = rng.categorical_uniform();
            filters::categorical(&mut self.work, p.temperature, u)
                .unwrap_or_else(|| filters::argmax(&self.lp))
        };

        let (logprob, top_logprobs) = if p.wants_logprobs() {
            let lp = self
                .lp
                .get(id as usize)
                .copied()
                .unwrap_or(f32::NEG_INFINITY);
            (Some(lp), filters::top_entries(&self.lp, p.top_logprobs))
        } else {
            (None, Vec::new())
        };
        SampledToken {
            id,
            logprob,
            top_logprobs,
        }
    }

    fn resize(&mut self, n: usize) {
        self.lp.resize(n, 0.0);
        self.work.resize(n, 0.0);
        self.idx.clear();
        self.idx.reserve(n);
        // Counts must be all zeros between calls; a fresh buffer guarantees it.
        self.counts.clear();
        self.counts.resize(n, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            seed,
            ..SamplingParams::default()
        }
    }

    fn ln(p: &[f64]) -> Vec<f32> {
        p.iter().map(|&x| x.ln() as f32).collect()
    }

    fn run(p: SamplingParams, logits: &[f32], steps: usize) -> Vec<u32> {
        let mut s = Sampler::new(p, vec![]).expect("valid params");
        (0..steps)
            .map(|_| s.sample(&mut logits.to_vec(), &[]).id)
            .collect()
    }

    #[test]
    fn greedy_is_argmax_with_lowest_id_ties_and_ignores_filters() {
        let p = SamplingParams {
            top_k: 1,
            top_p: 0.1,
            ..params(0.0, 0)
        };
        let mut s = Sampler::new(p, vec![]).expect("valid");
        assert_eq!(s.sample(&mut [1.0, 5.0, 5.0, 2.0], &[]).id, 1);
        assert_eq!(s.sample(&mut [f32::NAN, 0.0, f32::NAN], &[]).id, 1);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37 % 11) as f32) * 0.3).collect();
        let a = run(params(1.0, 1234), &logits, 100);
        let b = run(params(1.0, 1234), &logits, 100);
        let c = run(params(1.0, 1235), &logits, 100);
        assert_eq!(a, b);
        assert_ne!(a, c);
        // Steps use different keys, so a seeded run is not one token repeated.
        assert!(a.iter().any(|&t| t != a[0]));
    }

    #[test]
    fn set_step_replays() {
        let logits = vec![0.0f32; 20];
        let mut s = Sampler::new(params(1.0, 9), vec![]).expect("valid");
        let first: Vec<u32> = (0..5)
            .map(|_| s.sample(&mut logits.clone(), &[]).id)
            .collect();
        s.set_step(2);
        assert_eq!(s.step(), 2);
        assert_eq!(s.sample(&mut logits.clone(), &[]).id, first[2]);
    }

    #[test]
    fn xtc_does_not_shift_the_categorical_stream() {
        // With XTC enabled but its coin never landing (probability tiny) the categorical draws
        // must equal a run without XTC: the two sub-streams are independent.
        let logits: Vec<f32> = (0..30).map(|i| (i % 7) as f32 * 0.5).collect();
        let plain = run(params(0.8, 77), &logits, 50);
        let with_xtc = run(
            SamplingParams {
                xtc_probability: 1e-30,
                xtc_threshold: 0.1,
                ..params(0.8, 77)
            },
            &logits,
            50,
        );
        assert_eq!(plain, with_xtc);
    }

    #[test]
    fn categorical_frequencies_follow_distribution() {
        let probs = [0.5, 0.25, 0.125, 0.0625, 0.0625];
        let logits = ln(&probs);
        let n = 20_000;
        let mut counts = [0usize; 5];
        for t in run(params(1.0, 42), &logits, n) {
            counts[t as usize] += 1;
        }
        // Pearson chi-square, 4 degrees of freedom: the 0.999 quantile is 18.47.
        let chi2: f64 = probs
            .iter()
            .zip(counts)
            .map(|(&p, c)| {
                let e = p * n as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum();
        assert!(chi2 < 18.47, "chi2 {chi2}, counts {counts:?}");
    }

    #[test]
    fn temperature_sharpens_distribution() {
        // At T = 0.5 the odds square: 0.8/0.2 becomes 0.64/0.04 → p0 = 16/17 ≈ 0.941.
        let logits = ln(&[0.8, 0.2]);
        let n = 10_000;
        let zeros = run(params(0.5, 3), &logits, n)
            .iter()
            .filter(|&&t| t == 0)
            .count();
        let p0 = zeros as f64 / n as f64;
        assert!((p0 - 16.0 / 17.0).abs() < 0.015, "{p0}");
    }

    #[test]
    fn filter_chain_restricts_support() {
        // top_k 2 over [0.05 0.4 0.1 0.3 0.15] → only ids 1 and 3 may ever be drawn.
        let logits = ln(&[0.05, 0.4, 0.1, 0.3, 0.15]);
        let p = SamplingParams {
            top_k: 2,
            ..params(1.0, 5)
        };
        let out = run(p, &logits, 500);
        assert!(out.iter().all(|&t| t == 1 || t == 3));
        assert!(out.contains(&1) && out.contains(&3));

        // top_p 0.8 → {1,3,4}; then min_p 0.5 over those (max 0.4 → cut 0.2) → {1,3}.
        let p = SamplingParams {
            top_p: 0.8,
            min_p: 0.5,
            ..params(1.0, 5)
        };
        let out = run(p, &logits, 500);
        assert!(out.iter().all(|&t| t == 1 || t == 3));
    }

    #[test]
    fn xtc_always_on_removes_top_choices_except_special() {
        let logits = ln(&[0.05, 0.4, 0.1, 0.3, 0.15]);
        let p = SamplingParams {
            xtc_probability: 1.0,
            xtc_threshold: 0.1,
            ..params(1.0, 8)
        };
        let out = run(p.clone(), &logits, 300);
        assert!(out.iter().all(|&t| t == 0 || t == 2 || t == 4));
        let mut s = Sampler::new(p, vec![1]).expect("valid");
        let out: Vec<u32> = (0..300)
            .map(|_| s.sample(&mut logits.clone(), &[]).id)
            .collect();
        assert!(out.contains(&1) && !out.contains(&3));
    }

    #[test]
    fn processors_run_in_order_and_logprobs_are_post_processor() {
        // bias first: token 0 goes 1 → 3; repetition 2 then halves it → 1.5 and doubles
        // token 1's negative logit -1 → -2; presence 0.5 → 1.0 and -2.5; frequency 0.25 per
        // occurrence (token 0 twice, token 1 once) → 0.5 and -2.75. Token 2 is untouched: 0.
        let p = SamplingParams {
            logit_bias: vec![(0, 2.0)],
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            logprobs: true,
            top_logprobs: 2,
            ..params(0.0, 0)
        };
        let mut s = Sampler::new(p, vec![]).expect("valid");
        let mut logits = vec![1.0, -1.0, 0.0];
        let out = s.sample(&mut logits, &[0, 1, 0]);
        assert_eq!(logits, vec![0.5, -2.75, 0.0]);
        let lse = (0.5f64.exp() + (-2.75f64).exp() + 1.0).ln();
        assert_eq!(out.id, 0);
        let lp0 = out.logprob.expect("requested");
        assert!((lp0 as f64 - (0.5 - lse)).abs() < 1e-6);
        assert_eq!(out.top_logprobs.len(), 2);
        assert_eq!(out.top_logprobs[0].0, 0);
        assert_eq!(out.top_logprobs[1].0, 2);
        assert!((out.top_logprobs[1].1 as f64 - (0.0 - lse)).abs() < 1e-6);
    }

    #[test]
    fn logprobs_ignore_filters_and_temperature() {
        let probs = [0.5, 0.3, 0.2];
        let p = SamplingParams {
            top_k: 1,
            logprobs: true,
            ..params(0.3, 1)
        };
        let mut s = Sampler::new(p, vec![]).expect("valid");
        let out = s.sample(&mut ln(&probs), &[]);
        assert_eq!(out.id, 0);
        assert!((out.logprob.expect("requested") - 0.5f32.ln()).abs() < 1e-6);
        assert!(out.top_logprobs.is_empty());
    }

    #[test]
    fn penalty_windows() {
        // Window 1 sees only the last token (2); window 0 sees everything.
        let p = SamplingParams {
            presence_penalty: 1.0,
            presence_context_size: 1,
            ..params(0.0, 0)
        };
        let mut s = Sampler::new(p.clone(), vec![]).expect("valid");
        let mut l = vec![0.0; 3];
        s.sample(&mut l, &[0, 1, 2]);
        assert_eq!(l, vec![0.0, 0.0, -1.0]);
        let mut s = Sampler::new(
            SamplingParams {
                presence_context_size: 0,
                ..p
            },
            vec![],
        )
        .expect("valid");
        let mut l = vec![0.0; 3];
        s.sample(&mut l, &[0, 1, 2, 99]);
        assert_eq!(l, vec![-1.0, -1.0, -1.0]);
    }

    #[test]
    fn non_finite_logits_do_not_panic() {
        let p = SamplingParams {
            top_p: 0.9,
            min_p: 0.1,
            top_k: 3,
            xtc_probability: 1.0,
            xtc_threshold: 0.2,
            logprobs: true,
            top_logprobs: 3,
            ..params(0.7, 11)
        };
        let mut s = Sampler::new(p, vec![]).expect("valid");
        let cases: Vec<Vec<f32>> = vec![
            vec![f32::NAN; 4],
            vec![f32::NEG_INFINITY; 4],
            vec![f32::INFINITY, 1.0, f32::NAN, f32::INFINITY],
            vec![f32::MAX, f32::MAX, -f32::MAX, 0.0],
            vec![f32::NAN, 2.0, f32::NEG_INFINITY, 1.0],
            vec![],
        ];
        for mut c in cases {
            let out = s.sample(&mut c, &[0, 1, 2, 3, 1000]);
            assert!(out.id as usize <= c.len());
        }
        let out = s.sample(&mut [f32::INFINITY, 1.0, f32::NAN, f32::INFINITY], &[]);
        assert!(out.id == 0 || out.id == 3);
        let out = s.sample(&mut [f32::NAN, 2.0, f32::NEG_INFINITY, 1.0], &[]);
        assert!(out.id == 1 || out.id == 3);
    }

    #[test]
    fn validation_errors_name_the_field() {
        let bad = |p: SamplingParams| match Sampler::new(p, vec![]) {
            Err(SamplerError::InvalidParam(m)) => m,
            Ok(_) => panic!("accepted invalid params"),
        };
        let d = SamplingParams::default;
        assert_eq!(
            bad(SamplingParams { min_p: 1.5, ..d() }),
            "min_p must be in [0, 1]"
        );
        assert_eq!(
            bad(SamplingParams {
                top_p: f32::NAN,
                ..d()
            }),
            "top_p must be in [0, 1]"
        );
        assert!(
            bad(SamplingParams {
                temperature: -1.0,
                ..d()
            })
            .starts_with("temperature")
        );
        assert!(
            bad(SamplingParams {
                min_tokens_to_keep: 0,
                ..d()
            })
            .starts_with("min_tokens_to_keep")
        );
        assert_eq!(
            bad(SamplingParams {
                xtc_threshold: 0.6,
                ..d()
            }),
            "xtc_threshold must be in [0, 0.5]"
        );
        assert!(
            bad(SamplingParams {
                xtc_probability: 2.0,
                ..d()
            })
            .starts_with("xtc_probability")
        );
        assert!(
            bad(SamplingParams {
                repetition_penalty: -0.1,
                ..d()
            })
            .starts_with("repetition_penalty")
        );
        assert!(
            bad(SamplingParams {
                presence_penalty: f32::INFINITY,
                ..d()
            })
            .starts_with("presence_penalty")
        );
        assert!(
            bad(SamplingParams {
                frequency_penalty: f32::NAN,
                ..d()
            })
            .starts_with("frequency_penalty")
        );
        assert!(
            bad(SamplingParams {
                logit_bias: vec![(3, f32::NAN)],
                ..d()
            })
            .starts_with("logit_bias")
        );
        assert_eq!(
            bad(SamplingParams {
                top_logprobs: 12,
                ..d()
            }),
            "top_logprobs must be at most 11"
        );
        let p = SamplingParams {
            logit_bias: vec![(10, 1.0)],
            ..d()
        };
        assert!(p.validate().is_ok());
        assert!(p.validate_for_vocab(11).is_ok());
        assert!(p.validate_for_vocab(10).is_err());
    }

    #[test]
    fn params_deserialize_with_defaults() {
        let p: SamplingParams =
            serde_json::from_str(r#"{"temperature":0.7,"logit_bias":[[5,-1.0]]}"#)
                .expect("valid json");
        assert_eq!(p.temperature, 0.7);
        assert_eq!(p.logit_bias, vec![(5, -1.0)]);
        assert_eq!(p.repetition_context_size, 20);
        assert_eq!(p.min_tokens_to_keep, 1);
    }
}
