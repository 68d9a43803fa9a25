//! Structured output on the real starter model: JSON schemas compiled by llguidance constrain
//! greedy and sampled decoding so every answer parses and has the schema's shape; schemas
//! llguidance cannot follow are refused when compiled.

use std::sync::{Arc, Mutex};

use kiln_engine::kv_scheme::{KvQuantOverride, KvSchemeRequest, TurboQuant, resolve_kv_scheme};
use kiln_engine::sampler::SamplingParams;
use kiln_engine::structured::{GrammarCompiler, GrammarError, GrammarSpec};
use kiln_engine::{Engine, EngineOptions, FinishReason, GenerateRequest, load_model};
use kiln_engine::{GenerateOutput, SequenceSink};
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_model::chat_template::prompt_ids;
use serde_json::{Value, json};

fn engine() -> Engine<CpuBackend> {
    engine_with(EngineOptions {
        context_len: 1024,
        ..EngineOptions::default()
    })
}

fn engine_with(options: EngineOptions) -> Engine<CpuBackend> {
    let path = kiln_hub::ensure_starter_model(false).expect("starter model");
    let backend = CpuBackend::new(CpuOptions { dense: false });
    let model = load_model(&backend, &path).expect("load");
    Engine::new(backend, model, options).expect("engine")
}

fn compiler(e: &Engine<CpuBackend>) -> GrammarCompiler {
    let m = e.model();
    GrammarCompiler::new(&m.tokenizer, m.config.vocab_size).expect("compiler")
}

fn request(
    e: &Engine<CpuBackend>,
    c: &GrammarCompiler,
    user: &str,
    schema: Value,
    temperature: f32,
    seed: u64,
) -> GenerateRequest {
    let m = e.model();
    let rendered = m
        .chat_template
        .as_ref()
        .expect("template")
        .render(
            &[json!({"role": "user", "content": user})],
            None,
            true,
            None,
        )
        .expect("render");
    let prompt = prompt_ids(&m.tokenizer, &rendered).expect("ids");
    GenerateRequest {
        prompt,
        max_tokens: 200,
        sampling: SamplingParams {
            temperature,
            seed,
            ..SamplingParams::default()
        },
        grammar: Some(
            c.compile(&GrammarSpec::JsonSchema(schema))
                .expect("compile"),
        ),
        ..GenerateRequest::default()
    }
}

fn ask(
    e: &mut Engine<CpuBackend>,
    c: &GrammarCompiler,
    user: &str,
    schema: Value,
    temperature: f32,
    seed: u64,
) -> (String, FinishReason) {
    let req = request(e, c, user, schema, temperature, seed);
    let out = e.generate(&req, |_| true).expect("generate");
    (out.text, out.finish_reason)
}

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Option<GenerateOutput>>>);

impl SequenceSink for Sink {
    fn text(&mut self, _: &str, _: &[kiln_engine::request::TokenLogprob]) -> bool {
        true
    }
    fn is_closed(&self) -> bool {
        false
    }
    fn finished(&mut self, out: GenerateOutput) {
        *self.0.lock().unwrap() = Some(out);
    }
    fn failed(&mut self, message: &str) {
        panic!("failed: {message}");
    }
}

fn point() -> Value {
    json!({"type": "object", "additionalProperties": false, "required": ["x", "y"],
           "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99},
                          "y": {"type": "integer", "minimum": 0, "maximum": 99}}})
}

#[test]
fn batched_sequences_under_quantized_kv_each_follow_their_own_schema() {
    for kv in [
        KvSchemeRequest {
            kv_quant: Some(KvQuantOverride::Bits(4)),
            ..Default::default()
        },
        KvSchemeRequest {
            turbo: Some(TurboQuant {
                k_bits: 8,
                v_bits: 4,
            }),
            ..Default::default()
        },
    ] {
        let mut e = engine_with(EngineOptions {
            context_len: 512,
            slots: 3,
            kv_scheme: resolve_kv_scheme(&kv).expect("scheme"),
            ..EngineOptions::default()
        });
        let c = compiler(&e);
        let schemas = [
            point(),
            json!({"enum": ["left", "right"]}),
            json!({"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2}),
        ];
        let sinks: Vec<Sink> = schemas
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let sink = Sink::default();
                let req = request(&e, &c, "Answer in JSON.", s.clone(), 0.7, i as u64);
                e.add(&req, Box::new(sink.clone())).expect("add");
                sink
            })
            .collect();
        while e.has_work() {
            e.step().expect("step");
        }
        for (sink, schema) in sinks.iter().zip(&schemas) {
            let out = sink.0.lock().unwrap().take().expect("finished");
            let v: Value =
                serde_json::from_str(&out.text).unwrap_or_else(|e| panic!("{e}: {}", out.text));
            match schema.get("enum") {
                Some(Value::Array(options)) => assert!(options.contains(&v), "{v}"),
                _ if schema["type"] == "array" => assert!(
                    v.as_array()
                        .is_some_and(|a| a.len() == 2 && a.iter().all(Value::is_boolean)),
                    "{v}"
                ),
                _ => assert!(
                    v["x"].as_u64().is_some_and(|x| x < 100) && v["y"].is_u64(),
                    "{v}"
                ),
            }
        }
    }
}

