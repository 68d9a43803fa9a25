//! The quantized path (Q4_1 and Q8_0 kernels with 8-bit activations, no dequantize-to-f32 on
//! the hot path) against the dense path, teacher-forced over `kl_text.txt`. The bar is what
//! llama.cpp measures on the same file: mean KL <= 0.0028 nats, top-1 agreement >= 96.5%.

mod support;

use kiln_model::arch::{LogitsWanted, Model};
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_model::backend::{Backend, BatchLayout, KvLayout};
use kiln_model::files::ModelFiles;
use kiln_model::tokenizer::tokenizer_from_gguf;
use support::*;

fn all_logits(dense: bool, files: &ModelFiles, tokens: &[u32]) -> Vec<f32> {
    let backend = CpuBackend::new(CpuOptions { dense });
    let model = Model::load(&backend, files.tensors(), files.config.clone()).expect("load");
    let cfg = model.config();
    let layout = KvLayout::for_model(cfg, 1, 2048);
    let mut kv = backend.new_kv(layout).expect("kv");
    let mut out = vec![];
    for (i, chunk) in tokens.chunks(512).enumerate() {
        let batch = BatchLayout::single(0, i * 512, chunk.len());
        out.extend(
            model
                .forward(&backend, &mut kv, chunk, &batch, LogitsWanted::All)
                .expect("forward"),
        );
    }
    out
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let max = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    x.iter().map(|&v| v as f64 - lse).collect()
}

#[test]
fn q4_1_path_is_within_llama_cpp_accuracy_of_the_dense_path() {
    let path = starter_model();
    let files = ModelFiles::open(&path).expect("open");
    let tok = tokenizer_from_gguf(files.gguf().expect("gguf").header()).expect("tokenizer");
    let text =
        std::fs::read_to_string(reference_dir().join("smollm2/kl_text.txt")).expect("kl_text");
    let tokens = tok.encode(&text, false).expect("encode");
    assert_eq!(
        tokens.len(),
        1057,
        "kl_text.txt tokenizes to 1057 tokens in transformers and llama.cpp"
    );

    let dense = all_logits(true, &files, &tokens);
    let quant = all_logits(false, &files, &tokens);
    let vocab = files.config.vocab_size;
    let positions = tokens.len() - 1;
    let (mut kl_sum, mut agree, mut kl_max) = (0f64, 0usize, 0f64);
    for p in 0..positions {
        let (d, q) = (
            &dense[p * vocab..(p + 1) * vocab],
            &quant[p * vocab..(p + 1) * vocab],
        );
        let (ld, lq) = (log_softmax(d), log_softmax(q));
        let kl: f64 = ld.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum();
        kl_sum += kl;
        kl_max = kl_max.max(kl);
        if argmax(d) == argmax(q) {
            agree += 1;
        }
    }
    let mean_kl = kl_sum / positions as f64;
    let top1 = agree as f64 / positions as f64;
    eprintln!(
        "quantized vs dense over {positions} positions: mean KL {mean_kl:.5}, max {kl_max:.4}, top-1 {agree}/{positions} = {:.2}%",
        top1 * 100.0
    );
    assert!(mean_kl <= 0.0028, "mean KL {mean_kl} > 0.0028");
    assert!(top1 >= 0.965, "top-1 agreement {top1} < 96.5%");
}
