//! Every dataset template on fixed inputs: the rows it writes, their count and split, and that
//! kiln's own fine-tune loader accepts them. The LLM templates run against a scripted model
//! (the same templates against the real served model are `tests/e2e/test_dataset.py`).

use std::path::Path;
use std::sync::Mutex;

use kiln_lab::LabError;
use kiln_lab::Report;
use kiln_lab::dataset::llm::{ChatClient, ChatReply, ChatRequest};
use kiln_lab::dataset::output::split_index;
use kiln_lab::dataset::{self, Written};
use kiln_lab::finetune::data::inspect_data_dir;
use serde_json::{Map, Value, json};

/// Replies from a script: each call returns the answer of the first rule whose key the last
/// user message contains; every request is recorded.
struct Scripted {
    rules: Vec<(&'static str, ChatReply)>,
    seen: Mutex<Vec<ChatRequest>>,
}

fn text(s: &str) -> ChatReply {
    ChatReply {
        content: s.into(),
        tool_calls: vec![],
    }
}

impl Scripted {
    fn new(rules: Vec<(&'static str, ChatReply)>) -> Self {
        Scripted {
            rules,
            seen: Mutex::new(vec![]),
        }
    }
    fn calls(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

impl ChatClient for Scripted {
    fn chat(&self, req: &ChatRequest) -> Result<ChatReply, LabError> {
        self.seen.lock().unwrap().push(req.clone());
        let last = req
            .messages
            .last()
            .and_then(|m| m["content"].as_str())
            .unwrap_or("");
        let reply = self
            .rules
            .iter()
            .find(|(k, _)| last.contains(k))
            .map(|(_, r)| r.clone());
        Ok(reply.unwrap_or_else(|| text("a generic answer")))
    }
}

#[derive(Default)]
struct Quiet {
    warnings: Vec<String>,
    steps: usize,
}

impl Report for Quiet {
    fn stage(&mut self, _: &str, _: f64, _: &str) -> Result<(), LabError> {
        Ok(())
    }
    fn step(&mut self, _: usize, _: usize, _: &str) -> Result<(), LabError> {
        self.steps += 1;
        Ok(())
    }
    fn warn(&mut self, m: &str) {
        self.warnings.push(m.into());
    }
}

fn inputs(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

/// Builds `template` into a fresh folder; returns what was written and every row in order.
fn build(
    template: &str,
    given: Value,
    llm: Option<&dyn ChatClient>,
) -> Result<(Written, Vec<Value>), LabError> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    let (def, inputs) = dataset::check(template, &inputs(given))?;
    let written = dataset::build(&def, &inputs, &out, llm, &mut Quiet::default())?;
    let rows = read_rows(&out);
    assert_eq!(
        written.n_train,
        split_index(written.rows),
        "90/10 split of {template}"
    );
    assert_eq!(
        written.n_train + written.n_valid,
        written.rows.max(2).min(written.rows + 1)
    );
    let summary = inspect_data_dir(&out)
        .unwrap_or_else(|e| panic!("{template}: the fine-tune loader refuses the rows: {e}"));
    assert_eq!(
        (summary.n_train, summary.n_valid),
        (written.n_train, written.n_valid)
    );
    Ok((written, rows))
}

fn read_rows(dir: &Path) -> Vec<Value> {
    let mut rows = Vec::new();
    for name in ["train.jsonl", "valid.jsonl"] {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        assert!(text.ends_with('\n'), "{name} ends with a newline");
        rows.extend(
            text.lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap()),
        );
    }
    rows
}

fn chat(user: &str, assistant: &str) -> Value {
    json!({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]})
}

#[test]
fn qa_pairs_parse_multiline_blocks_and_skip_incomplete_ones() {
    let pairs = "Q: What is Rust?\nA: A language.\nIt is fast.\n\nq: Why?\na: Safety.\nQ: dangling question\n";
    let (w, rows) = build("sft_qa_pairs", json!({"pairs_text": pairs}), None).unwrap();
    assert_eq!(w.rows, 2);
    assert_eq!(rows[0], chat("What is Rust?", "A language.\nIt is fast."));
    assert_eq!(rows[1], chat("Why?", "Safety."));
}

#[test]
fn ten_pairs_split_nine_and_one() {
    let pairs: String = (0..10).map(|i| format!("Q: q{i}\nA: a{i}\n")).collect();
    let (w, rows) = build("sft_qa_pairs", json!({"pairs_text": pairs}), None).unwrap();
    assert_eq!((w.rows, w.n_train, w.n_valid), (10, 9, 1));
    assert_eq!(rows[9], chat("q9", "a9"));
}

#[test]
fn zero_rows_is_the_specs_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (def, inputs) = dataset::check(
        "sft_qa_pairs",
        &inputs(json!({"pairs_text": "no pairs here"})),
    )
    .unwrap();
    let e = dataset::build(&def, &inputs, dir.path(), None, &mut Quiet::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "generator produced 0 rows — check your inputs"
    );
    assert!(!dir.path().join("train.jsonl").exists());
}

#[test]
fn preference_csv_keeps_complete_rows_with_quoted_fields() {
    let csv = "prompt,chosen,rejected\n\"Say hi, politely\",Hello!,go away\nq2,,r\n\"multi\nline\",c3,r3\n";
    let (w, rows) = build("dpo_pref_pairs", json!({"csv_text": csv}), None).unwrap();
    assert_eq!(w.rows, 2);
    assert_eq!(
        rows[0],
        json!({"prompt": "Say hi, politely", "chosen": "Hello!", "rejected": "go away"})
    );
    assert_eq!(rows[1]["prompt"], "multi\nline");
    let e = build("dpo_pref_pairs", json!({"csv_text": "a,b\n1,2\n"}), None).unwrap_err();
    assert!(e.to_string().contains("\"prompt\" column"), "{e}");
}

#[test]
fn code_completion_splits_python_at_definitions_reproducibly() {
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir(src.path().join("pkg")).unwrap();
    let a = "import os\n\ndef first(x):\n    return x * 2 + 1  # doubled\n\nclass Second:\n    def method(self):\n        return 'a longer body here'\n";
    std::fs::write(src.path().join("pkg/a.py"), a).unwrap();
    std::fs::write(
        src.path().join("b.py"),
        "async def third():\n    await something_long_enough()\n",
    )
    .unwrap();
    std::fs::write(
        src.path().join("notes.txt"),
        "def not_python(): pass and more text",
    )
    .unwrap();
    let given = json!({"src_dir": src.path().to_str().unwrap()});
    let (w, rows) = build("code_completion", given.clone(), None).unwrap();
    // b.py sorts before pkg/a.py; a.py's head ("import os") is under 30 characters.
    assert_eq!(w.rows, 3);
    let whole: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{}{}",
                r["prompt"].as_str().unwrap(),
                r["completion"].as_str().unwrap()
            )
        })
        .collect();
    assert!(whole[0].starts_with("async def third"));
    assert!(whole[1].starts_with("def first") && whole[2].starts_with("class Second"));
    for r in &rows {
        let (p, c) = (
            r["prompt"].as_str().unwrap(),
            r["completion"].as_str().unwrap(),
        );
        let n = p.chars().count() + c.chars().count();
        assert!(
            p.chars().count() >= n / 4 && p.chars().count() <= 3 * n / 4,
            "split in the middle half"
        );
    }
    assert_eq!(
        build("code_completion", given, None).unwrap().1,
        rows,
        "same seed, same rows"
    );
    let capped = build(
        "code_completion",
        json!({"src_dir": src.path().to_str().unwrap(), "max_pairs": 1}),
        None,
    )
    .unwrap();
    assert_eq!(capped.0.rows, 1);
    let e = build(
        "code_completion",
        json!({"src_dir": "/nonexistent/dir"}),
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("is not a folder"));
}

