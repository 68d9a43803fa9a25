//! llama.cpp's `tokenizer.ggml.pre` names, as Hugging Face pre-tokenizers.
//!
//! llama.cpp (`src/llama-vocab.cpp`, `llm_tokenizer_bpe`) splits text with a list of regexes
//! applied in turn, each keeping both the matches and the text between them; that is a
//! `Split(regex, Isolated)` per regex in Hugging Face terms, followed by the byte-level mapping
//! without its own regex. Regexes are written as in the models' `tokenizer.json` (Oniguruma takes
//! `(?i:…)` and lookaheads) or as llama.cpp adapted them where those are equivalent.

use tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};

use crate::ModelError;

/// GPT-2's own pattern (also what `ByteLevel(use_regex=true)` uses).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's `tokenizer.json` pattern.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's `tokenizer.json` pattern (Llama 3's with single digits).
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5: Qwen2's with combining marks kept on letters.
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o / Llama 4 pattern.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Mistral's Tekken pattern.
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek-V3 / Hunyuan-dense main pattern.
const DEEPSEEK3: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

/// What a `tokenizer.ggml.pre` name means for building the tokenizer.
pub(crate) struct PreTokenizerSpec {
    /// The regexes, applied in order, each isolating its matches.
    pub regexes: Vec<&'static str>,
    /// Whole pre-tokenized words found in the vocabulary skip the merges (Llama 3, Tekken).
    pub ignore_merges: bool,
    /// llama.cpp's default for `add_bos` when the GGUF does not say.
    pub add_bos_default: bool,
}

/// The spec for a `tokenizer.ggml.pre` value; `None` when kiln does not know the name.
pub(crate) fn spec_for(pre: &str) -> Option<PreTokenizerSpec> {
    let spec = |regexes: Vec<&'static str>| PreTokenizerSpec {
        regexes,
        ignore_merges: false,
        add_bos_default: false,
    };
    Some(match pre {
        // llama.cpp's fallback when a converter wrote no name.
        "" | "default" => spec(vec![
            r"[\p{P}\$\+<=>\^~\|]+",
            GPT2,
            r"\p{N}+",
            r"[0-9][0-9][0-9]",
        ]),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreTokenizerSpec {
            regexes: vec![LLAMA3],
            ignore_merges: true,
            add_bos_default: true,
        },
        "dbrx" | "smaug-bpe" => spec(vec![LLAMA3]),
        "glm4" | "chatglm-bpe" => spec(vec![LLAMA3]),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan"
        | "solar-open" => spec(vec![QWEN2]),
        "qwen35" => spec(vec![QWEN35]),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => spec(vec![GPT4O]),
        "tekken" => PreTokenizerSpec {
            regexes: vec![TEKKEN],
            ignore_merges: true,
            add_bos_default: true,
        },
        // Digits one by one, then GPT-2 (= Digits(individual) + ByteLevel(use_regex) in HF).
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => spec(vec![r"\p{N}", GPT2]),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe"
        | "mpt" | "olmo" | "jais" | "exaone4" | "trillion" | "granite-docling" => spec(vec![GPT2]),
        "falcon" => spec(vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"]),
        "deepseek-coder" => spec(vec![
            r"[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            r"[一-龥ࠀ-一가-퟿]+",
            r"\p{N}",
        ]),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => {
            spec(vec![r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3])
        }
        "bloom" | "poro-chat" | "gpt3-finnish" => spec(vec![r" ?[^(\s|.,!?…。，、।۔،)]+"]),
        "viking" => spec(vec![r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"]),
        _ => return None,
    })
}

/// The Hugging Face pre-tokenizer for a spec: one isolating split per regex, then byte-level.
pub(crate) fn build(spec: &PreTokenizerSpec) -> Result<PreTokenizerWrapper, ModelError> {
    let mut parts: Vec<PreTokenizerWrapper> = Vec::with_capacity(spec.regexes.len() + 1);
    for re in &spec.regexes {
        let split = Split::new(
            SplitPattern::Regex((*re).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| ModelError::Tokenizer(format!("pre-tokenizer regex {re:?}: {e}")))?;
        parts.push(split.into());
    }
    // The regexes above did the splitting; ByteLevel only maps bytes to its printable alphabet.
    parts.push(ByteLevel::new(false, true, false).into());
    Ok(Sequence::new(parts).into())
}
