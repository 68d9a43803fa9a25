//! End-to-end tests of the `kiln` binary: real process, real starter model.

use std::process::Command;

fn kiln(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn generate_greedy_chat_answers_and_reports_json() {
    let o = kiln(&[
        "generate",
        "smollm2",
        "What is the capital of France?",
        "--chat",
        "--temperature",
        "0",
        "--max-tokens",
        "40",
        "--dense",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json output");
    assert_eq!(v["text"], "The capital of France is Paris.");
    assert_eq!(v["finish_reason"], "stop");
    assert_eq!(v["stats"]["prompt_tokens"], 37);
}

#[test]
fn generate_streams_raw_text_and_stops_on_a_stop_string() {
    let o = kiln(&[
        "generate",
        "smollm2",
        "The quick brown fox",
        "--temperature",
        "0",
        "--max-tokens",
        "30",
        "--stop",
        "brown bear",
        "--stats",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(!out.contains("brown bear"), "stop string leaked: {out:?}");
    assert!(stderr(&o).contains("tok/s"), "stats on stderr");
}

#[test]
fn bench_prints_json_rows() {
    let o = kiln(&[
        "bench",
        "smollm2",
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "1",
        "--threads",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let rows = v.as_array().expect("array");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["test"], "pp16");
    assert_eq!(rows[1]["test"], "tg4");
    assert!(rows[1]["median"].as_f64().expect("median") > 0.0);
    assert!(rows[0]["profile"]["matmul_ns"].as_u64().expect("profile") > 0);
}

#[test]
fn models_lists_the_starter_model() {
    let o = kiln(&["models", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let starter = v
        .as_array()
        .expect("array")
        .iter()
        .find(|m| {
            m["name"]
                .as_str()
                .is_some_and(|n| n.contains("SmolLM2-135M-Instruct"))
        })
        .expect("starter listed");
    assert_eq!(starter["architecture"], "llama");
    assert_eq!(starter["quantization"], "Q4_1");
}

#[test]
fn every_verb_has_help() {
    for verb in ["generate", "bench", "models", "pull", "serve", "fit"] {
        let o = kiln(&[verb, "--help"]);
        assert!(o.status.success(), "{verb} --help");
        assert!(stdout(&o).contains("Usage"), "{verb} --help prints usage");
    }
}

#[test]
fn bench_decodes_several_sequences_per_step() {
    let o = kiln(&[
        "bench",
        "smollm2",
        "-p",
        "0",
        "-n",
        "4",
        "-r",
        "1",
        "-b",
        "1,3",
        "--threads",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let tests: Vec<&str> = v
        .as_array()
        .expect("array")
        .iter()
        .map(|r| r["test"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(tests, ["tg4", "tg4 x3"]);
}

#[test]
fn bad_input_fails_with_a_clear_message_not_a_panic() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let bogus = dir.join("bogus.gguf");
    std::fs::write(&bogus, b"GGUF\x03\x00\x00\x00garbage").expect("write");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["generate".into(), bogus.display().to_string(), "hi".into()],
            "bogus.gguf",
        ),
        (
            vec![
                "generate".into(),
                dir.join("missing.gguf").display().to_string(),
                "hi".into(),
            ],
            "missing.gguf",
        ),
        (
            vec![
                "generate".into(),
                "smollm2".into(),
                "hi".into(),
                "--threads".into(),
                "0".into(),
            ],
            "--threads",
        ),
        (
            vec![
                "generate".into(),
                "smollm2".into(),
                "hi".into(),
                "--top-p".into(),
                "7".into(),
                "--temperature".into(),
                "1".into(),
            ],
            "top_p",
        ),
        (
            vec![
                "generate".into(),
                "smollm2".into(),
                "hi".into(),
                "--ctx".into(),
                "0".into(),
            ],
            "--ctx",
        ),
        (
            vec![
                "generate".into(),
                "smollm2".into(),
                "hi".into(),
                "--max-tokens".into(),
                "lots".into(),
            ],
            "invalid value",
        ),
        (
            vec!["generate".into(), "smollm2".into(), "".into()],
            "empty",
        ),
        (
            vec![
                "serve".into(),
                "smollm2".into(),
                "--parallel".into(),
                "0".into(),
            ],
            "--parallel",
        ),
        (
            vec![
                "serve".into(),
                "smollm2".into(),
                "--batch-tokens".into(),
                "0".into(),
            ],
            "--batch-tokens",
        ),
        (
            vec!["bench".into(), "smollm2".into(), "-b".into(), "0".into()],
            "--batch",
        ),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = kiln(&args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: message {err:?} should mention {needle:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn quantize_and_eval_kl_name_the_bad_flag() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-quant-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let out = dir.join("out.gguf").display().to_string();
    let existing = dir.join("exists.gguf");
    std::fs::write(&existing, b"x").expect("write");
    let text = dir.join("text.txt");
    std::fs::write(&text, "hello").expect("write");
    let q = |extra: &[&str]| {
        let mut v = vec!["quantize", "smollm2", "--out", &out];
        v.extend_from_slice(extra);
        v.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (q(&["--bits", "7"]), "--bits"),
        (
            q(&["--format", "mlx", "--group-size", "48"]),
            "--group-size",
        ),
        (q(&["--type", "Q9_K"]), "--type"),
        (q(&["--target-bpw", "99"]), "--target-bpw"),
        (q(&["--candidate-bits", "4,7"]), "--candidate-bits"),
        (q(&["--format", "mlx", "--type", "Q4_K"]), "--type"),
        (
            vec![
                "quantize",
                "smollm2",
                "--out",
                &existing.display().to_string(),
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            "--out",
        ),
        (
            [
                "eval",
                "kl",
                "smollm2",
                "--reference",
                "smollm2",
                "--text",
                "/no/such/text",
            ]
            .map(String::from)
            .to_vec(),
            "/no/such/text",
        ),
        (
            [
                "eval",
                "kl",
                "smollm2",
                "--reference",
                "smollm2",
                "--text",
                "x",
                "--window",
                "2",
            ]
            .map(String::from)
            .to_vec(),
            "--window",
        ),
        (
            vec![
                "eval",
                "kl",
                "smollm2",
                "--reference",
                "smollm2",
                "--text",
                &text.display().to_string(),
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            "one window needs",
        ),
    ];
    for (args, needle) in cases {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = kiln(&refs);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    assert!(!std::path::Path::new(&out).exists());
    std::fs::remove_dir_all(&dir).ok();
}