#[test]
fn format_conversion_renames_fields_and_names_a_bad_line() {
    let jsonl = "{\"q\": \"hi\", \"r\": \"hello\"}\n\n{\"q\": \"only one\"}\n{\"q\": \"2\", \"r\": \"two\"}\n";
    let (w, rows) = build(
        "format_conversion",
        json!({"input_jsonl": jsonl, "user_key": "q", "assistant_key": "r"}),
        None,
    )
    .unwrap();
    assert_eq!(w.rows, 2);
    assert_eq!(rows[0], chat("hi", "hello"));
    let e = build(
        "format_conversion",
        json!({"input_jsonl": "{\"input\":1}\nnot json"}),
        None,
    )
    .unwrap_err();
    assert!(
        e.to_string().starts_with("inputs.input_jsonl: line 2"),
        "{e}"
    );
}

#[test]
fn inputs_are_checked_against_the_template() {
    let e = |t: &str, v: Value| dataset::check(t, &inputs(v)).unwrap_err().to_string();
    assert!(e("nope", json!({})).starts_with("template_id: unknown template \"nope\""));
    assert_eq!(
        e("sft_qa_pairs", json!({})),
        "inputs.pairs_text: is required"
    );
    assert_eq!(
        e("sft_qa_pairs", json!({"pairs_text": "  "})),
        "inputs.pairs_text: is required"
    );
    assert!(
        e("sft_qa_pairs", json!({"pairs_text": "x", "extra": 1}))
            .starts_with("inputs.extra: not an input")
    );
    assert!(
        e(
            "self_instruct",
            json!({"seeds": "a", "variants_per_seed": "many"})
        )
        .starts_with("inputs.variants_per_seed: must be an integer")
    );
    assert!(
        e(
            "self_instruct",
            json!({"seeds": "a", "variants_per_seed": -1})
        )
        .starts_with("inputs.variants_per_seed")
    );
    assert!(
        e("self_instruct", json!({"seeds": ["a"]})).starts_with("inputs.seeds: must be a string")
    );
    let (_, ok) = dataset::check(
        "self_instruct",
        &inputs(json!({"seeds": "a", "variants_per_seed": "3"})),
    )
    .unwrap();
    assert_eq!(ok.number("variants_per_seed"), 3);
    let defs = dataset::templates::all();
    assert_eq!(defs.len(), 13);
    assert_eq!(defs.iter().filter(|d| d.llm).count(), 8);
}

