//! LoRA served beside the base weights (spec §8.4): a forward with an adapter stack equals the
//! forward of a model whose adapted matrices were merged densely, `W' = W + s·(A·B)ᵀ` (stacked
//! adapters: every delta added), on the naive reference backend and within tolerance on the CPU
//! backend; spans of one batch with different adapters each get their own.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use kiln_kernels::GgmlType;
use kiln_model::arch::{LAYER_MATRICES, LogitsWanted, Model};
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_model::backend::reference::ReferenceBackend;
use kiln_model::backend::{Backend, BatchLayout, HostTensor, KvLayout, SeqSpan};
use kiln_model::config::ModelConfig;
use kiln_model::files::ModelFiles;
use kiln_model::lora::{AdapterInfo, AdapterStack, LoraAdapter, LoraWeights, ServedAdapter};
use support::*;

struct Rng(u64);

impl Rng {
    /// Uniform in (-amp, amp).
    fn next(&mut self, amp: f32) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp
    }
}

/// Random A and B (big enough to move the logits) for the projections `which` of every layer.
fn adapter(cfg: &ModelConfig, which: &[&str], rank: usize, scale: f32, seed: u64) -> LoraAdapter {
    let mut rng = Rng(seed);
    let mut modules = BTreeMap::new();
    for layer in 0..cfg.num_layers {
        for m in which {
            let (n_in, n_out) = cfg.layer_matrix_shape(m).expect("a layer matrix");
            modules.insert(
                format!("model.layers.{layer}.{m}"),
                LoraWeights {
                    in_features: n_in,
                    out_features: n_out,
                    rank,
                    a: (0..n_in * rank).map(|_| rng.next(0.5)).collect(),
                    b: (0..rank * n_out).map(|_| rng.next(0.5)).collect(),
                    scale,
                },
            );
        }
    }
    LoraAdapter {
        modules,
        base_model: None,
        info: AdapterInfo {
            rank,
            scale,
            ..AdapterInfo::default()
        },
    }
}

fn served(id: &str, a: &LoraAdapter, cfg: &ModelConfig) -> Arc<ServedAdapter> {
    Arc::new(ServedAdapter::new(id, Path::new("/nowhere"), a.clone(), cfg).expect("served"))
}

/// The model with every module of `adapters` merged into its f32 weight.
fn merged<B: Backend>(b: &B, files: &ModelFiles, adapters: &[&LoraAdapter]) -> Model<B> {
    let cfg = files.config.clone();
    let mut model = Model::load(b, files.tensors(), cfg).expect("load");
    let mut names: Vec<&String> = adapters.iter().flat_map(|a| a.modules.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        let weight = format!("{name}.weight");
        let t = files
            .tensors()
            .tensor(&weight)
            .expect("read")
            .expect("present");
        let (rows, cols) = (t.rows, t.cols);
        let mut w = t.to_f32().expect("f32");
        for a in adapters {
            let Some(m) = a.modules.get(name) else {
                continue;
            };
            assert_eq!((m.out_features, m.in_features), (rows, cols));
            for o in 0..rows {
                for i in 0..cols {
                    let d: f64 = (0..m.rank)
                        .map(|j| m.a[i * m.rank + j] as f64 * m.b[j * rows + o] as f64)
                        .sum();
                    w[o * cols + i] += (m.scale as f64 * d) as f32;
                }
            }
        }
        let bytes = w
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into();
        let t = HostTensor {
            ty: GgmlType::F32,
            rows,
            cols,
            bytes,
        };
        let m = b
            .matrix(&weight, kiln_model::backend::MatrixRole::Projection, t)
            .expect("matrix");
        model.replace_matrix(&weight, m).expect("replace");
    }
    model
}

fn logits_all<B: Backend>(
    b: &B,
    model: &Model<B>,
    tokens: &[u32],
    stack: Option<&AdapterStack>,
) -> Vec<f32> {
    let cfg = model.config();
    let mut kv = b.new_kv(KvLayout::for_model(cfg, 1, 128)).expect("kv");
    model
        .forward_with(
            b,
            &mut kv,
            tokens,
            &BatchLayout::single(0, 0, tokens.len()),
            LogitsWanted::All,
            &[stack],
        )
        .expect("forward")
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 3) % vocab) as u32).collect()
}

