//! Loading whole files: a small byte-level tokenizer built here (every byte one token, ChatML
//! special tokens), SmolLM2's chat template, and the starter model's own tokenizer when it has
//! been downloaded (CI downloads it before the tests).

use std::path::{Path, PathBuf};

use kiln_model::chat_template::ChatTemplate;
use kiln_model::gguf::GgufFile;
use kiln_model::tokenizer::{KilnTokenizer, tokenizer_from_gguf};
use serde_json::json;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::{AddedToken, Tokenizer, decoders, pre_tokenizers};

use super::*;

/// SmolLM2-135M-Instruct's `tokenizer.chat_template`.
const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
const BOS: u32 = 0;
const EOS: u32 = 2;

/// A byte-level tokenizer with no merges: ids 0–2 are [`SPECIALS`], then one id a byte, so a
/// text of n ASCII characters is n tokens. BOS is `<|endoftext|>`, EOS `<|im_end|>`.
fn tokenizer(dir: &Path, add_bos: bool) -> KilnTokenizer {
    let mut chars: Vec<char> = pre_tokenizers::byte_level::ByteLevel::alphabet()
        .into_iter()
        .collect();
    chars.sort_unstable();
    let specials = SPECIALS.iter().map(|s| s.to_string());
    let vocab: Vocab = specials
        .chain(chars.iter().map(char::to_string))
        .enumerate()
        .map(|(i, s)| (s, i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, vec![])
        .build()
        .unwrap();
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(pre_tokenizers::byte_level::ByteLevel::new(
        false, true, true,
    )));
    tok.with_decoder(Some(decoders::byte_level::ByteLevel::default()));
    let added: Vec<AddedToken> = SPECIALS
        .iter()
        .map(|s| AddedToken::from(*s, true))
        .collect();
    tok.add_special_tokens(added).unwrap();
    let dir = dir.join(format!("tok-{add_bos}"));
    std::fs::create_dir_all(&dir).unwrap();
    tok.save(dir.join("tokenizer.json"), false).unwrap();
    let config =
        json!({"bos_token": SPECIALS[0], "eos_token": SPECIALS[2], "add_bos_token": add_bos});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    KilnTokenizer::from_hf_folder(&dir).unwrap()
}

fn smollm2_template() -> ChatTemplate {
    ChatTemplate::new(SMOLLM2_TEMPLATE, Some(SPECIALS[1]), Some(SPECIALS[2])).unwrap()
}

