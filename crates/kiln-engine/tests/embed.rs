//! Embeddings against sentence-transformers: the tiny random checkpoints and what
//! sentence-transformers made of them (`tests/data/embed/`, written by `make_reference.py`
//! there), on the CPU backend and the naive reference backend, one input at a time and batched.

use std::path::PathBuf;

use kiln_engine::embed::normalize;
use kiln_engine::kv_scheme::{DenseDtype, KvScheme};
use kiln_engine::{Engine, EngineOptions, load_model};
use kiln_model::backend::Backend;
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_model::backend::reference::ReferenceBackend;
use serde_json::Value;

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/embed")
}

fn expected(name: &str) -> Vec<(Vec<u32>, Vec<f32>, String)> {
    let text = std::fs::read_to_string(data().join("expected.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v[name]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let ids = e["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            let emb = e["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            (ids, emb, e["text"].as_str().unwrap().to_string())
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let n = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn engine<B: Backend>(backend: B, name: &str, slots: usize, kv: KvScheme) -> Engine<B> {
    let model = load_model(&backend, &data().join(name)).expect("load");
    let options = EngineOptions {
        context_len: 128,
        prefill_chunk: 64,
        slots,
        batch_tokens: 64,
        kv_scheme: kv,
        ..EngineOptions::default()
    };
    Engine::new(backend, model, options).expect("engine")
}

fn check<B: Backend>(mut e: Engine<B>, name: &str) {
    let mut want = expected(name);
    assert!(e.is_embedding_model());
    let normalized = e.model().embedding.as_ref().unwrap().normalize;
    if normalized {
        // A GGUF normalizes every embedding (llama.cpp has no flag for it); so does the reference.
        for (_, reference, _) in &mut want {
            normalize(reference, 2);
        }
    }
    let ids: Vec<Vec<u32>> = want
        .iter()
        .map(|(ids, _, text)| {
            let got = e.model().tokenizer.encode(text, true).unwrap();
            assert_eq!(&got, ids, "{name}: tokens of {text:?}");
            got
        })
        .collect();
    let batched = e.embed(&ids).unwrap();
    for (i, (_, reference, text)) in want.iter().enumerate() {
        let mut one = e.embed(std::slice::from_ref(&ids[i])).unwrap().remove(0);
        let mut b = batched[i].clone();
        if normalized {
            normalize(&mut one, 2);
            normalize(&mut b, 2);
        }
        let c = cosine(&one, reference);
        assert!(c >= 0.9999, "{name}: cosine {c} for {text:?}");
        assert!(
            cosine(&one, &b) >= 0.99999,
            "{name}: batched differs for {text:?}"
        );
        let max_err = one
            .iter()
            .zip(reference)
            .map(|(a, r)| (a - r).abs())
            .fold(0f32, f32::max);
        assert!(max_err < 2e-3, "{name}: max error {max_err} for {text:?}");
    }
}

#[test]
fn qwen3_last_token_matches_sentence_transformers_on_the_cpu_backend() {
    let cpu = CpuBackend::new(CpuOptions { dense: false });
    check(
        engine(cpu, "qwen3-last", 2, KvScheme::dense(DenseDtype::default())),
        "qwen3-last",
    );
}

#[test]
fn qwen3_last_token_matches_sentence_transformers_on_the_reference_backend() {
    let reference = ReferenceBackend;
    check(
        engine(reference, "qwen3-last", 3, KvScheme::dense(DenseDtype::F32)),
        "qwen3-last",
    );
}

#[test]
fn an_embedding_model_refuses_generation_and_bad_inputs() {
    let cpu = CpuBackend::new(CpuOptions { dense: false });
    let mut e = engine(cpu, "qwen3-last", 2, KvScheme::dense(DenseDtype::default()));
    assert!(e.embed(&[vec![]]).is_err());
    assert!(e.embed(&[vec![1; 129]]).is_err());
    assert!(e.embed(&[]).unwrap().is_empty());
}

#[test]
fn qwen3_mean_pooling_unnormalized_matches_sentence_transformers() {
    let cpu = CpuBackend::new(CpuOptions { dense: false });
    let e = engine(cpu, "qwen3-mean", 2, KvScheme::dense(DenseDtype::default()));
    assert!(!e.model().embedding.as_ref().unwrap().normalize);
    check(e, "qwen3-mean");
}

#[test]
fn bert_cls_pooling_matches_sentence_transformers_on_both_backends() {
    let cpu = CpuBackend::new(CpuOptions { dense: false });
    check(
        engine(cpu, "bert-cls", 2, KvScheme::dense(DenseDtype::default())),
        "bert-cls",
    );
    check(
        engine(
            ReferenceBackend,
            "bert-cls",
            3,
            KvScheme::dense(DenseDtype::F32),
        ),
        "bert-cls",
    );
}

#[test]
fn bert_mean_pooling_matches_sentence_transformers() {
    let cpu = CpuBackend::new(CpuOptions { dense: false });
    check(
        engine(cpu, "bert-mean", 2, KvScheme::dense(DenseDtype::default())),
        "bert-mean",
    );
}

#[test]
fn bert_ggufs_written_by_llama_cpp_embed_as_sentence_transformers_does() {
    for (file, reference) in [
        ("bert-cls.gguf", "bert-cls"),
        ("bert-mean.gguf", "bert-mean"),
    ] {
        let cpu = CpuBackend::new(CpuOptions { dense: false });
        check(
            engine(cpu, file, 2, KvScheme::dense(DenseDtype::default())),
            reference,
        );
    }
    check(
        engine(
            ReferenceBackend,
            "bert-cls.gguf",
            3,
            KvScheme::dense(DenseDtype::F32),
        ),
        "bert-cls",
    );
}

#[test]
fn nomic_bert_in_nomics_layout_and_as_llama_cpp_converts_it_matches_sentence_transformers() {
    for model in ["nomic-mean", "nomic-mean.gguf"] {
        let cpu = CpuBackend::new(CpuOptions { dense: false });
        check(
            engine(cpu, model, 2, KvScheme::dense(DenseDtype::default())),
            "nomic-mean",
        );
    }
    check(
        engine(
            ReferenceBackend,
            "nomic-mean",
            3,
            KvScheme::dense(DenseDtype::F32),
        ),
        "nomic-mean",
    );
}

#[test]
fn embedding_gemma_bidirectional_with_dense_modules_matches_sentence_transformers() {
    let cpu = CpuBackend::new(CpuOptions { dense: false });
    check(
        engine(
            cpu,
            "gemma-embed",
            2,
            KvScheme::dense(DenseDtype::default()),
        ),
        "gemma-embed",
    );
    // As llama.cpp's converter writes it (`gemma-embedding`, Dense modules as dense_2/dense_3).
    let cpu = CpuBackend::new(CpuOptions { dense: false });
    check(
        engine(
            cpu,
            "gemma-embed.gguf",
            2,
            KvScheme::dense(DenseDtype::default()),
        ),
        "gemma-embed",
    );
    check(
        engine(
            ReferenceBackend,
            "gemma-embed",
            3,
            KvScheme::dense(DenseDtype::F32),
        ),
        "gemma-embed",
    );
}

#[test]
fn a_bert_cross_encoder_scores_pairs_as_transformers_does() {
    check_reranker("bert-rerank", "bert-rerank");
}

#[test]
fn a_bert_reranker_gguf_scores_pairs_by_its_classifier() {
    check_reranker("bert-rerank.gguf", "bert-rerank-gguf");
}

#[test]
fn an_xlm_roberta_cross_encoder_scores_pairs_as_transformers_does() {
    check_reranker("xlmr-rerank", "xlmr-rerank");
}

#[test]
fn an_xlm_roberta_reranker_gguf_tokenizes_and_scores_as_transformers_does() {
    // llama.cpp keeps RoBERTa's classifier.dense (as `cls`) and drops the padding rows of the
    // position table, so the file scores as the folder does.
    check_reranker("xlmr-rerank.gguf", "xlmr-rerank");
}

fn check_reranker(model: &str, reference: &str) {
    let text = std::fs::read_to_string(data().join("expected.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let rows = v[reference].as_array().unwrap();
    let ids = |key: &str| -> Vec<Vec<u32>> {
        rows.iter()
            .map(|r| {
                r[key]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as u32)
                    .collect()
            })
            .collect()
    };
    let (inputs, types) = (ids("ids"), ids("type_ids"));
    let want: Vec<f32> = rows
        .iter()
        .map(|r| r["score"].as_f64().unwrap() as f32)
        .collect();
    for backend_is_cpu in [true, false] {
        let scores = if backend_is_cpu {
            let cpu = CpuBackend::new(CpuOptions { dense: false });
            let mut e = engine(cpu, model, 2, KvScheme::dense(DenseDtype::default()));
            // The pair is tokenized as transformers does it: ids and token types.
            let enc = e
                .model()
                .tokenizer
                .inner()
                .encode(
                    (
                        rows[0]["query"].as_str().unwrap(),
                        rows[0]["document"].as_str().unwrap(),
                    ),
                    true,
                )
                .unwrap();
            assert_eq!(enc.get_ids(), &inputs[0][..]);
            assert_eq!(enc.get_type_ids(), &types[0][..]);
            e.embed_typed(&inputs, Some(&types)).unwrap()
        } else {
            let mut e = engine(ReferenceBackend, model, 3, KvScheme::dense(DenseDtype::F32));
            e.embed_typed(&inputs, Some(&types)).unwrap()
        };
        let got: Vec<f32> = scores.iter().map(|s| s[0]).collect();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 2e-3, "score {g} against {w}");
        }
        let order = |s: &[f32]| {
            let mut i: Vec<usize> = (0..s.len()).collect();
            i.sort_by(|&a, &b| s[b].total_cmp(&s[a]));
            i
        };
        assert_eq!(order(&got), order(&want));
    }
}
