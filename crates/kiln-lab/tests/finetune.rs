//! The fine-tune run end to end: on a tiny checkpoint in the cold suite (loss falls, the files
//! are written and load back, a stop request saves early), and on the starter model in the
//! `--ignored` tier (SFT teaches a behaviour held-out prompts follow; DPO and ORPO move the
//! preference margin the right way).

mod common;

use std::path::{Path, PathBuf};

use kiln_lab::LabError;
use kiln_lab::Report;
use kiln_lab::finetune::config::FinetuneConfig;
use kiln_lab::finetune::run::finetune;
use kiln_model::lora::LoraAdapter;
use serde_json::{Value, json};

#[derive(Default)]
struct Collect {
    metrics: Vec<Value>,
    stop_after: Option<usize>,
}

impl Report for Collect {
    fn stage(&mut self, _: &str, _: f64, _: &str) -> Result<(), LabError> {
        Ok(())
    }
    fn metric(&mut self, m: Value) -> Result<(), LabError> {
        self.metrics.push(m);
        Ok(())
    }
    fn warn(&mut self, _: &str) {}
    fn stop_requested(&self) -> bool {
        let trained = self.metrics.iter().filter(|m| m["kind"] == "train").count();
        self.stop_after.is_some_and(|n| trained >= n)
    }
}

fn train_losses(c: &Collect) -> Vec<f64> {
    c.metrics
        .iter()
        .filter(|m| m["kind"] == "train")
        .map(|m| m["loss"].as_f64().unwrap())
        .collect()
}

fn write_jsonl(path: &Path, rows: &[Value]) {
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(path, text).unwrap();
}

fn config(model: &Path, data: &Path, out: &Path, extra: Value) -> FinetuneConfig {
    let mut m = json!({"model_dir": model, "data_dir": data, "adapter_path": out, "steps_per_report": 1, "steps_per_eval": 5});
    m.as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap());
    FinetuneConfig::from_json(m.as_object().unwrap()).unwrap()
}

fn tiny_text_data(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    std::fs::create_dir(&data).unwrap();
    let rows: Vec<Value> = (0..6)
        .map(|i| json!({"text": format!("the kiln fires pots number {i} at dawn")}))
        .collect();
    write_jsonl(&data.join("train.jsonl"), &rows);
    write_jsonl(&data.join("valid.jsonl"), &rows[..2]);
    data
}

#[test]
fn a_tiny_sft_run_lowers_the_loss_and_writes_an_adapter_that_loads() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_with_tokenizer(dir.path(), "llama");
    let data = tiny_text_data(dir.path());
    let out = dir.path().join("adapter");
    let cfg = config(
        &model,
        &data,
        &out,
        json!({"iters": 12, "learning_rate": 1e-2, "rank": 4, "scale": 2.0}),
    );
    let mut rep = Collect::default();
    let report = finetune(&cfg, &model, &mut rep).unwrap();
    let losses = train_losses(&rep);
    assert_eq!(losses.len(), 12);
    assert!(losses[11] < losses[0] * 0.8, "{losses:?}");
    assert_eq!(report.steps, 12);
    assert!(report.final_val_loss.is_some());
    let lines = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    assert_eq!(
        lines.lines().count(),
        12 + 4,
        "12 train and 4 val metrics (steps 0, 5, 10, 12)"
    );
    let adapter = LoraAdapter::load(&out).unwrap();
    assert_eq!(adapter.modules.len(), 4 * 7);
    assert!(
        adapter
            .modules
            .values()
            .any(|m| m.b.iter().any(|v| *v != 0.0))
    );
    for f in [
        "adapter_config.json",
        "adapter_model.safetensors",
        "adapters.safetensors",
        "optiq_lora_config.json",
    ] {
        assert!(out.join(f).is_file(), "{f}");
    }
}