/// Writes `lines` joined by newlines as `dir/name`.
fn write(dir: &Path, name: &str, lines: &[&str]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

/// The (line, reason) of a data error; anything else fails the test.
fn data_err(result: Result<Dataset, LabError>) -> (usize, String) {
    match result {
        Err(LabError::Data { line, reason, .. }) => (line, reason),
        other => panic!("expected a data error, got {other:?}"),
    }
}

fn sft(ds: &Dataset) -> &[SftExample] {
    match &ds.examples {
        Examples::Sft(v) => v,
        Examples::Preference(_) => panic!("expected SFT examples"),
    }
}

fn bytes(s: &str, tok: &KilnTokenizer) -> Vec<u32> {
    tok.encode(s, false).unwrap()
}

#[test]
fn text_and_prompt_completion_without_a_template() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), true);
    let tk = Tokenize {
        tokenizer: &tok,
        template: None,
        max_seq_length: 512,
    };
    let text = write(dir.path(), "t.jsonl", &[r#"{"text":"abc"}"#]);
    let ds = load_jsonl(&text, &tk).unwrap();
    assert_eq!(ds.format, DataFormat::Text);
    let want: Vec<u32> = [vec![BOS], bytes("abc", &tok), vec![EOS]].concat();
    assert_eq!(
        sft(&ds),
        [SftExample {
            tokens: want,
            prompt_len: 0
        }]
    );

    let pc = write(
        dir.path(),
        "pc.jsonl",
        &[r#"{"prompt":"Q:","completion":"yes"}"#],
    );
    let ds = load_jsonl(&pc, &tk).unwrap();
    assert_eq!(ds.format, DataFormat::PromptCompletion);
    let want: Vec<u32> = [vec![BOS], bytes("Q:", &tok), bytes("yes", &tok), vec![EOS]].concat();
    assert_eq!(
        sft(&ds),
        [SftExample {
            tokens: want,
            prompt_len: 3
        }]
    );

    // A text that already ends with EOS does not get a second one.
    let own = write(dir.path(), "own.jsonl", &[r#"{"text":"ab<|im_end|>"}"#]);
    let tokens = sft(&load_jsonl(&own, &tk).unwrap())[0].tokens.clone();
    assert_eq!(tokens, [vec![BOS], bytes("ab", &tok), vec![EOS]].concat());
}

#[test]
fn preference_pairs_share_the_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), false);
    let tk = Tokenize {
        tokenizer: &tok,
        template: None,
        max_seq_length: 512,
    };
    let path = write(
        dir.path(),
        "p.jsonl",
        &[r#"{"prompt":"P","chosen":"good","rejected":"bad"}"#],
    );
    let ds = load_jsonl(&path, &tk).unwrap();
    assert_eq!(ds.format, DataFormat::Preference);
    let Examples::Preference(pairs) = &ds.examples else {
        panic!("expected pairs");
    };
    let side = |answer: &str| SftExample {
        tokens: [bytes("P", &tok), bytes(answer, &tok), vec![EOS]].concat(),
        prompt_len: 1,
    };
    assert_eq!(
        pairs,
        &[PreferenceExample {
            chosen: side("good"),
            rejected: side("bad")
        }]
    );
    assert_eq!(ds.examples.lengths(), [6]);
}

/// The prompt tokens must decode to the rendered prompt and the loss tokens to the answer with
/// the turn's end, for a two-turn chat rendered by `template`.
fn check_chat_split(tok: &KilnTokenizer, template: &ChatTemplate) {
    let dir = tempfile::tempdir().unwrap();
    let row = json!({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ]});
    let path = write(dir.path(), "m.jsonl", &[&row.to_string()]);
    let tk = Tokenize {
        tokenizer: tok,
        template: Some(template),
        max_seq_length: 4096,
    };
    let ds = load_jsonl(&path, &tk).unwrap();
    assert_eq!(ds.format, DataFormat::Messages);
    let ex = &sft(&ds)[0];
    let turns = row["messages"].as_array().unwrap();
    let prompt = template.render(&turns[..2], None, true, None).unwrap();
    let (head, tail) = ex.tokens.split_at(ex.prompt_len);
    assert_eq!(tok.decode(head, false).unwrap(), prompt);
    assert_eq!(tok.decode(tail, false).unwrap(), "Paris.<|im_end|>\n");
    assert_eq!(tok.decode(tail, true).unwrap().trim(), "Paris.");
}

#[test]
fn messages_loss_starts_at_the_final_turn() {
    let dir = tempfile::tempdir().unwrap();
    check_chat_split(&tokenizer(dir.path(), false), &smollm2_template());
}

#[test]
fn messages_loss_starts_at_the_final_turn_on_the_starter_model() {
    let Some(path) = starter() else {
        eprintln!("skipped: the starter model is not downloaded (run `kiln pull`)");
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let tok = tokenizer_from_gguf(file.header()).unwrap();
    let template = ChatTemplate::from_gguf(file.header(), &tok)
        .unwrap()
        .unwrap();
    check_chat_split(&tok, &template);
}

/// The starter GGUF where `kiln pull` puts it (`$KILN_TEST_MODEL` or `$KILN_CACHE_DIR` first).
fn starter() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KILN_TEST_MODEL") {
        return Some(PathBuf::from(p));
    }
    let cache = match std::env::var_os("KILN_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/kiln"),
    };
    let path = cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    path.is_file().then_some(path)
}

#[test]
fn prompt_completion_goes_through_the_template() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), false);
    let template = smollm2_template();
    let tk = Tokenize {
        tokenizer: &tok,
        template: Some(&template),
        max_seq_length: 4096,
    };
    let path = write(
        dir.path(),
        "pc.jsonl",
        &[r#"{"prompt":"Hi","completion":"Hello"}"#],
    );
    let ex = sft(&load_jsonl(&path, &tk).unwrap())[0].clone();
    let (head, tail) = ex.tokens.split_at(ex.prompt_len);
    assert!(
        tok.decode(head, false)
            .unwrap()
            .ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    );
    assert_eq!(tok.decode(tail, false).unwrap(), "Hello<|im_end|>\n");
}

#[test]
fn prompt_len_is_the_common_prefix_when_the_prompt_is_not_a_prefix() {
    // Renders a user turn in capitals once a reply follows it: the renderings part after "S|".
    let source = "S|{% for m in messages %}{% if m.role == 'user' %}{{ 'U:' if not loop.last else 'u:' }}{{ m.content }}|{% else %}A:{{ m.content }}{% endif %}{% endfor %}{% if add_generation_prompt %}A:{% endif %}";
    let template = ChatTemplate::new(source, None, None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), false);
    let tk = Tokenize {
        tokenizer: &tok,
        template: Some(&template),
        max_seq_length: 64,
    };
    let row = json!({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]});
    let path = write(dir.path(), "m.jsonl", &[&row.to_string()]);
    let ex = sft(&load_jsonl(&path, &tk).unwrap())[0].clone();
    assert_eq!(tok.decode(&ex.tokens, false).unwrap(), "S|U:q|A:a");
    assert_eq!(ex.prompt_len, 2);
}

