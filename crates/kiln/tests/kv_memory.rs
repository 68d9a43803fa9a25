//! The memory model against the real process: a generation that fills a 2,048-token context
//! peaks (RSS measured from after loading) within ±10% of what `kiln fit` predicts, for the
//! dense cache and for kv4 — and the two differ by what the formula says they do.

use std::process::Command;

fn kiln(args: &[&str]) -> serde_json::Value {
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln");
    assert!(
        o.status.success(),
        "kiln {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("json output")
}

fn starter() -> String {
    let path = kiln_hub::ensure_starter_model(false).expect("starter model");
    path.display().to_string()
}

fn prompt() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/reference/smollm2/kl_text.txt");
    std::fs::read_to_string(path).expect("kl_text")
}

/// (peak RSS of the generation, fit's predicted total) for `--kv-quant kv_quant`.
fn measure(model: &str, kv_quant: &str) -> (f64, f64) {
    // Two threads whatever the machine, so the per-thread attention buffers are billed alike.
    let common = ["--ctx", "2048", "--kv-quant", kv_quant, "--threads", "2"];
    let mut gen_args = vec!["generate", model, "--max-tokens", "5000", "--ignore-eos"];
    gen_args.extend(["--temperature", "0", "--json"]);
    gen_args.extend(common);
    let prompt = prompt();
    gen_args.insert(2, &prompt);
    let out = kiln(&gen_args);
    let stats = &out["stats"];
    let total =
        stats["prompt_tokens"].as_u64().unwrap() + stats["generated_tokens"].as_u64().unwrap();
    assert_eq!(total, 2048, "the generation fills the context");
    let peak = stats["peak_rss_bytes"].as_f64().unwrap();
    let fit = kiln(&[
        "fit",
        model,
        "--json",
        "--ctx",
        "2048",
        "--kv-quant",
        kv_quant,
        "--threads",
        "2",
    ]);
    (peak, fit["total_bytes"].as_f64().unwrap())
}

#[test]
fn peak_rss_of_a_2048_token_generation_is_within_ten_percent_of_fit() {
    let model = starter();
    let (dense_peak, dense_fit) = measure(&model, "off");
    let (kv4_peak, kv4_fit) = measure(&model, "4");
    eprintln!(
        "dense: peak {:.1} MB, fit {:.1} MB ({:+.1}%); kv4: peak {:.1} MB, fit {:.1} MB ({:+.1}%)",
        dense_peak / 1e6,
        dense_fit / 1e6,
        100.0 * (dense_peak / dense_fit - 1.0),
        kv4_peak / 1e6,
        kv4_fit / 1e6,
        100.0 * (kv4_peak / kv4_fit - 1.0)
    );
    for (name, peak, fit) in [("dense", dense_peak, dense_fit), ("kv4", kv4_peak, kv4_fit)] {
        let ratio = peak / fit;
        assert!(
            (0.9..=1.1).contains(&ratio),
            "{name}: peak RSS {peak} is {:.1}% off fit's {fit}",
            100.0 * (ratio - 1.0)
        );
    }
    // The saving is real, not within the tolerance: kv4 must peak well below dense.
    assert!(
        dense_peak - kv4_peak > 0.5 * (dense_fit - kv4_fit),
        "kv4 saved {} bytes, fit says {}",
        dense_peak - kv4_peak,
        dense_fit - kv4_fit
    );
}
