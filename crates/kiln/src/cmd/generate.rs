//! `kiln generate`.

use std::io::Write;

use anyhow::{Context, Result, bail};
use kiln_engine::sampler::SamplingParams;
use kiln_engine::{Engine, GenerateRequest};
use kiln_model::backend::Backend;
use kiln_model::chat_template::prompt_ids;
use serde_json::json;

use crate::cli::GenerateArgs;
use crate::common::{load_engine, set_threads};

/// The `--adapter` folders as one stack (`None` without any), each checked against the model.
fn load_adapters<B: Backend>(
    engine: &Engine<B>,
    paths: &[std::path::PathBuf],
) -> Result<Option<std::sync::Arc<kiln_model::lora::AdapterStack>>> {
    if paths.is_empty() {
        return Ok(None);
    }
    let cfg = &engine.model().config;
    let adapters = paths
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let id = format!("adapter{i}");
            kiln_model::lora::ServedAdapter::load(&id, path, cfg)
                .map(std::sync::Arc::new)
                .with_context(|| format!("--adapter {}", path.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(std::sync::Arc::new(
        kiln_model::lora::AdapterStack::new(adapters),
    )))
}

/// Spec §3.1's last-resort temperature when neither the request nor the model sets one.
const FALLBACK_TEMPERATURE: f32 = 0.7;

/// Runs one generation and streams its text to stdout.
pub fn run(args: GenerateArgs) -> Result<()> {
    set_threads(args.runtime.threads)?;
    {
        let mut engine = load_engine(&args.model, &args.runtime)?;
        // Peak RSS in the stats then covers the generation, which `kiln fit` predicts; loading
        // peaks on its own (`kiln fit`'s load peak).
        kiln_engine::stats::reset_peak_rss();
        let prompt = build_prompt(&engine, &args)?;
        let adapters = load_adapters(&engine, &args.adapters)?;
        let grammar = match &args.json_schema {
            Some(path) => Some(load_schema(&engine, path)?),
            None => None,
        };
        let request = GenerateRequest {
            prompt,
            max_tokens: args.max_tokens,
            sampling: sampling(&engine, &args),
            stop: args.stop.clone(),
            ignore_eos: args.ignore_eos,
            adapters,
            grammar,
        };
        let stdout = std::io::stdout();
        let streaming = !args.json;
        let output = engine.generate(&request, |piece| {
            if streaming {
                let mut out = stdout.lock();
                // A closed pipe (`| head`) ends generation rather than failing it.
                return out
                    .write_all(piece.as_bytes())
                    .and_then(|_| out.flush())
                    .is_ok();
            }
            true
        })?;
        if args.json {
            let value = json!({
                "text": output.text,
                "tokens": output.tokens,
                "finish_reason": output.finish_reason,
                "stats": output.stats,
            });
            println!("{}", serde_json::to_string_pretty(&value)?);
        } else {
            println!();
        }
        if args.stats {
            let s = &output.stats;
            eprintln!(
                "prompt: {} tokens ({} cached) in {:.3}s = {:.1} tok/s | generated: {} tokens in {:.3}s = {:.1} tok/s | ttft {:.3}s | peak RSS since load {:.1} MiB | load {:.2}s | finish: {:?}",
                s.prompt_tokens,
                s.cached_tokens,
                s.prefill_secs,
                s.prompt_tokens_per_sec,
                s.generated_tokens,
                s.decode_secs,
                s.decode_tokens_per_sec,
                s.time_to_first_token_secs,
                s.peak_rss_bytes as f64 / (1024.0 * 1024.0),
                engine.model().load_secs,
                output.finish_reason,
            );
        }
        Ok(())
    }
}

/// The `--json-schema` file compiled against the model's vocabulary.
fn load_schema<B: Backend>(
    engine: &Engine<B>,
    path: &std::path::Path,
) -> Result<kiln_engine::structured::Grammar> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--json-schema {}", path.display()))?;
    let schema: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("--json-schema {}: not JSON", path.display()))?;
    let m = engine.model();
    let compiler =
        kiln_engine::structured::GrammarCompiler::new(&m.tokenizer, m.config.vocab_size)?;
    compiler
        .compile(&kiln_engine::structured::GrammarSpec::JsonSchema(schema))
        .with_context(|| format!("--json-schema {}", path.display()))
}

fn build_prompt<B: Backend>(engine: &Engine<B>, args: &GenerateArgs) -> Result<Vec<u32>> {
    let model = engine.model();
    if !args.chat {
        // Raw prompts get BOS when the tokenizer asks for it (llama.cpp's behaviour).
        let ids = model.tokenizer.encode(&args.prompt, true)?;
        return Ok(ids);
    }
    let Some(template) = &model.chat_template else {
        bail!(
            "{} has no chat template; drop --chat to send the prompt as raw text",
            model.path.display()
        );
    };
    let mut messages = vec![];
    if let Some(system) = &args.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.push(json!({"role": "user", "content": args.prompt}));
    let rendered = template
        .render(&messages, None, true, None)
        .context("rendering the chat template")?;
    Ok(prompt_ids(&model.tokenizer, &rendered)?)
}

fn sampling<B: Backend>(engine: &Engine<B>, args: &GenerateArgs) -> SamplingParams {
    let defaults = &engine.model().generation;
    SamplingParams {
        temperature: args
            .temperature
            .or(defaults.temperature)
            .unwrap_or(FALLBACK_TEMPERATURE),
        top_p: args.top_p.or(defaults.top_p).unwrap_or(0.0),
        top_k: args.top_k.or(defaults.top_k).unwrap_or(0),
        min_p: args.min_p,
        repetition_penalty: args
            .repetition_penalty
            .or(defaults.repetition_penalty)
            .unwrap_or(0.0),
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        seed: args.seed,
        ..SamplingParams::default()
    }
}