#[test]
fn messages_without_a_template_name_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), false);
    let tk = Tokenize {
        tokenizer: &tok,
        template: None,
        max_seq_length: 64,
    };
    let row = r#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}"#;
    let path = write(dir.path(), "m.jsonl", &["", row]);
    let (line, reason) = data_err(load_jsonl(&path, &tk));
    assert_eq!(line, 2);
    assert!(reason.contains("no chat template"), "{reason}");
}

#[test]
fn a_malformed_row_reports_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), false);
    let tk = Tokenize {
        tokenizer: &tok,
        template: Some(&smollm2_template()),
        max_seq_length: 64,
    };
    let good = r#"{"text":"fine"}"#;
    let cases: [(&str, &str); 7] = [
        (r#"{"text":"unterminated}"#, "invalid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (r#"{"input":"x"}"#, "unknown row format"),
        (r#"{"text":["x"]}"#, "`text` must be a string"),
        (r#"{"messages":[{"role":"user","content":"q"}]}"#, "format"),
        ("\u{1}", "invalid JSON"),
        (r#"{"text":"a","image":"x.png"}"#, "vision"),
    ];
    for (bad, want) in cases {
        let path = write(dir.path(), "bad.jsonl", &[good, "", "  ", bad, good]);
        let err = load_jsonl(&path, &tk).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("{}:4: ", path.display())),
            "{bad}: {err}"
        );
        let (line, reason) = data_err(Err(err));
        assert_eq!(line, 4, "{bad}");
        assert!(reason.contains(want), "{bad}: {reason}");
    }
    std::fs::write(
        dir.path().join("utf8.jsonl"),
        b"{\"text\":\"a\"}\n{\"text\":\"\xff\"}\n",
    )
    .unwrap();
    let (line, reason) = data_err(load_jsonl(&dir.path().join("utf8.jsonl"), &tk));
    assert_eq!((line, reason.contains("UTF-8")), (2, true), "{reason}");
}

#[test]
fn mixed_formats_name_the_first_differing_line() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), false);
    let tk = Tokenize {
        tokenizer: &tok,
        template: None,
        max_seq_length: 64,
    };
    let path = write(
        dir.path(),
        "mixed.jsonl",
        &[
            r#"{"prompt":"a","completion":"b"}"#,
            r#"{"prompt":"c","completion":"d"}"#,
            r#"{"text":"e"}"#,
            r#"{"prompt":"f","chosen":"g","rejected":"h"}"#,
        ],
    );
    let (line, reason) = data_err(load_jsonl(&path, &tk));
    assert_eq!(line, 3);
    assert!(
        reason.contains("`text`") && reason.contains("line 1 is `prompt_completion`"),
        "{reason}"
    );
    assert_eq!(data_err(Err(inspect_data_dir(&path).unwrap_err())).0, 3);
}

#[test]
fn truncation_keeps_the_head_and_drops_rows_without_a_loss_token() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), false);
    let tk = Tokenize {
        tokenizer: &tok,
        template: None,
        max_seq_length: 4,
    };
    let path = write(
        dir.path(),
        "trunc.jsonl",
        &[
            r#"{"prompt":"ab","completion":"c"}"#, // 2 + 1 + EOS = 4: kept whole
            r#"{"prompt":"ab","completion":"cdefg"}"#, // cut to a b c d: kept
            r#"{"prompt":"abcd","completion":"e"}"#, // cut to the prompt: dropped
            r#"{"prompt":"abcdefg","completion":"h"}"#, // cut inside the prompt: dropped
            r#"{"prompt":"a","completion":""}"#,   // a EOS: kept, untouched
        ],
    );
    let ds = load_jsonl(&path, &tk).unwrap();
    assert_eq!((ds.truncated, ds.dropped), (3, 2));
    let b = |s: &str| bytes(s, &tok);
    assert_eq!(
        sft(&ds),
        [
            SftExample {
                tokens: [b("abc"), vec![EOS]].concat(),
                prompt_len: 2
            },
            SftExample {
                tokens: b("abcd"),
                prompt_len: 2
            },
            SftExample {
                tokens: [b("a"), vec![EOS]].concat(),
                prompt_len: 1
            },
        ]
    );
    assert!(
        sft(&ds)
            .iter()
            .all(|e| e.tokens.len() <= 4 && e.n_targets() > 0)
    );

    // Text keeps its first tokens; one token alone predicts nothing.
    let tk = Tokenize {
        max_seq_length: 2,
        ..tk
    };
    let text = write(dir.path(), "text.jsonl", &[r#"{"text":"abc"}"#]);
    let ds = load_jsonl(&text, &tk).unwrap();
    assert_eq!((ds.truncated, ds.dropped), (1, 0));
    assert_eq!(
        sft(&ds),
        [SftExample {
            tokens: b("ab"),
            prompt_len: 0
        }]
    );

    let tk = Tokenize {
        max_seq_length: 4,
        ..tk
    };
    let long = write(
        dir.path(),
        "long.jsonl",
        &[
            r#"{"prompt":"abcd","completion":"e"}"#,
            r#"{"prompt":"abcdefg","completion":"h"}"#,
        ],
    );
    let (line, reason) = data_err(load_jsonl(&long, &tk));
    assert_eq!(line, 0);
    assert!(reason.contains("no usable examples"), "{reason}");
}

#[test]
fn preference_pairs_are_dropped_whole() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), false);
    let tk = Tokenize {
        tokenizer: &tok,
        template: None,
        max_seq_length: 4,
    };
    let path = write(
        dir.path(),
        "pairs.jsonl",
        &[
            r#"{"prompt":"abc","chosen":"d","rejected":"e"}"#,
            r#"{"prompt":"a","chosen":"bcdef","rejected":"g"}"#,
        ],
    );
    let ds = load_jsonl(&path, &tk).unwrap();
    // Both rows cut (a b c d / a b c e; a b c d / a g EOS), both keep a loss token on each side.
    assert_eq!((ds.truncated, ds.dropped, ds.examples.len()), (2, 0, 2));
    let tk = Tokenize {
        max_seq_length: 3,
        ..tk
    };
    let ds = load_jsonl(&path, &tk).unwrap();
    // The first pair's sides are all prompt now; the second's chosen still has "b" to learn.
    assert_eq!((ds.truncated, ds.dropped, ds.examples.len()), (2, 1, 1));
}

