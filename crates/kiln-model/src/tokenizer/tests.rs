use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use serde_json::Value;

use super::test_support::{reference_dir, test_model_path};
use super::{KilnTokenizer, tokenizer_from_gguf, tokenizer_from_metadata};
use crate::gguf::{GgufFile, MetaValue};

/// The SmolLM2 tokenizer built from the GGUF, shared by the tests (building it takes a moment).
pub(crate) fn smollm2_tokenizer() -> &'static KilnTokenizer {
    static TOK: OnceLock<KilnTokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let file = GgufFile::open(&test_model_path()).expect("open test model");
        tokenizer_from_gguf(file.header()).expect("tokenizer from GGUF")
    })
}

fn reference() -> Value {
    let path = reference_dir().join("tokenizer_reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("reference JSON")
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Every reference case: ids, vocabulary strings and decoded text.
fn check_reference_cases(tok: &KilnTokenizer) {
    let reference = reference();
    let cases = reference["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10);
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let want = ids_of(&case["ids"]);
        let got = tok.encode(text, false).expect("encode");
        assert_eq!(got, want, "ids of {text:?}");
        // This tokenizer adds no BOS, so add_special changes nothing.
        assert_eq!(
            tok.encode(text, true).expect("encode"),
            want,
            "ids of {text:?} with specials"
        );
        let tokens: Vec<String> = got
            .iter()
            .map(|&id| tok.token_to_piece(id).expect("piece"))
            .collect();
        let want_tokens: Vec<&str> = case["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|t| t.as_str().expect("token"))
            .collect();
        assert_eq!(tokens, want_tokens, "tokens of {text:?}");
        assert_eq!(
            tok.decode(&got, false).expect("decode"),
            case["decoded"].as_str().expect("decoded")
        );
        let bytes: Vec<u8> = got
            .iter()
            .flat_map(|&id| tok.token_bytes(id).expect("bytes"))
            .collect();
        assert_eq!(bytes, text.as_bytes(), "token bytes of {text:?}");
    }
    assert_eq!(
        tok.vocab_size(),
        reference["vocab_size"].as_u64().expect("vocab_size") as usize
    );
    assert_eq!(
        tok.bos_id(),
        Some(reference["bos_id"].as_u64().expect("bos") as u32)
    );
    assert_eq!(
        tok.eos_ids().first().copied(),
        Some(reference["eos_id"].as_u64().expect("eos") as u32)
    );
    assert!(!tok.add_bos());
}

#[test]
fn gguf_bpe_matches_reference() {
    let tok = smollm2_tokenizer();
    check_reference_cases(tok);
    assert_eq!(tok.id_of("<|im_start|>"), Some(1));
    assert_eq!(tok.bos_token().as_deref(), Some("<|im_start|>"));
    assert_eq!(tok.eos_token().as_deref(), Some("<|im_end|>"));
    assert!(tok.is_eog(2));
    // Control tokens are dropped when decoding with skip_special.
    let ids = tok
        .encode("<|im_start|>user\nhi<|im_end|>\n", false)
        .expect("encode");
    assert_eq!(tok.decode(&ids, true).expect("decode"), "user\nhi\n");
}

/// There is no SmolLM2 tokenizer.json on this machine, so the Hugging Face path is tested with
/// the GGUF-built tokenizer saved as one (the reference says the two vocabularies are equal).
#[test]
fn hf_folder_matches_reference() {
    let dir = std::env::temp_dir().join(format!("kiln-tokenizer-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    smollm2_tokenizer()
        .inner()
        .save(dir.join("tokenizer.json"), false)
        .expect("save tokenizer.json");
    let config = serde_json::json!({
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>", "special": true},
        "add_bos_token": false,
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("write config");
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [2, 0]}"#,
    )
    .expect("write gen");
    let tok = KilnTokenizer::from_hf_folder(&dir).expect("from_hf_folder");
    std::fs::remove_dir_all(&dir).ok();
    check_reference_cases(&tok);
    assert_eq!(tok.eos_ids(), &[2, 0]);
}

#[test]
fn hf_folder_missing_is_an_error() {
    let err = KilnTokenizer::from_hf_folder(Path::new("/nonexistent/kiln")).expect_err("no folder");
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

/// A tiny SentencePiece vocabulary: control tokens, 256 byte tokens, and pieces whose scores
/// make `hello` merge into `▁hello`.
pub(crate) fn spm_metadata(
    add_space_prefix: Option<bool>,
    add_bos: Option<bool>,
) -> BTreeMap<String, MetaValue> {
    let mut tokens: Vec<(String, f32, i32)> = vec![
        ("<unk>".into(), 0.0, 2),
        ("<s>".into(), 0.0, 3),
        ("</s>".into(), 0.0, 3),
    ];
    for b in 0..=255u8 {
        tokens.push((format!("<0x{b:02X}>"), 0.0, 6));
    }
    for (piece, score) in [
        ("▁", -5.0),
        ("h", -5.0),
        ("e", -5.0),
        ("l", -5.0),
        ("o", -5.0),
        ("w", -5.0),
        ("r", -5.0),
        ("d", -5.0),
        ("ll", -0.1),
        ("▁h", -0.2),
        ("▁he", -0.3),
        ("llo", -0.4),
        ("▁hello", -0.5),
        ("▁w", -0.6),
    ] {
        tokens.push((piece.into(), score, 1));
    }
    let s = |v: &str| MetaValue::String(v.to_string());
    let mut meta = BTreeMap::new();
    meta.insert("tokenizer.ggml.model".into(), s("llama"));
    meta.insert(
        "tokenizer.ggml.tokens".into(),
        MetaValue::Array(tokens.iter().map(|t| s(&t.0)).collect()),
    );
    meta.insert(
        "tokenizer.ggml.scores".into(),
        MetaValue::Array(tokens.iter().map(|t| MetaValue::F32(t.1)).collect()),
    );
    meta.insert(
        "tokenizer.ggml.token_type".into(),
        MetaValue::Array(tokens.iter().map(|t| MetaValue::I32(t.2)).collect()),
    );
    meta.insert("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(1));
    meta.insert("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(2));
    meta.insert("tokenizer.ggml.unknown_token_id".into(), MetaValue::U32(0));
    if let Some(v) = add_space_prefix {
        meta.insert("tokenizer.ggml.add_space_prefix".into(), MetaValue::Bool(v));
    }
    if let Some(v) = add_bos {
        meta.insert("tokenizer.ggml.add_bos_token".into(), MetaValue::Bool(v));
    }
    meta
}

fn pieces(tok: &KilnTokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter()
        .map(|&id| tok.token_to_piece(id).expect("piece"))
        .collect()
}

#[test]
fn gguf_spm_defaults_prefix_space_bos_and_byte_fallback() {
    // No add_space_prefix / add_bos_token keys: llama.cpp's SentencePiece defaults (both on).
    let tok = tokenizer_from_metadata(&spm_metadata(None, None)).expect("spm tokenizer");
    assert!(tok.add_bos());
    let ids = tok.encode("hello world", true).expect("encode");
    assert_eq!(
        pieces(&tok, &ids),
        ["<s>", "▁hello", "▁w", "o", "r", "l", "d"]
    );
    assert_eq!(tok.decode(&ids, true).expect("decode"), "hello world");

    // é is not a piece: its two UTF-8 bytes come out as byte tokens and decode back.
    let ids = tok.encode("hé", false).expect("encode");
    assert_eq!(pieces(&tok, &ids), ["▁h", "<0xC3>", "<0xA9>"]);
    assert_eq!(tok.decode(&ids, false).expect("decode"), "hé");
    assert_eq!(tok.token_bytes(ids[1]), Some(vec![0xC3]));
    assert_eq!(tok.token_bytes(ids[0]), Some(b" h".to_vec()));

    // The prefix space also follows a special token, as in llama.cpp.
    let ids = tok.encode("<s>hello", false).expect("encode");
    assert_eq!(pieces(&tok, &ids), ["<s>", "▁hello"]);
    // encode() itself adds BOS even before a written one (llama.cpp does too);
    // chat_template::prompt_ids is where a written BOS turns add_special off.
    let ids = tok.encode("<s>hello", true).expect("encode");
    assert_eq!(pieces(&tok, &ids), ["<s>", "<s>", "▁hello"]);
}

#[test]
fn gguf_spm_without_prefix_space() {
    let tok =
        tokenizer_from_metadata(&spm_metadata(Some(false), Some(false))).expect("spm tokenizer");
    assert!(!tok.add_bos());
    let ids = tok.encode("hello world", true).expect("encode");
    assert_eq!(
        pieces(&tok, &ids),
        ["h", "e", "llo", "▁w", "o", "r", "l", "d"]
    );
    assert_eq!(tok.decode(&ids, false).expect("decode"), "hello world");
    // A leading space in the text is kept, not stripped, when no prefix was added.
    let ids = tok.encode(" hello", false).expect("encode");
    assert_eq!(pieces(&tok, &ids), ["▁hello"]);
    assert_eq!(tok.decode(&ids, false).expect("decode"), " hello");
}

#[test]
fn unknown_tokenizer_model_is_an_error() {
    let mut meta = spm_metadata(None, None);
    meta.insert(
        "tokenizer.ggml.model".into(),
        MetaValue::String("rwkv".into()),
    );
    let err = tokenizer_from_metadata(&meta).expect_err("rwkv");
    assert!(err.to_string().contains("rwkv"), "{err}");
}

#[test]
fn every_known_pre_tokenizer_compiles() {
    for name in [
        "",
        "default",
        "llama3",
        "llama-bpe",
        "dbrx",
        "qwen2",
        "qwen35",
        "gpt-4o",
        "tekken",
        "smollm",
        "gpt-2",
        "falcon",
        "deepseek-coder",
        "deepseek-v3",
        "bloom",
        "viking",
    ] {
        let spec = super::pretok::spec_for(name).unwrap_or_else(|| panic!("{name} unknown"));
        super::pretok::build(&spec).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert!(super::pretok::spec_for("no-such-pre").is_none());

    // Llama 3 keeps up to three digits together and its contractions case-insensitive.
    let spec = super::pretok::spec_for("llama3").expect("llama3");
    assert!(spec.ignore_merges && spec.add_bos_default);
    let mut tok = tokenizers::Tokenizer::new(tokenizers::models::bpe::BPE::default());
    tok.with_pre_tokenizer(Some(super::pretok::build(&spec).expect("build")));
    let words = pre_tokenize(&tok, "Hello world 12345 I'M\n\nok");
    assert_eq!(
        words,
        ["Hello", "Ġworld", "Ġ", "123", "45", "ĠI", "'M", "ĊĊ", "ok"]
    );
}

#[test]
fn unknown_pre_tokenizer_falls_back_to_gpt2() {
    let file = GgufFile::open(&test_model_path()).expect("open test model");
    let mut meta = file.header().metadata.clone();
    meta.insert(
        "tokenizer.ggml.pre".into(),
        MetaValue::String("no-such-pre".into()),
    );
    let tok = tokenizer_from_metadata(&meta).expect("builds with a warning");
    // GPT-2's pattern keeps digit runs together, unlike smollm's one-digit split (the words are
    // compared, since this vocabulary has no multi-digit tokens anyway).
    assert_eq!(
        tok.encode("Hello, world!", false).expect("encode"),
        [19556, 28, 905, 17]
    );
    assert_eq!(words(&tok, "a 123"), ["a", "Ġ123"]);
    assert_eq!(
        words(smollm2_tokenizer(), "a 123"),
        ["a", "Ġ", "1", "2", "3"]
    );
}

/// The pre-tokenizer's words of `text`.
fn words(tok: &KilnTokenizer, text: &str) -> Vec<String> {
    pre_tokenize(tok.inner(), text)
}

fn pre_tokenize(tok: &tokenizers::Tokenizer, text: &str) -> Vec<String> {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
    let pre = tok.get_pre_tokenizer().expect("pre-tokenizer");
    let mut pts = PreTokenizedString::from(text);
    pre.pre_tokenize(&mut pts).expect("pre-tokenize");
    pts.get_splits(OffsetReferential::Original, OffsetType::Byte)
        .into_iter()
        .map(|(w, _, _)| w.to_string())
        .collect()
}