#[test]
fn an_llm_template_without_a_model_says_so() {
    let e = build("cot_synthesis", json!({"questions": "q"}), None).unwrap_err();
    assert!(e.to_string().contains("needs a served chat model"), "{e}");
}

#[test]
fn style_transfer_rewrites_each_paragraph() {
    let llm = Scripted::new(vec![("Rewrite this text", text("Yo, styled."))]);
    let given =
        json!({"reference_samples": "s1\n---\ns2", "raw_text": "para one\nstill one\n\npara two"});
    let (w, rows) = build("style_transfer", given, Some(&llm)).unwrap();
    assert_eq!((w.rows, llm.calls()), (2, 2));
    assert_eq!(
        rows[0],
        json!({"prompt": "para one\nstill one", "completion": "Yo, styled."})
    );
    let sent = llm.seen.lock().unwrap()[0].messages[1]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(sent.contains("s1\n\n---\n\ns2") && sent.ends_with("para one\nstill one"));
}

#[test]
fn self_instruct_reads_numbered_variants_and_answers_each() {
    let llm = Scripted::new(vec![
        (
            "numbered list",
            text("Sure:\n1. Write a haiku\n2) **Write a limerick**\n3. Write a sonnet\n"),
        ),
        ("Write a", text("Here it is.")),
    ]);
    let (w, rows) = build(
        "self_instruct",
        json!({"seeds": "Write a poem\n\n", "variants_per_seed": 2}),
        Some(&llm),
    )
    .unwrap();
    assert_eq!((w.rows, llm.calls()), (2, 3));
    assert_eq!(rows[0], chat("Write a haiku", "Here it is."));
    assert_eq!(rows[1], chat("Write a limerick", "Here it is."));
}

#[test]
fn prompt_reconstruction_pairs_the_inferred_prompt_with_the_target() {
    let llm = Scripted::new(vec![("Write the one request", text("Explain caching."))]);
    let given = json!({"target_text": "Caching stores results.", "tone": "dry", "avoid": "jargon"});
    let (_, rows) = build("prompt_reconstruction", given, Some(&llm)).unwrap();
    assert_eq!(rows[0], chat("Explain caching.", "Caching stores results."));
    let sent = llm.seen.lock().unwrap()[0].messages[0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        sent.contains("direct technical blog style; its tone is dry; avoid jargon"),
        "{sent}"
    );
}