#[test]
fn empty_files_and_absurd_settings_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), false);
    let tk = Tokenize {
        tokenizer: &tok,
        template: None,
        max_seq_length: 64,
    };
    for lines in [&[][..], &["", "   ", "\r"][..]] {
        let path = write(dir.path(), "empty.jsonl", lines);
        let (line, reason) = data_err(load_jsonl(&path, &tk));
        assert_eq!(line, 0);
        assert!(reason.contains("no rows"), "{reason}");
    }
    let path = write(dir.path(), "one.jsonl", &[r#"{"text":"a"}"#]);
    let tk = Tokenize {
        max_seq_length: 1,
        ..tk
    };
    assert!(matches!(
        load_jsonl(&path, &tk),
        Err(LabError::Config { .. })
    ));
}

#[test]
fn files_over_one_gib_are_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.jsonl");
    // Sparse: no gigabyte is written.
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(rows::MAX_FILE_BYTES + 1).unwrap();
    let (line, reason) = data_err(Err(inspect_data_dir(&path).unwrap_err()));
    assert_eq!(line, 0);
    assert!(reason.contains("1 GiB"), "{reason}");
}

#[test]
fn data_dirs_hold_train_and_optional_valid() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path(), false);
    let tk = Tokenize {
        tokenizer: &tok,
        template: None,
        max_seq_length: 64,
    };
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let err = load_data_dir(&data, &tk).unwrap_err();
    assert!(err.to_string().contains("train.jsonl"), "{err}");

    let rows = [
        r#"{"text":"one"}"#,
        "",
        r#"{"text":"two"}"#,
        r#"{"text":"three"}"#,
    ];
    let train = write(&data, "train.jsonl", &rows);
    let (ds, valid) = load_data_dir(&data, &tk).unwrap();
    assert_eq!((ds.examples.len(), valid), (3, None));
    let summary = inspect_data_dir(&data).unwrap();
    assert_eq!(
        summary,
        DatasetSummary {
            n_train: 3,
            n_valid: 0,
            format: DataFormat::Text
        }
    );
    assert_eq!(
        serde_json::to_value(&summary).unwrap(),
        json!({"n_train": 3, "n_valid": 0, "format": "text"})
    );

    write(&data, "valid.jsonl", &[r#"{"text":"four"}"#]);
    let (_, valid) = load_data_dir(&data, &tk).unwrap();
    assert_eq!(valid.map(|v| v.examples.len()), Some(1));
    assert_eq!(inspect_data_dir(&data).unwrap().n_valid, 1);

    // A single file is a training set alone.
    let (ds, valid) = load_data_dir(&train, &tk).unwrap();
    assert_eq!((ds.examples.len(), valid.is_none()), (3, true));

    write(
        &data,
        "valid.jsonl",
        &[r#"{"prompt":"a","completion":"b"}"#],
    );
    let err = load_data_dir(&data, &tk).unwrap_err();
    assert!(err.to_string().contains("valid.jsonl:0: "), "{err}");
    assert!(inspect_data_dir(&data).is_err());

    assert!(matches!(
        inspect_data_dir(&dir.path().join("missing")),
        Err(LabError::Io { .. })
    ));
}