#[test]
fn constrained_answers_parse_and_match_their_schema() {
    let mut e = engine();
    let c = compiler(&e);
    let person = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "mood": {"enum": ["happy", "sad"]}
        },
        "required": ["name", "age", "mood"],
        "additionalProperties": false
    });
    for (temperature, seed) in [(0.0, 0), (0.8, 7), (1.0, 42)] {
        let (text, finish) = ask(
            &mut e,
            &c,
            "Describe a person as JSON.",
            person.clone(),
            temperature,
            seed,
        );
        assert_eq!(finish, FinishReason::Stop, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let obj = v.as_object().expect("object");
        assert_eq!(obj.len(), 3, "{text}");
        assert!(
            obj["name"]
                .as_str()
                .is_some_and(|s| s.chars().count() <= 40)
        );
        let age = obj["age"].as_i64().expect("integer age");
        assert!((0..=150).contains(&age), "{text}");
        assert!(["happy", "sad"].contains(&obj["mood"].as_str().expect("mood")));
    }
    let (text, _) = ask(
        &mut e,
        &c,
        "List three colours.",
        json!({"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 3, "maxItems": 3}),
        0.0,
        0,
    );
    let v: Vec<String> = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v.len(), 3);
}

#[test]
fn bad_schemas_are_refused_when_compiled() {
    let e = engine();
    let c = compiler(&e);
    for bad in [
        json!({"type": "no_such_type"}),
        json!({"type": "string", "pattern": "(unclosed"}),
        json!({"type": "integer", "minimum": 5, "maximum": 1}),
        json!("not a schema"),
    ] {
        let err = c.compile(&GrammarSpec::JsonSchema(bad.clone())).err();
        assert!(
            matches!(err, Some(GrammarError::Invalid(_))),
            "{bad} gave {err:?}"
        );
    }
    assert!(
        c.compile(&GrammarSpec::JsonSchema(json!({"type": "object"})))
            .is_ok()
    );
    assert!(
        c.compile(&GrammarSpec::Lark("start: \"yes\" | \"no\"".into()))
            .is_ok()
    );
    assert!(c.compile(&GrammarSpec::Lark("start: ((".into())).is_err());
}

#[test]
fn a_lazy_grammar_waits_for_its_trigger_then_constrains_until_complete() {
    let e = engine();
    let c = compiler(&e);
    let tok = &e.model().tokenizer;
    let src = r#"start: "\n" call "\n</tool_call>"
call: %json {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x"], "additionalProperties": false}
"#;
    let g = c
        .compile_lazy(&GrammarSpec::Lark(src.into()), "<tool_call>", false)
        .expect("compile");
    let mut k = g.start();
    let vocab = e.model().config.vocab_size;
    let feed = |k: &mut kiln_engine::structured::Constraint, text: &str| {
        for id in tok.encode(text, false).expect("encode") {
            let mut logits = vec![0.0f32; vocab];
            k.mask(&mut logits).expect("mask");
            assert!(
                logits[id as usize].is_finite(),
                "{text:?}: token {id} was masked"
            );
            k.accept(id).expect("accept");
        }
    };
    let allowed = |k: &mut kiln_engine::structured::Constraint| {
        let mut logits = vec![0.0f32; vocab];
        k.mask(&mut logits).expect("mask");
        logits.iter().filter(|l| l.is_finite()).count()
    };
    feed(&mut k, "Sure, let me look that up. ");
    assert!(!k.active());
    assert_eq!(allowed(&mut k), vocab, "free text before the trigger");
    feed(&mut k, "<tool_call>");
    assert!(k.active(), "the trigger starts the grammar");
    assert!(allowed(&mut k) < 10, "only the call's shape may follow");
    feed(&mut k, "\n{\"x\": 7}\n</tool_call>");
    assert!(!k.active(), "a complete call frees the output again");
    assert!(!k.finished(), "a lazy grammar never ends the answer");
    feed(&mut k, " Done. <tool_call>");
    assert!(k.active(), "a second call is constrained too");
}

#[test]
fn an_answer_after_reasoning_is_constrained_from_the_end_of_the_thinking() {
    let e = engine();
    let c = compiler(&e);
    let tok = &e.model().tokenizer;
    let g = c
        .compile_lazy(
            &GrammarSpec::JsonSchema(json!({"enum": ["yes", "no"]})),
            "</think>",
            true,
        )
        .expect("compile");
    let mut k = g.start();
    for id in tok
        .encode("Let me think. Probably yes.</think>\"no\"", false)
        .expect("encode")
    {
        assert!(!k.finished());
        k.accept(id).expect("accept");
    }
    assert!(k.active() && k.finished(), "the answer ends with the match");
}
