//! The recording backend runs the shared architectures exactly, and its LoRA gradients agree
//! with finite differences of the whole model's loss, on every tiny reference checkpoint.

mod common;

use kiln_train::loss::{Sequence, sft};
use kiln_train::optim::{AdamWConfig, Schedule};
use kiln_train::trainer::{Method, StepConfig, Trainer};

const FOLDERS: [&str; 4] = ["llama", "qwen2", "qwen3", "gemma3"];

fn trainer(folder: &str) -> Trainer {
    let (backend, model) = common::load(folder, common::plan(4, 2.0));
    let config = StepConfig {
        method: Method::Sft,
        adamw: AdamWConfig::default(),
        schedule: Schedule {
            peak: 1e-2,
            warmup: 0,
            total: 10,
            cosine: true,
        },
        grad_accumulation: 1,
        grad_clip_norm: 0.0,
    };
    Trainer::new(backend, model, config)
}

#[test]
fn the_forward_with_a_zero_adapter_matches_transformers() {
    for folder in FOLDERS {
        let t = trainer(folder);
        let tokens = common::inputs(folder);
        let logits = t
            .logits(
                &[Sequence {
                    tokens: &tokens,
                    prompt_len: 0,
                }],
                true,
                true,
            )
            .unwrap();
        let want = common::read_npy_f32(
            &common::reference_dir()
                .join("tiny")
                .join(folder)
                .join("logits.f32.npy"),
        );
        let diff = logits
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert_eq!(logits.len(), want.len());
        assert!(diff < 2e-4, "{folder}: max abs diff {diff}");
    }
}

fn loss_of(t: &Trainer, seqs: &[Sequence<'_>]) -> f64 {
    let vocab = t.model().config().vocab_size;
    sft(&t.logits(seqs, false, true).unwrap(), vocab, seqs)
        .unwrap()
        .loss
}

#[test]
fn lora_gradients_match_finite_differences_of_the_model() {
    for folder in FOLDERS {
        let mut t = trainer(folder);
        t.backend().with_params(|ps| {
            for (i, p) in ps.iter_mut().enumerate() {
                p.b.iter_mut()
                    .enumerate()
                    .for_each(|(j, b)| *b = ((i * 31 + j) as f32 * 0.37).sin() * 0.05);
            }
        });
        let tokens = common::inputs(folder);
        let (a, b) = (&tokens[..23], &tokens[23..]);
        let seqs = [
            Sequence {
                tokens: a,
                prompt_len: 6,
            },
            Sequence {
                tokens: b,
                prompt_len: 4,
            },
        ];
        t.accumulate(&seqs).unwrap();
        let grads: Vec<(Vec<f32>, Vec<f32>)> = t.backend().with_params(|ps| {
            ps.iter()
                .map(|p| (p.grad_a.clone(), p.grad_b.clone()))
                .collect()
        });
        let n_params = grads.len();
        for module in [0, n_params / 2, n_params - 1] {
            for (which, index) in [(0usize, 3usize), (0, 17), (1, 5), (1, 40)] {
                let analytic = if which == 0 {
                    grads[module].0[index]
                } else {
                    grads[module].1[index]
                } as f64;
                let h = 2e-2f32;
                let nudge = |d: f32| {
                    t.backend().with_params(|ps| {
                        let v = if which == 0 {
                            &mut ps[module].a
                        } else {
                            &mut ps[module].b
                        };
                        v[index] += d;
                    })
                };
                nudge(h);
                let plus = loss_of(&t, &seqs);
                nudge(-2.0 * h);
                let minus = loss_of(&t, &seqs);
                nudge(h);
                let numeric = (plus - minus) / (2.0 * h as f64);
                assert!(
                    (analytic - numeric).abs() <= 1e-3 + 0.03 * numeric.abs(),
                    "{folder} module {module} {} [{index}]: analytic {analytic}, numeric {numeric}",
                    ["A", "B"][which]
                );
            }
        }
    }
}

#[test]
fn sft_steps_lower_the_loss() {
    let mut t = trainer("llama");
    let tokens = common::inputs("llama");
    let seqs = [Sequence {
        tokens: &tokens,
        prompt_len: 10,
    }];
    let first = t.evaluate(&seqs).unwrap().loss;
    for _ in 0..5 {
        t.accumulate(&seqs).unwrap();
        t.optimizer_step();
    }
    let last = t.evaluate(&seqs).unwrap().loss;
    assert!(last < first - 0.1, "{first} -> {last}");
}

/// A rough step time on the starter model (the benchmark proper is `bench/train_compare.sh`).
#[test]
#[ignore = "needs the starter model; prints timings"]
fn starter_model_step_time() {
    let path = dirs_home().join(".cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let files = kiln_model::files::ModelFiles::open(&path).expect("open");
    let backend = kiln_train::TapeBackend::new(kiln_train::TapeOptions {
        plan: common::plan(8, 2.0),
        dense: std::env::var("DENSE").is_ok(),
    });
    let model = kiln_model::arch::Model::load(&backend, files.tensors(), files.config.clone())
        .expect("load");
    let config = StepConfig {
        method: Method::Sft,
        adamw: AdamWConfig::default(),
        schedule: Schedule {
            peak: 2e-4,
            warmup: 0,
            total: 10,
            cosine: true,
        },
        grad_accumulation: 1,
        grad_clip_norm: 1.0,
    };
    let mut t = Trainer::new(backend, model, config);
    let tokens: Vec<u32> = (0..512u32).map(|i| (i * 7919 + 13) % 49000 + 10).collect();
    let seqs = [Sequence {
        tokens: &tokens,
        prompt_len: 0,
    }];
    for i in 0..3 {
        let start = std::time::Instant::now();
        let s = t.accumulate(&seqs).unwrap();
        let mid = start.elapsed();
        t.optimizer_step();
        eprintln!("{:?}", kiln_train::profile::take());
        eprintln!(
            "step {i}: loss {:.4} fwd+bwd {:?} total {:?} → {:.1} tok/s",
            s.loss,
            mid,
            start.elapsed(),
            512.0 / start.elapsed().as_secs_f64()
        );
    }
}

fn dirs_home() -> std::path::PathBuf {
    std::path::PathBuf::from(std::env::var("HOME").unwrap_or_default())
}
