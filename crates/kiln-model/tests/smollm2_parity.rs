//! SmolLM2-135M-Instruct (Q4_1 GGUF) against transformers float32 on the same dequantized weights.

mod support;

use kiln_model::arch::{LogitsWanted, Model};
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_model::backend::{Backend, BatchLayout, KvLayout};
use kiln_model::files::ModelFiles;
use support::*;

fn greedy<B: Backend>(b: &B, model: &Model<B>, prompt: &[u32], n: usize) -> (Vec<f32>, Vec<u32>) {
    let cfg = model.config();
    let layout = KvLayout::for_model(cfg, 1, 256);
    let mut kv = b.new_kv(layout).expect("kv");
    let mut logits = model
        .forward(
            b,
            &mut kv,
            prompt,
            &BatchLayout::single(0, 0, prompt.len()),
            LogitsWanted::LastOfEach,
        )
        .expect("prefill");
    let first = logits.clone();
    let mut out = vec![];
    for i in 0..n {
        let next = argmax(&logits) as u32;
        out.push(next);
        if i + 1 < n {
            let pos = prompt.len() + i;
            logits = model
                .forward(
                    b,
                    &mut kv,
                    &[next],
                    &BatchLayout::single(0, pos, 1),
                    LogitsWanted::LastOfEach,
                )
                .expect("decode");
        }
    }
    (first, out)
}

#[test]
fn dense_path_matches_transformers_logits_and_greedy() {
    let files = ModelFiles::open(&starter_model()).expect("open");
    let backend = CpuBackend::new(CpuOptions { dense: true });
    let model = Model::load(&backend, files.tensors(), files.config.clone()).expect("load");
    let refdir = reference_dir().join("smollm2");
    let reference = read_json(&refdir.join("transformers_reference.json"));
    for case in ["chat_capital_france", "raw_quick_brown_fox"] {
        let c = &reference["cases"][case];
        let prompt = ids(&c["prompt_token_ids"]);
        let (_, want) = read_npy_f32(&refdir.join(format!("{case}.final_logits.f32.npy")));
        let (logits, tokens) = greedy(&backend, &model, &prompt, 40);
        let diff = max_abs_diff(&logits, &want);
        assert!(diff <= 1e-3, "{case}: final logits max abs diff {diff}");
        assert_eq!(
            tokens,
            ids(&c["greedy_40"]["ids"]),
            "{case}: greedy_40 differs"
        );
    }
}
