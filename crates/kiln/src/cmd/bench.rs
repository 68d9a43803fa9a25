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

/// Runs the benchmark for each thread count and prints a table (or JSON).
pub fn run(args: BenchArgs) -> Result<()> {
    let threads = if args.threads.is_empty() {
        vec![available_threads()]
    } else {
        args.threads.clone()
    };
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