#[test]
fn deltas_equal_a_dense_merged_weight_on_every_architecture() {
    for arch in ["llama", "qwen2", "gemma3"] {
        let dir = reference_dir().join("tiny").join(arch);
        let files = ModelFiles::open(&dir).expect("open");
        let cfg = files.config.clone();
        let all = adapter(&cfg, &LAYER_MATRICES, 4, 0.75, 11);
        let some = adapter(&cfg, &["self_attn.q_proj", "mlp.down_proj"], 3, 2.0, 23);
        let ids = tokens(24, cfg.vocab_size);
        let stack_a = AdapterStack::new(vec![served("a", &all, &cfg)]);
        let stack_ab = AdapterStack::new(vec![served("a", &all, &cfg), served("b", &some, &cfg)]);

        let r = ReferenceBackend;
        let base = Model::load(&r, files.tensors(), cfg.clone()).expect("load");
        let plain = logits_all(&r, &base, &ids, None);
        for (stack, adapters) in [(&stack_a, vec![&all]), (&stack_ab, vec![&all, &some])] {
            let want = logits_all(&r, &merged(&r, &files, &adapters), &ids, None);
            let got = logits_all(&r, &base, &ids, Some(stack));
            let moved = max_diff(&want, &plain);
            assert!(
                moved > 0.1,
                "{arch} {}: the adapter barely moves the logits ({moved})",
                stack.key()
            );
            let d = max_diff(&got, &want);
            assert!(d < 1e-4, "{arch} {} reference: {d}", stack.key());

            let cpu = CpuBackend::new(CpuOptions { dense: false });
            let cpu_base = Model::load(&cpu, files.tensors(), cfg.clone()).expect("load");
            let got = logits_all(&cpu, &cpu_base, &ids, Some(stack));
            let d = max_diff(&got, &want);
            assert!(d < 1e-3, "{arch} {} cpu: {d}", stack.key());
        }
        // An empty stack and no stack are the base model.
        let empty = AdapterStack::new(vec![]);
        assert_eq!(logits_all(&r, &base, &ids, Some(&empty)), plain);
    }
}

/// Two sequences in one forward, one with an adapter and one without (and the other way
/// round), each get exactly the logits they get alone.
#[test]
fn spans_of_one_batch_get_their_own_adapters() {
    let dir = reference_dir().join("tiny").join("llama");
    let files = ModelFiles::open(&dir).expect("open");
    let cfg = files.config.clone();
    let a = AdapterStack::new(vec![served(
        "a",
        &adapter(&cfg, &LAYER_MATRICES, 4, 1.0, 5),
        &cfg,
    )]);
    let b = AdapterStack::new(vec![served(
        "b",
        &adapter(&cfg, &LAYER_MATRICES, 2, 1.0, 9),
        &cfg,
    )]);
    let cpu = CpuBackend::new(CpuOptions { dense: false });
    let model = Model::load(&cpu, files.tensors(), cfg.clone()).expect("load");
    let (p, q) = (tokens(11, cfg.vocab_size), tokens(7, cfg.vocab_size - 1));
    let alone = |ids: &[u32], s: Option<&AdapterStack>| {
        let mut kv = cpu.new_kv(KvLayout::for_model(&cfg, 1, 64)).expect("kv");
        model
            .forward_with(
                &cpu,
                &mut kv,
                ids,
                &BatchLayout::single(0, 0, ids.len()),
                LogitsWanted::LastOfEach,
                &[s],
            )
            .expect("alone")
    };
    for (sp, sq) in [
        (Some(&a), None),
        (None, Some(&b)),
        (Some(&a), Some(&b)),
        (Some(&a), Some(&a)),
    ] {
        let mut kv = cpu.new_kv(KvLayout::for_model(&cfg, 2, 64)).expect("kv");
        let layout = BatchLayout {
            spans: vec![
                SeqSpan {
                    slot: 0,
                    start_pos: 0,
                    n_tokens: p.len(),
                },
                SeqSpan {
                    slot: 1,
                    start_pos: 0,
                    n_tokens: q.len(),
                },
            ],
        };
        let both: Vec<u32> = p.iter().chain(&q).copied().collect();
        let got = model
            .forward_with(
                &cpu,
                &mut kv,
                &both,
                &layout,
                LogitsWanted::LastOfEach,
                &[sp, sq],
            )
            .expect("batch");
        let v = cfg.vocab_size;
        assert_eq!(got[..v], alone(&p, sp)[..], "first span");
        assert_eq!(got[v..], alone(&q, sq)[..], "second span");
    }
    // One stack per span, or none at all.
    let mut kv = cpu.new_kv(KvLayout::for_model(&cfg, 1, 64)).expect("kv");
    let err = model
        .forward_with(
            &cpu,
            &mut kv,
            &p,
            &BatchLayout::single(0, 0, p.len()),
            LogitsWanted::LastOfEach,
            &[Some(&a), None],
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("2 adapter stacks given for 1 spans"),
        "{err}"
    );
}

