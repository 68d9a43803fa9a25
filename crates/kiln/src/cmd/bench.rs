//! `kiln bench`.

use anyhow::Result;
use kiln_engine::bench::{BenchConfig, BenchResult};
use serde::Serialize;

use crate::cli::{BenchArgs, RuntimeArgs};
use crate::common::{available_threads, load_engine_with, set_threads};

#[derive(Serialize)]
struct Row {
    model: String,
    backend: &'static str,
    kv_scheme: String,
    threads: usize,
    #[serde(flatten)]
    result: BenchResult,
}

/// One embedding-throughput measurement.
#[derive(Serialize)]
struct EmbedRow {
    model: String,
    threads: usize,
    inputs: usize,
    tokens_per_input: usize,
    inputs_per_sec_median: f64,
    inputs_per_sec_min: f64,
    inputs_per_sec_max: f64,
    tokens_per_sec_median: f64,
}

/// `kiln bench --embed-inputs N`: requests of N inputs of `--prompt-tokens` random tokens,
/// embedded as the server does (one engine job, inputs batched over the KV slots).
fn run_embed(args: &BenchArgs, threads: &[usize]) -> Result<()> {
    if args.prompt_tokens == 0 {
        anyhow::bail!("--prompt-tokens must be at least 1 for an embedding benchmark");
    }
    let mut rows = Vec::new();
    for &t in threads {
        set_threads(Some(t))?;
        let rt = RuntimeArgs {
            threads: Some(t),
            ctx: Some(args.prompt_tokens.max(16)),
            dense: args.dense,
            kv: args.kv.clone(),
        };
        let mut engine = load_engine_with(&args.model, &rt, |o, _| {
            o.slots = args.embed_inputs.clamp(1, 64);
            o.batch_tokens = o.batch_tokens.max(args.prompt_tokens);
            Ok(())
        })?;
        if !engine.is_embedding_model() {
            anyhow::bail!(
                "{} is not an embedding model (it declares no pooling)",
                args.model
            );
        }
        let vocab = engine.model().config.vocab_size as u64;
        // A fixed pseudo-random sequence: every run embeds the same inputs.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab) as u32
        };
        let inputs: Vec<Vec<u32>> = (0..args.embed_inputs)
            .map(|_| (0..args.prompt_tokens).map(|_| next()).collect())
            .collect();
        engine.embed(&inputs[..1])?;
        let mut rates: Vec<f64> = (0..args.repetitions.max(1))
            .map(|_| {
                let started = std::time::Instant::now();
                engine
                    .embed(&inputs)
                    .map(|_| inputs.len() as f64 / started.elapsed().as_secs_f64())
            })
            .collect::<Result<_, _>>()?;
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        rows.push(EmbedRow {
            model: args.model.clone(),
            threads: t,
            inputs: args.embed_inputs,
            tokens_per_input: args.prompt_tokens,
            inputs_per_sec_median: median,
            inputs_per_sec_min: rates[0],
            inputs_per_sec_max: rates[rates.len() - 1],
            tokens_per_sec_median: median * args.prompt_tokens as f64,
        });
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("| model | threads | test | inputs/s (median) | min | max | tokens/s |");
    println!("| --- | ---: | --- | ---: | ---: | ---: | ---: |");
    for r in &rows {
        println!(
            "| {} | {} | embed {}x{} | {:.2} | {:.2} | {:.2} | {:.0} |",
            r.model,
            r.threads,
            r.inputs,
            r.tokens_per_input,
            r.inputs_per_sec_median,
            r.inputs_per_sec_min,
            r.inputs_per_sec_max,
            r.tokens_per_sec_median
        );
    }
    Ok(())
}

/// Runs the benchmark for each thread count and prints a table (or JSON).
pub fn run(args: BenchArgs) -> Result<()> {
    let threads = if args.threads.is_empty() {
        vec![available_threads()]
    } else {
        args.threads.clone()
    };
    if args.embed_inputs > 0 {
        return run_embed(&args, &threads);
    }
    if args.batch.iter().any(|&b| b == 0 || b > 256) {
        anyhow::bail!("--batch sizes must be between 1 and 256");
    }
    let batches = if args.batch.is_empty() {
        vec![1]
    } else {
        args.batch.clone()
    };
    let slots = batches.iter().copied().max().unwrap_or(1);
    let cfg = BenchConfig {
        prompt_tokens: args.prompt_tokens,
        gen_tokens: args.gen_tokens,
        repetitions: args.repetitions.max(1),
        depth: args.depth,
        batch: 1,
    };
    let ctx = args
        .depth
        .saturating_add(cfg.prompt_tokens.max(cfg.gen_tokens))
        .max(16);
    let mut rows = vec![];
    for &t in &threads {
        set_threads(Some(t))?;
        let rt = RuntimeArgs {
            threads: Some(t),
            ctx: Some(ctx),
            dense: args.dense,
            kv: args.kv.clone(),
        };
        let mut engine = load_engine_with(&args.model, &rt, |o, _| {
            o.slots = slots;
            Ok(())
        })?;
        let stack = match &args.adapter {
            Some(path) => {
                let id = path
                    .file_name()
                    .map(|n| {
                        n.to_string_lossy().replace(
                            |c: char| {
                                !c.is_ascii_alphanumeric() && c != '-' && c != '_' && c != '.'
                            },
                            "_",
                        )
                    })
                    .filter(|n| kiln_model::lora::check_adapter_id(n).is_ok())
                    .unwrap_or_else(|| "adapter".into());
                let a = kiln_model::lora::ServedAdapter::load(&id, path, &engine.model().config)
                    .map_err(|e| anyhow::anyhow!("--adapter {}: {e}", path.display()))?;
                Some(kiln_model::lora::AdapterStack::new(vec![
                    std::sync::Arc::new(a),
                ]))
            }
            None => None,
        };
        let mut results: Vec<BenchResult> = Vec::new();
        for (i, &batch) in batches.iter().enumerate() {
            // The prefill test runs once, with the first batch size.
            let c = BenchConfig {
                batch,
                prompt_tokens: if i == 0 { cfg.prompt_tokens } else { 0 },
                ..cfg
            };
            results.extend(engine.bench_with(&c, stack.as_ref())?);
        }
        let backend = if args.dense { "cpu-dense" } else { "cpu" };
        let kv_scheme = engine.options().kv_scheme.cache_key();
        let model = match &stack {
            Some(s) => format!("{} + {}", args.model, s.key()),
            None => args.model.clone(),
        };
        rows.extend(results.into_iter().map(|result| Row {
            model: model.clone(),
            backend,
            kv_scheme: kv_scheme.clone(),
            threads: t,
            result,
        }));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "| model | backend | kv | threads | test | t/s (median) | min | max | matmul | attention | other |"
    );
    println!("| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &rows {
        let share = |ns: u64| -> String {
            match &r.result.profile {
                Some(p) => {
                    let total = (p.matmul_ns + p.attention_ns + p.other_ns).max(1);
                    format!("{:.0}%", 100.0 * ns as f64 / total as f64)
                }
                None => "-".into(),
            }
        };
        let p = r.result.profile.unwrap_or_default();
        println!(
            "| {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {} | {} | {} |",
            r.model,
            r.backend,
            r.kv_scheme,
            r.threads,
            r.result.test,
            r.result.median,
            r.result.min,
            r.result.max,
            share(p.matmul_ns),
            share(p.attention_ns),
            share(p.other_ns)
        );
    }
    Ok(())
}