#[test]
fn multi_turn_chat_alternates_and_swaps_roles_for_the_user() {
    let llm = Scripted::new(vec![]);
    let (w, rows) = build(
        "multi_turn_chat",
        json!({"seeds": "Hi there\nTell me a fact", "turns": 2}),
        Some(&llm),
    )
    .unwrap();
    assert_eq!((w.rows, llm.calls()), (2, 6));
    let m = rows[0]["messages"].as_array().unwrap();
    let roles: Vec<&str> = m.iter().map(|t| t["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"]);
    assert_eq!(m[0]["content"], "You are a helpful, concise assistant.");
    // The simulated user's request sees the assistant's words as the user's.
    let user_turn = &llm.seen.lock().unwrap()[1];
    assert_eq!(user_turn.messages[1]["role"], "assistant");
    assert_eq!(user_turn.messages[2]["role"], "user");
}

#[test]
fn tool_traces_insert_mocked_results_until_an_answer() {
    let call = json!({"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}});
    let llm = Scripted::new(vec![
        ("sunny", text("It is sunny in Paris.")),
        (
            "Paris",
            ChatReply {
                content: String::new(),
                tool_calls: vec![call],
            },
        ),
        (
            "again",
            ChatReply {
                content: String::new(),
                tool_calls: vec![json!({"id": "c", "function": {"name": "again"}})],
            },
        ),
    ]);
    let tools = json!([{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]);
    let given = json!({"tools_json": tools.to_string(), "scenarios": "Weather in Paris?\nagain and again", "mock_results": "{\"weather\": \"sunny, 21C\"}"});
    let dir = tempfile::tempdir().unwrap();
    let (def, inputs) = dataset::check("tool_use_traces", &inputs(given)).unwrap();
    let mut quiet = Quiet::default();
    let w = dataset::build(&def, &inputs, dir.path(), Some(&llm), &mut quiet).unwrap();
    assert_eq!(w.rows, 1);
    assert!(quiet.warnings[0].starts_with("1 scenario(s) dropped"));
    let row = &read_rows(dir.path())[0];
    let m = row["messages"].as_array().unwrap();
    assert_eq!(m[1]["tool_calls"][0]["id"], "call_1");
    assert_eq!(
        (
            m[2]["role"].as_str(),
            m[2]["tool_call_id"].as_str(),
            m[2]["content"].as_str()
        ),
        (Some("tool"), Some("call_1"), Some("sunny, 21C"))
    );
    assert_eq!(
        m[3],
        json!({"role": "assistant", "content": "It is sunny in Paris."})
    );
    assert_eq!(row["tools"], tools);
    assert!(inspect_data_dir(dir.path()).is_ok());
    let e = build(
        "tool_use_traces",
        json!({"tools_json": "[]", "scenarios": "x"}),
        Some(&llm),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("inputs.tools_json: must be a non-empty JSON array")
    );
}

#[test]
fn rag_qa_chunks_documents_and_grounds_each_question() {
    let llm = Scripted::new(vec![(
        "questions that this text answers",
        text("Q: What is X?\nA: X is Y.\nQ: Second?\nA: Yes.\nQ: Third?\nA: Dropped."),
    )]);
    let para = "A paragraph of about forty characters.";
    let docs = format!("{para}\n\n{para}\n\n{para}\n\n{para}\n\n{para}\n---\nshort doc");
    let (w, rows) = build(
        "rag_qa",
        json!({"documents": docs, "questions_per_chunk": 2, "min_chunk_chars": 60}),
        Some(&llm),
    )
    .unwrap();
    // Document 1: two chunks of two paragraphs (the fifth joins the second); document 2: one.
    assert_eq!((llm.calls(), w.rows), (3, 6));
    let user = rows[0]["messages"][0]["content"].as_str().unwrap();
    assert!(
        user.starts_with(&format!("Context:\n{para}\n\n{para}"))
            && user.ends_with("Question: What is X?")
    );
    assert_eq!(rows[0]["messages"][1]["content"], "X is Y.");
}

#[test]
fn cot_synthesis_answers_each_question_with_the_domain_hint() {
    let llm = Scripted::new(vec![("2+2", text("2 and 2 make 4.\nAnswer: 4"))]);
    let (w, rows) = build(
        "cot_synthesis",
        json!({"questions": "2+2?\n3+3?", "category": "arithmetic"}),
        Some(&llm),
    )
    .unwrap();
    assert_eq!(w.rows, 2);
    assert_eq!(rows[0], chat("2+2?", "2 and 2 make 4.\nAnswer: 4"));
    let system = llm.seen.lock().unwrap()[0].messages[0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(system.starts_with("The questions are about arithmetic."));
}

#[test]
fn verified_code_keeps_code_whose_asserts_pass() {
    let good = "```python\ndef add(a, b):\n    return a + b\nassert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(-1, 1) == 0\n```";
    let llm = Scripted::new(vec![
        ("add", text(good)),
        ("broken", text("```python\nassert 1 == 2\n```")),
        ("untested", text("```python\ndef f():\n    return 1\n```")),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let (def, inputs) = dataset::check(
        "verified_code",
        &inputs(json!({"specs": "add two numbers\nbroken thing\nuntested f"})),
    )
    .unwrap();
    let mut quiet = Quiet::default();
    let python = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let w = dataset::build(&def, &inputs, dir.path(), Some(&llm), &mut quiet).unwrap();
    let rows = read_rows(dir.path());
    if python {
        assert_eq!(w.rows, 1);
        assert_eq!(rows[0]["verified"], true);
        assert!(
            quiet.warnings[0].starts_with("2 answer(s) dropped"),
            "{:?}",
            quiet.warnings
        );
    } else {
        assert_eq!(w.rows, 3);
        assert_eq!(rows[0]["verified"], false);
    }
    assert!(
        rows[0]["messages"][1]["content"]
            .as_str()
            .unwrap()
            .starts_with("```python\ndef add")
    );
    let (w, rows) = build(
        "verified_code",
        json!({"specs": "add two numbers", "language": "rust"}),
        Some(&llm),
    )
    .unwrap();
    assert_eq!((w.rows, rows[0]["verified"].clone()), (1, json!(false)));
}

mod fake_http;

/// Serves `/splits` and `/rows` of one fake dataset, as the hub's datasets API answers.
fn fake_datasets_api() -> String {
    fake_http::serve(|req| {
        let path = req.path;
        if path.starts_with("/splits") {
            let splits = [("other", "test"), ("default", "train")]
                .map(|(config, split)| json!({"dataset": "d", "config": config, "split": split}));
            return json!({ "splits": splits }).to_string();
        }
        assert!(path.contains("config=default"), "{path}");
        let offset: usize = (path.split("offset=").nth(1))
            .and_then(|s| s.split('&').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let rows: Vec<Value> = (offset..(offset + 100).min(150))
            .map(|i| {
                let text = format!("row {i} {}", "x".repeat(i % 3 * 10));
                let label = if i % 2 == 0 { "keep" } else { "drop" };
                json!({"row_idx": i, "row": {"text": text, "label": label}})
            })
            .collect();
        json!({"rows": rows, "num_rows_total": 150}).to_string()
    })
}

#[test]
fn hf_import_pages_filters_and_says_when_the_hub_is_unreachable() {
    // One test owns KILN_HF_DATASETS_URL: tests run on parallel threads of one process.
    // SAFETY: no other test of this binary reads or writes the environment.
    unsafe { std::env::set_var("KILN_HF_DATASETS_URL", fake_datasets_api()) };
    let given = json!({"hf_id": "d", "label_column": "label", "label_filter": "keep", "min_chars": 15, "max_rows": 0});
    let (w, rows) = build("hf_dataset_import", given, None).unwrap();
    // Even rows are kept; of those, i % 3 != 0 have 10+ extra characters (length ≥ 15).
    let expected = (0..150)
        .filter(|i| i % 2 == 0 && format!("row {i} {}", "x".repeat(i % 3 * 10)).len() >= 15)
        .count();
    assert_eq!(w.rows, expected);
    assert_eq!(rows[0], json!({"text": "row 2 xxxxxxxxxxxxxxxxxxxx"}));
    let (w, _) = build(
        "hf_dataset_import",
        json!({"hf_id": "d", "min_chars": 0, "max_rows": 120}),
        None,
    )
    .unwrap();
    assert_eq!(w.rows, 120, "max_rows caps across pages");
    let e = build(
        "hf_dataset_import",
        json!({"hf_id": "d", "split": "validation"}),
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("has no \"validation\" split"), "{e}");
    // SAFETY: as above.
    unsafe { std::env::set_var("KILN_HF_DATASETS_URL", "http://127.0.0.1:9") };
    let e = build("hf_dataset_import", json!({"hf_id": "wikitext"}), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(
            "the Hugging Face datasets API (http://127.0.0.1:9) is not reachable from this machine"
        ),
        "{e}"
    );
}