/// An adapter made for another shape, or with an id that cannot be one, is refused whole.
#[test]
fn an_adapter_checked_against_another_model_is_refused() {
    let dir = reference_dir().join("tiny").join("llama");
    let files = ModelFiles::open(&dir).expect("open");
    let cfg = files.config.clone();
    let mut other = cfg.clone();
    other.hidden_size *= 2;
    let a = adapter(&other, &["self_attn.q_proj"], 4, 1.0, 1);
    let err = ServedAdapter::new("a", Path::new("/x"), a, &cfg).unwrap_err();
    assert!(err.to_string().contains("self_attn.q_proj"), "{err}");
    let bad = ServedAdapter::new(
        "a+b",
        Path::new("/x"),
        adapter(&cfg, &["mlp.up_proj"], 2, 1.0, 2),
        &cfg,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("q_proj") && bad.to_string().contains("'+'"),
        "{bad}"
    );
}

/// Time of one decoded token's deltas (every module of an adapter, one row each), without the
/// base model: `KILN_LORA_DIR=<adapter> KILN_LORA_MODEL=<gguf> cargo test -p kiln-model --test
/// lora_forward decode_delta_time -- --ignored --nocapture`.
#[test]
#[ignore = "timing"]
fn decode_delta_time() {
    use kiln_model::backend::HostAct;
    let (Ok(dir), Ok(model)) = (
        std::env::var("KILN_LORA_DIR"),
        std::env::var("KILN_LORA_MODEL"),
    ) else {
        panic!("set KILN_LORA_DIR and KILN_LORA_MODEL");
    };
    let files = ModelFiles::open(Path::new(&model)).expect("model");
    let cfg = files.config.clone();
    let a = ServedAdapter::load("a", Path::new(&dir), &cfg).expect("adapter");
    let cpu = CpuBackend::new(CpuOptions { dense: false });
    let mut inputs = Vec::new();
    for layer in 0..cfg.num_layers {
        for m in 0..LAYER_MATRICES.len() {
            let w = a.module(layer, m).expect("module");
            inputs.push((
                HostAct {
                    data: vec![0.1; w.in_features],
                    rows: 1,
                    cols: w.in_features,
                },
                HostAct::zeros(1, w.out_features),
            ));
        }
    }
    // The same modules as the loader leaves them: one heap allocation each.
    let loose = LoraAdapter::load(Path::new(&dir)).expect("adapter");
    let loose: Vec<&LoraWeights> = (0..cfg.num_layers)
        .flat_map(|l| {
            LAYER_MATRICES
                .iter()
                .map(move |m| format!("model.layers.{l}.{m}"))
        })
        .map(|name| &loose.modules[&name])
        .collect();
    // A buffer as big as the base weights, read between tokens, evicts the adapter as decode does.
    let evict = vec![1u8; 128 << 20];
    for pass in 0..3 {
        let reps = 50;
        let mut total = std::time::Duration::ZERO;
        for _ in 0..reps {
            if pass > 0 {
                std::hint::black_box(evict.iter().map(|&b| b as u64).sum::<u64>());
            }
            let t = std::time::Instant::now();
            let mut k = 0;
            for layer in 0..cfg.num_layers {
                for m in 0..LAYER_MATRICES.len() {
                    let w = match pass {
                        2 => loose[k].view(),
                        _ => a.module(layer, m).unwrap(),
                    };
                    let (x, y) = &mut inputs[k];
                    cpu.lora_add(y, x, 0..1, &w).unwrap();
                    k += 1;
                }
            }
            total += t.elapsed();
        }
        eprintln!(
            "{}: {:.3} ms per token ({} modules, {:.1} MB)",
            [
                "in cache",
                "after eviction",
                "after eviction, one allocation per module"
            ][pass],
            total.as_secs_f64() * 1e3 / reps as f64,
            a.mounted_layers(),
            a.size_bytes() as f64 / 1e6
        );
    }
}