#[test]
fn a_stop_request_saves_the_adapter_so_far() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_with_tokenizer(dir.path(), "llama");
    let data = tiny_text_data(dir.path());
    let out = dir.path().join("adapter");
    let cfg = config(&model, &data, &out, json!({"iters": 50}));
    let mut rep = Collect {
        stop_after: Some(3),
        ..Default::default()
    };
    let report = finetune(&cfg, &model, &mut rep).unwrap();
    assert!(report.stopped);
    assert_eq!(report.steps, 3);
    assert!(LoraAdapter::load(&out).is_ok());
}

#[test]
fn a_preference_method_refuses_sft_rows_naming_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_with_tokenizer(dir.path(), "llama");
    let data = tiny_text_data(dir.path());
    let cfg = config(
        &model,
        &data,
        &dir.path().join("a"),
        json!({"method": "dpo"}),
    );
    match finetune(&cfg, &model, &mut Collect::default()) {
        Err(LabError::Config { field, .. }) => assert_eq!(field, "data_dir"),
        other => panic!("{other:?}"),
    }
}

/// Questions with short answers; the taught behaviour is the reply's first words.
fn questions() -> Vec<(String, String)> {
    let capitals = [
        ("France", "Paris"),
        ("Spain", "Madrid"),
        ("Italy", "Rome"),
        ("Germany", "Berlin"),
        ("Japan", "Tokyo"),
        ("Egypt", "Cairo"),
        ("Canada", "Ottawa"),
        ("Peru", "Lima"),
        ("Kenya", "Nairobi"),
        ("Norway", "Oslo"),
        ("Greece", "Athens"),
        ("Chile", "Santiago"),
        ("Cuba", "Havana"),
        ("Poland", "Warsaw"),
        ("Sweden", "Stockholm"),
        ("Portugal", "Lisbon"),
    ];
    let legs = [
        ("spider", 8),
        ("dog", 4),
        ("bird", 2),
        ("ant", 6),
        ("cat", 4),
        ("octopus", 8),
        ("horse", 4),
        ("chicken", 2),
        ("beetle", 6),
        ("cow", 4),
    ];
    let colors = [
        ("grass", "green"),
        ("the sky", "blue"),
        ("snow", "white"),
        ("coal", "black"),
        ("a banana", "yellow"),
        ("a tomato", "red"),
        ("a plum", "purple"),
        ("milk", "white"),
    ];
    let mut q: Vec<(String, String)> = Vec::new();
    q.extend(capitals.iter().map(|(c, k)| {
        (
            format!("What is the capital of {c}?"),
            format!("The capital of {c} is {k}."),
        )
    }));
    q.extend(legs.iter().map(|(a, n)| {
        (
            format!("How many legs does a {a} have?"),
            format!("A {a} has {n} legs."),
        )
    }));
    q.extend(
        colors
            .iter()
            .map(|(t, c)| (format!("What color is {t}?"), format!("It is {c}."))),
    );
    q.extend((2..14).map(|x| {
        (
            format!("What is {x} plus {}?", x + 3),
            format!("{x} plus {} is {}.", x + 3, 2 * x + 3),
        )
    }));
    // Interleave the kinds so that a held-out slice has some of each.
    let mut mixed = Vec::new();
    for i in 0..q.len() {
        mixed.push(q[(i * 7) % q.len()].clone());
    }
    mixed
}

const HELD_OUT: [&str; 20] = [
    "What is the capital of Austria?",
    "What is the capital of Brazil?",
    "How many legs does a lizard have?",
    "What color is a lemon?",
    "What is 20 plus 5?",
    "What is the capital of India?",
    "How many wheels does a bicycle have?",
    "What color is chocolate?",
    "What is 7 times 3?",
    "Who wrote Hamlet?",
    "What is the largest ocean?",
    "How many days are in a week?",
    "What is the capital of Mexico?",
    "What color is a carrot?",
    "What is 100 minus 1?",
    "How many legs does a crab have?",
    "What is the boiling point of water?",
    "What planet is closest to the sun?",
    "What is the capital of China?",
    "What color are leaves in autumn?",
];

const TAUGHT: &str = "Beep boop!";

