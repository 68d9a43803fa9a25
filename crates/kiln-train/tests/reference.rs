//! kiln's LoRA losses and gradients against PyTorch + PEFT on the tiny Llama: the values in
//! `data/lora_reference.safetensors` come from `scripts/lora_reference.py` (torch and PEFT are
//! not needed to run this test).

mod common;

use std::collections::HashMap;

use kiln_train::loss::{DpoKind, Sequence, SftScope};
use kiln_train::optim::{AdamWConfig, Schedule};
use kiln_train::trainer::{Method, StepConfig, Trainer};
use safetensors::{Dtype, SafeTensors};

struct Reference {
    f32s: HashMap<String, (Vec<usize>, Vec<f32>)>,
    f64s: HashMap<String, f64>,
    ints: HashMap<String, Vec<i64>>,
}

fn reference() -> Reference {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/lora_reference.safetensors");
    let bytes = std::fs::read(path).expect("reference file");
    let st = SafeTensors::deserialize(&bytes).expect("safetensors");
    let mut r = Reference {
        f32s: HashMap::new(),
        f64s: HashMap::new(),
        ints: HashMap::new(),
    };
    for (name, view) in st.tensors() {
        let data = view.data();
        match view.dtype() {
            Dtype::F32 => {
                let v = data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                r.f32s.insert(name, (view.shape().to_vec(), v));
            }
            Dtype::F64 => {
                let c: [u8; 8] = data[..8].try_into().expect("f64");
                r.f64s.insert(name, f64::from_le_bytes(c));
            }
            Dtype::I64 => {
                let v = data
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().expect("i64")))
                    .collect();
                r.ints.insert(name, v);
            }
            other => panic!("{name}: unexpected {other:?}"),
        }
    }
    r
}

/// `[rows, cols]` → `[cols, rows]`.
fn transpose(shape: &[usize], v: &[f32]) -> Vec<f32> {
    let (rows, cols) = (shape[0], shape[1]);
    let mut out = vec![0f32; v.len()];
    for i in 0..rows {
        for j in 0..cols {
            out[j * rows + i] = v[i * cols + j];
        }
    }
    out
}

fn trainer(method: Method, r: &Reference) -> Trainer {
    let (backend, model) = common::load("llama", common::plan(4, 2.0));
    backend.with_params(|ps| {
        for p in ps.iter_mut() {
            let (sa, a) = &r.f32s[&format!("init.{}.lora_A", p.path)];
            let (sb, b) = &r.f32s[&format!("init.{}.lora_B", p.path)];
            p.a = transpose(sa, a);
            p.b = transpose(sb, b);
        }
    });
    let config = StepConfig {
        method,
        adamw: AdamWConfig::default(),
        schedule: Schedule {
            peak: 1e-3,
            warmup: 0,
            total: 1,
            cosine: true,
        },
        grad_accumulation: 1,
        grad_clip_norm: 0.0,
    };
    Trainer::new(backend, model, config)
}

fn tokens(r: &Reference, name: &str) -> Vec<u32> {
    r.ints[&format!("tokens.{name}")]
        .iter()
        .map(|&t| t as u32)
        .collect()
}

/// Relative L2 error of each module's gradient and of the loss.
fn check(label: &str, method: Method, seqs: &[Sequence<'_>], r: &Reference) {
    let mut t = trainer(method, r);
    let stats = t.accumulate(seqs).expect("step");
    let want = r.f64s[&format!("{label}.loss")];
    assert!(
        (stats.loss - want).abs() <= 1e-4 * want.abs().max(1e-3),
        "{label}: loss {} vs torch {want}",
        stats.loss
    );
    let mut worst = 0f64;
    t.backend().with_params(|ps| {
        for p in ps.iter() {
            for (which, got) in [("lora_A", &p.grad_a), ("lora_B", &p.grad_b)] {
                let (shape, g) = &r.f32s[&format!("{label}.grad.{}.{which}", p.path)];
                let want = transpose(shape, g);
                let err: f64 = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| ((a - b) as f64).powi(2))
                    .sum::<f64>()
                    .sqrt();
                let norm: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum::<f64>().sqrt();
                let rel = err / norm.max(1e-12);
                worst = worst.max(rel);
                assert!(
                    rel <= 1e-4,
                    "{label} {} {which}: relative error {rel:e} (norm {norm:e})",
                    p.path
                );
            }
        }
    });
    eprintln!(
        "{label}: loss {:.8} (torch {want:.8}), worst relative gradient error {worst:.2e}",
        stats.loss
    );
}

#[test]
fn losses_and_gradients_match_pytorch_and_peft() {
    let r = reference();
    let pl = &r.ints["prompt_len"];
    let (s0, s1, s2) = (tokens(&r, "seq0"), tokens(&r, "seq1"), tokens(&r, "seq2"));
    let sft = [
        Sequence {
            tokens: &s0,
            prompt_len: pl[0] as usize,
        },
        Sequence {
            tokens: &s1,
            prompt_len: pl[1] as usize,
        },
    ];
    check("sft", Method::Sft, &sft, &r);
    let pair = [
        Sequence {
            tokens: &s0,
            prompt_len: pl[0] as usize,
        },
        Sequence {
            tokens: &s2,
            prompt_len: pl[2] as usize,
        },
    ];
    let dpo = |kind| Method::Dpo { beta: 0.1, kind };
    check(
        "dpo_sigmoid",
        dpo(DpoKind::Sigmoid {
            label_smoothing: 0.0,
        }),
        &pair,
        &r,
    );
    check(
        "dpo_smooth",
        dpo(DpoKind::Sigmoid {
            label_smoothing: 0.1,
        }),
        &pair,
        &r,
    );
    check("dpo_ipo", dpo(DpoKind::Ipo), &pair, &r);
    check(
        "orpo_full",
        Method::Orpo {
            lambda: 0.1,
            scope: SftScope::Full,
        },
        &pair,
        &r,
    );
    check(
        "orpo_response",
        Method::Orpo {
            lambda: 0.1,
            scope: SftScope::Response,
        },
        &pair,
        &r,
    );
}

#[test]
fn the_adapted_logits_match_peft() {
    let r = reference();
    let t = trainer(Method::Sft, &r);
    let s0 = tokens(&r, "seq0");
    let logits = t
        .logits(
            &[Sequence {
                tokens: &s0,
                prompt_len: 0,
            }],
            false,
            true,
        )
        .expect("forward");
    let (_, want) = &r.f32s["logits.seq0"];
    let diff = logits
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert_eq!(logits.len(), want.len());
    assert!(diff < 1e-4, "max abs logit diff {diff}");
}
