//! `kiln fit` end to end on the starter model: the printed numbers equal the memory formulas
//! worked by hand (spec §6.4 and `kiln_engine::kv_scheme::memory`), the JSON shape, and clear
//! errors for bad flags.

use std::process::Command;

fn kiln(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

fn json(args: &[&str]) -> serde_json::Value {
    let o = kiln(args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("json output")
}

fn starter() -> String {
    let path = kiln_hub::ensure_starter_model(false).expect("starter model");
    path.display().to_string()
}

/// SmolLM2-135M: 30 layers, 3 KV heads of 64, hidden 576, 9 heads, MLP 1536, vocab 49152.
fn smollm2_transient(chunk: u64, ctx: u64) -> u64 {
    let c = chunk.min(ctx);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let layer = c * (5 * 576 + 2 * 576 + 2 * 192 + 3 * 1536) * 4 + c * 24 + 49152 * 4;
    let after = c * 576 * 4 + 2 * 576 * 4 + 3 * 49152 * 4;
    let scratch = (c * 1536 * 2292).div_ceil(256);
    let scores = threads * (48 * (ctx + 16) + 2 * 64 * 64 + 2 * 48 * 64 + 48) * 4;
    scratch + scores + layer.max(after)
}

#[test]
fn fit_numbers_equal_the_formulas_for_smollm2() {
    let model = starter();
    let files = kiln_model::files::ModelFiles::open(std::path::Path::new(&model)).expect("open");
    let weights = files.tensors().total_tensor_bytes();
    let overhead = 30_000_000u64;

    // Dense f16, the default: 30 layers × (K + V) × 3 heads × 64 × 2 bytes = 23,040.
    let v = json(&[
        "fit",
        &model,
        "--ctx",
        "2048",
        "--memory-budget",
        "1",
        "--json",
    ]);
    let dense_per = 30 * 2 * 3 * 64 * 2;
    assert_eq!(dense_per, 23_040);
    assert_eq!(v["kv_bytes_per_token"], dense_per);
    assert_eq!(v["weights_bytes"], weights);
    assert_eq!(v["kv_bytes"], dense_per * 2048);
    assert_eq!(v["transient_bytes"], smollm2_transient(512, 2048));
    assert_eq!(v["runtime_overhead_bytes"], overhead);
    assert_eq!(
        v["load_peak_bytes"],
        weights + files.tensors().largest_tensor_bytes() + overhead
    );
    assert_eq!(
        v["total_bytes"],
        weights + overhead + dense_per * 2048 + smollm2_transient(512, 2048)
    );
    assert_eq!(v["budget_bytes"], 1_000_000_000u64);
    assert_eq!(v["fits"], true);
    assert_eq!(v["kv_scheme"], "f16");
    assert_eq!(v["max_position_embeddings"], 8192);
    assert!(v["predicted_decode_tok_s"].as_f64().unwrap() > 0.0);
    // `--kv-quant off` names the same dense f16 cache; f32 and bf16 on request.
    for (flags, key, per) in [
        (&["--kv-quant", "off"][..], "f16", 23_040),
        (
            &["--kv-quant", "off", "--kv-dtype", "f32"][..],
            "f32",
            46_080,
        ),
        (&["--kv-dtype", "bf16"][..], "bf16", 23_040),
    ] {
        let mut args = vec!["fit", &model, "--memory-budget", "1", "--json"];
        args.extend_from_slice(flags);
        let v = json(&args);
        assert_eq!(v["kv_scheme"], key, "{flags:?}");
        assert_eq!(v["kv_bytes_per_token"], per, "{flags:?}");
    }

    // kv4 g64 from the flag (start 0): 0.5 + 4/64 bytes per element ⇒ 216 bytes per layer;
    // the first 512-token chunk is dense before conversion, plus one converted layer.
    let v = json(&[
        "fit",
        &model,
        "--ctx",
        "2048",
        "--kv-quant",
        "4",
        "--memory-budget",
        "1",
        "--json",
    ]);
    assert_eq!(v["kv_scheme"], "kv4");
    assert_eq!(v["kv_scheme_label"], "uniform-kv4");
    assert_eq!(v["kv_bytes_per_token"], 30 * 216);
    assert_eq!(
        v["kv_bytes"],
        (30 * 216 * 2048u64).max(512 * dense_per + 216 * 512)
    );
    let v = json(&[
        "fit",
        &model,
        "--kv-quant",
        "8",
        "--kv-group-size",
        "32",
        "--quantized-kv-start",
        "100",
        "--memory-budget",
        "1",
        "--json",
    ]);
    assert_eq!(v["kv_scheme"], "kv8-g32-start100");
    // 8 bits + a 32-bit scale/bias pair per 32 elements = 9 bits per element.
    assert_eq!(v["kv_bytes_per_token"], 30 * 2 * 192 * 9 / 8);
    let v = json(&[
        "fit",
        &model,
        "--kv-quant",
        "turbo",
        "--memory-budget",
        "1",
        "--json",
    ]);
    assert_eq!(v["kv_scheme"], "turbo-k8v3");
    assert_eq!(v["kv_scheme_label"], "turbo k8v3");
}

#[test]
fn fit_json_shape_and_a_budget_too_small() {
    let model = starter();
    let v = json(&["fit", &model, "--memory-budget", "0.1", "--json"]);
    for key in [
        "model",
        "kv_scheme",
        "kv_scheme_label",
        "weights_bytes",
        "kv_bytes_per_token",
        "kv_dense_bytes_per_token",
        "ctx",
        "kv_bytes",
        "transient_bytes",
        "runtime_overhead_bytes",
        "load_peak_bytes",
        "total_bytes",
        "peak_bytes",
        "budget_bytes",
        "fits",
        "max_safe_context",
        "max_position_embeddings",
        "memory_context_limit",
        "predicted_decode_tok_s",
        "budget_source",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    // 100 MB cannot hold the load peak (~97 MB of weights, the largest tensor, the runtime).
    assert_eq!(v["fits"], false);
    assert_eq!(v["max_safe_context"], 0);
    // Without --memory-budget the process's own budget is used and named.
    let v = json(&["fit", &model, "--json"]);
    assert_eq!(v["budget_source"], "process (cgroup room and MemAvailable)");
    let o = kiln(&["fit", &model]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("max safe context"));
}

#[test]
fn fit_bad_flags_fail_clearly() {
    let model = starter();
    let cases: [(&[&str], &str); 8] = [
        (
            &["--kv-quant", "5"],
            "KV quantization bits must be one of 4 or 8, got 5",
        ),
        (
            &["--kv-quant", "fp8"],
            "--kv-quant must be off, 4, 8, config or turbo",
        ),
        (
            &["--kv-quant", "config"],
            "model has no kv_config.json (--kv-quant config)",
        ),
        (
            &["--kv-quant", "4", "--quantized-kv-start", "-1"],
            "quantized_kv_start must be a nonnegative integer",
        ),
        (
            &["--kv-quant", "4", "--kv-group-size", "48"],
            "KV group size must be one of 32, 64 or 128",
        ),
        (
            &["--kv-group-size", "32"],
            "--kv-group-size applies only to --kv-quant 4|8",
        ),
        (&["--turbo-k-bits", "4"], "apply only to --kv-quant turbo"),
        (
            &["--memory-budget", "0"],
            "--memory-budget must be a positive number of GB",
        ),
    ];
    for (flags, want) in cases {
        let mut args = vec!["fit", model.as_str()];
        args.extend_from_slice(flags);
        let o = kiln(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{flags:?} should fail");
        assert!(err.contains(want), "{flags:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn fit_on_a_bad_file_names_it() {
    let dir = std::env::temp_dir().join(format!("kiln-fit-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let bogus = dir.join("bogus.gguf");
    std::fs::write(&bogus, b"GGUF\x03\x00\x00\x00garbage").expect("write");
    let o = kiln(&["fit", &bogus.display().to_string(), "--memory-budget", "1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("bogus.gguf"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Hugging Face folder with a `kv_config.json`: used by default (spec §6.1's serial default),
/// billed per layer, a broken file is an error naming the entry, and `--kv-quant off` ignores it.
#[test]
fn kv_config_json_is_the_default_scheme_and_is_validated() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/reference/tiny/gemma3-hd256");
    let dir = tempfile::tempdir().expect("tempdir");
    for f in ["config.json", "model.safetensors", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).expect("copy");
    }
    let model = dir.path().display().to_string();
    let kv_config = dir.path().join("kv_config.json");
    std::fs::write(
        &kv_config,
        r#"[{"layer_idx": 0, "bits": 8, "group_size": 64}, {"layer_idx": 2, "bits": 4}]"#,
    )
    .unwrap();
    let v = json(&["fit", &model, "--memory-budget", "1", "--json"]);
    assert_eq!(v["kv_scheme"], "config");
    assert_eq!(v["kv_scheme_label"], "mixed (kv_config.json)");
    // 4 layers, 1 KV head of 256: kv8-g64 544 + kv4-g64 288 + two dense f16 layers of 1024.
    assert_eq!(v["kv_bytes_per_token"], 544 + 288 + 2 * 1024);
    std::fs::write(&kv_config, r#"[{"layer_idx": 7, "bits": 4}]"#).unwrap();
    let o = kiln(&["fit", &model, "--memory-budget", "1"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("entry 0: layer_idx 7 is out of range"),
        "{err}"
    );
    let v = json(&[
        "fit",
        &model,
        "--memory-budget",
        "1",
        "--json",
        "--kv-quant",
        "off",
    ]);
    assert_eq!(v["kv_scheme"], "f16");
}