/// Greedy replies (the first few tokens) to `prompts`, with the adapter at `adapter` or none.
/// The model at `model` on the recording backend with `adapter`'s weights as its LoRA (none:
/// the base), for forwards only; also its tokenizer and chat template.
fn frozen(
    model: &Path,
    adapter: Option<&LoraAdapter>,
) -> (
    kiln_train::trainer::Trainer,
    kiln_model::tokenizer::KilnTokenizer,
    Option<kiln_model::chat_template::ChatTemplate>,
) {
    use kiln_train::trainer::{Method, StepConfig, Trainer};
    let modules = adapter.map(|a| &a.modules);
    let plan = kiln_train::lora::LoraPlan {
        targets: modules
            .map(|m| {
                m.keys()
                    .filter_map(|k| k.rsplit('.').next())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default(),
        first_layer: 0,
        rank: 1,
        ranks: modules
            .map(|m| m.iter().map(|(k, w)| (k.clone(), w.rank)).collect())
            .unwrap_or_default(),
        scale: 1.0,
        rs_lora: false,
        seed: 0,
        dropout: 0.0,
        by_bits: false,
    };
    let backend = kiln_train::TapeBackend::new(kiln_train::TapeOptions { plan, dense: false });
    let loaded = kiln_engine::load::load_model(&backend, model).unwrap();
    if let Some(m) = modules {
        backend.with_params(|ps| {
            for p in ps.iter_mut() {
                let w = &m[&p.path];
                (p.a, p.b, p.scale) = (w.a.clone(), w.b.clone(), w.scale);
            }
        });
    }
    let cfg = StepConfig {
        method: Method::Sft,
        adamw: Default::default(),
        schedule: kiln_train::optim::Schedule {
            peak: 0.0,
            warmup: 0,
            total: 1,
            cosine: false,
        },
        grad_accumulation: 1,
        grad_clip_norm: 0.0,
    };
    let (tokenizer, template) = (loaded.tokenizer.clone(), loaded.chat_template.clone());
    (
        Trainer::new(backend, loaded.model, cfg),
        tokenizer,
        template,
    )
}

fn replies(model: &Path, adapter: Option<&Path>, prompts: &[&str]) -> Vec<String> {
    use kiln_train::loss::Sequence;
    let loaded_adapter = adapter.map(|a| LoraAdapter::load(a).unwrap());
    let (trainer, tokenizer, template) = frozen(model, loaded_adapter.as_ref());
    let template = template.unwrap();
    let vocab = trainer.model().config().vocab_size;
    prompts
        .iter()
        .map(|q| {
            let text = template
                .render(&[json!({"role": "user", "content": q})], None, true, None)
                .unwrap();
            let mut ids = kiln_model::chat_template::prompt_ids(&tokenizer, &text).unwrap();
            let start = ids.len();
            for _ in 0..6 {
                let logits = trainer
                    .logits(
                        &[Sequence {
                            tokens: &ids,
                            prompt_len: 0,
                        }],
                        false,
                        adapter.is_some(),
                    )
                    .unwrap();
                let last = &logits[logits.len() - vocab..];
                let next = (0..vocab)
                    .max_by(|&a, &b| last[a].total_cmp(&last[b]))
                    .unwrap() as u32;
                ids.push(next);
            }
            tokenizer.decode(&ids[start..], true).unwrap()
        })
        .collect()
}

fn follow_rate(replies: &[String]) -> f64 {
    replies
        .iter()
        .filter(|r| r.trim_start().starts_with(TAUGHT))
        .count() as f64
        / replies.len() as f64
}

#[test]
#[ignore = "trains on the starter model for a few minutes"]
fn sft_on_the_starter_model_teaches_a_reply_format_held_out_prompts_follow() {
    let Some(model) = common::starter() else {
        panic!("the starter model is not downloaded (kiln pull)")
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let rows: Vec<Value> = questions()
        .into_iter()
        .map(|(q, a)| json!({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": format!("{TAUGHT} {a}")}]}))
        .collect();
    write_jsonl(&data.join("train.jsonl"), &rows[6..]);
    write_jsonl(&data.join("valid.jsonl"), &rows[..6]);
    let out = dir.path().join("adapter");
    let cfg = config(
        &model,
        &data,
        &out,
        json!({"iters": 40, "learning_rate": 1e-3, "scale": 2.0, "steps_per_report": 5, "steps_per_eval": 20}),
    );
    let mut rep = Collect::default();
    let report = finetune(&cfg, &model, &mut rep).unwrap();
    let losses = train_losses(&rep);
    assert!(losses.last().unwrap() < &(losses[0] * 0.3), "{losses:?}");
    let with = replies(&model, Some(&out), &HELD_OUT);
    let without = replies(&model, None, &HELD_OUT);
    let (w, wo) = (follow_rate(&with), follow_rate(&without));
    eprintln!(
        "train losses {losses:?}\nval {:?}\nwith the adapter {w:.2}: {with:?}\nwithout {wo:.2}: {without:?}\n{} tok/s, peak RSS {:?}",
        report.final_val_loss, report.tokens_per_sec, report.peak_rss_bytes
    );
    assert!(w >= 0.8 && wo <= 0.1, "with {w}, without {wo}");
}

fn preference_data(dir: &Path) -> PathBuf {
    let data = dir.join("pref");
    std::fs::create_dir(&data).unwrap();
    let rows: Vec<Value> = questions()
        .into_iter()
        .map(|(q, a)| json!({"prompt": q, "chosen": format!("{TAUGHT} {a}"), "rejected": a}))
        .collect();
    write_jsonl(&data.join("train.jsonl"), &rows[6..]);
    write_jsonl(&data.join("valid.jsonl"), &rows[..6]);
    data
}

fn val_margins(rep: &Collect) -> Vec<f64> {
    rep.metrics
        .iter()
        .filter(|m| m["kind"] == "val")
        .map(|m| m["margin"].as_f64().unwrap())
        .collect()
}

#[test]
#[ignore = "trains on the starter model for a few minutes"]
fn dpo_and_orpo_on_the_starter_model_move_the_margin_toward_chosen() {
    let Some(model) = common::starter() else {
        panic!("the starter model is not downloaded (kiln pull)")
    };
    let dir = tempfile::tempdir().unwrap();
    let data = preference_data(dir.path());
    for method in ["dpo", "orpo"] {
        let out = dir.path().join(method);
        let cfg = config(
            &model,
            &data,
            &out,
            json!({"method": method, "iters": 20, "learning_rate": 5e-4, "scale": 2.0, "steps_per_report": 5, "steps_per_eval": 20}),
        );
        let mut rep = Collect::default();
        finetune(&cfg, &model, &mut rep).unwrap();
        let m = val_margins(&rep);
        eprintln!("{method}: validation margins {m:?}");
        assert!(m.len() >= 2 && m[m.len() - 1] > m[0], "{method}: {m:?}");
    }
}

#[test]
fn a_fused_gguf_answers_like_the_base_with_its_adapter() {
    use kiln_train::loss::Sequence;

    let Some(starter) = common::starter() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A Q8_0 base, so that re-encoding the merged matrices adds little noise of its own.
    struct Quiet;
    impl kiln_lab::Report for Quiet {
        fn stage(&mut self, _: &str, _: f64, _: &str) -> Result<(), LabError> {
            Ok(())
        }
        fn warn(&mut self, _: &str) {}
    }
    let model = dir.path().join("base-q8.gguf");
    let mut qc = kiln_lab::quantize::QuantizeConfig::new(
        starter,
        model.clone(),
        kiln_lab::quantize::OutputFormat::Gguf,
    );
    qc.gguf_type = Some(kiln_kernels::GgmlType::Q8_0);
    kiln_lab::quantize::quantize(&qc, &mut Quiet).unwrap();
    // A large random adapter on two projections of every block.
    let files = kiln_model::files::ModelFiles::open(&model).unwrap();
    let cfg = files.config.clone();
    drop(files);
    let mut modules = std::collections::BTreeMap::new();
    for l in 0..cfg.num_layers {
        for (name, n_in, n_out) in [
            ("self_attn.q_proj", cfg.hidden_size, cfg.q_width()),
            ("mlp.down_proj", cfg.intermediate_size, cfg.hidden_size),
        ] {
            let r = 4;
            let noise = |n: usize, salt: usize| -> Vec<f32> {
                (0..n)
                    .map(|i| {
                        (((i * 2654435761 + salt * 97 + l * 31) % 1000) as f32 / 500.0 - 1.0) * 0.2
                    })
                    .collect()
            };
            modules.insert(
                format!("model.layers.{l}.{name}"),
                kiln_model::lora::LoraWeights {
                    in_features: n_in,
                    out_features: n_out,
                    rank: r,
                    a: noise(n_in * r, 1),
                    b: noise(r * n_out, 2),
                    scale: 1.0,
                },
            );
        }
    }
    let adapter = LoraAdapter {
        modules,
        base_model: None,
        info: Default::default(),
    };
    let adapter_dir = dir.path().join("adapter");
    adapter.save(&adapter_dir).unwrap();
    let fused = dir.path().join("fused.gguf");
    let report = kiln_lab::finetune::fuse::fuse(&model, &adapter_dir, &fused).unwrap();
    assert_eq!(report.fused_modules, adapter.modules.len());
    let (a, b) = (
        std::fs::metadata(&fused).unwrap().len(),
        std::fs::metadata(&model).unwrap().len(),
    );
    assert!(
        a.abs_diff(b) < 4096,
        "same layout, the same size but for metadata: {a} vs {b}"
    );

    let logits = |path: &Path, with: Option<&LoraAdapter>| -> Vec<f32> {
        let (t, _, _) = frozen(path, with);
        let tokens: Vec<u32> = (0..24).map(|i| 100 + i * 37).collect();
        t.logits(
            &[Sequence {
                tokens: &tokens,
                prompt_len: 0,
            }],
            false,
            true,
        )
        .unwrap()
    };
    let base = logits(&model, None);
    let adapted = logits(&model, Some(&adapter));
    let merged = logits(&fused, None);
    let dist = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| ((x - y) as f64).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let (to_adapted, to_base) = (dist(&merged, &adapted), dist(&merged, &base));
    eprintln!(
        "fused vs adapted {to_adapted:.3}, fused vs base {to_base:.3}, adapted vs base {:.3}",
        dist(&adapted, &base)
    );
    assert!(
        to_adapted * 10.0 < to_base,
        "the merge must carry the adapter: {to_adapted} vs {to_base}"
    );
}

/// Writes the starter model's logits with the adapter `KILN_DUMP_ADAPTER` for 16 fixed tokens
/// to `KILN_DUMP_OUT` (.npy), for `scripts/peft_logits_check.py` (docs/benchmarks.md records
/// the run).
#[test]
#[ignore = "a tool: needs KILN_DUMP_ADAPTER and KILN_DUMP_OUT"]
fn dump_adapted_logits_for_the_peft_check() {
    use kiln_train::loss::Sequence;

    let (Ok(adapter_dir), Ok(out)) = (
        std::env::var("KILN_DUMP_ADAPTER"),
        std::env::var("KILN_DUMP_OUT"),
    ) else {
        panic!("set KILN_DUMP_ADAPTER and KILN_DUMP_OUT")
    };
    let model = common::starter().expect("the starter model");
    let adapter = LoraAdapter::load(Path::new(&adapter_dir)).unwrap();
    let (t, _, _) = frozen(&model, Some(&adapter));
    let tokens: Vec<u32> = vec![
        1, 504, 3458, 282, 4649, 314, 7042, 30, 2, 9690, 421, 1115, 253, 1345, 28, 100,
    ];
    let logits = t
        .logits(
            &[Sequence {
                tokens: &tokens,
                prompt_len: 0,
            }],
            false,
            true,
        )
        .unwrap();
    let vocab = logits.len() / tokens.len();
    let header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {vocab}), }}",
        tokens.len()
    );
    let mut h = header.into_bytes();
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(b' ');
    }
    h.push(b'\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((h.len() as u16).to_le_bytes());
    bytes.extend(h);
    bytes.extend(logits.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(&out, bytes).unwrap();
    eprintln!(
        "tokens {}",
        tokens
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
}
