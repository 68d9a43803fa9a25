//! Hostile model files: every malformed GGUF, safetensors file or `config.json` must produce an
//! error that names the file and the field at fault, never a panic or an absurd allocation.
//!
//! Files are written by hand into temp folders: a tiny (8-token, 4-wide, 1-layer) Llama in both
//! formats, then one thing broken per test. The real starter model is only read in part (its first
//! few MB) for the truncation tests.
//!
//! The fuzz seed corpus under `fuzz/seeds/` comes from the same builders; `fuzz_seeds_are_current`
//! checks it and rewrites it when `KILN_WRITE_FUZZ_SEEDS=1` is set.

use std::io::Read;
use std::path::{Path, PathBuf};

use kiln_model::ModelError;
use kiln_model::arch::Model;
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};
use kiln_model::files::ModelFiles;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// GGUF writer
// ---------------------------------------------------------------------------------------------

/// A GGUF metadata value, as written.
#[derive(Clone)]
enum Kv {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    StrArr(Vec<String>),
    F32Arr(Vec<f32>),
    I32Arr(Vec<i32>),
    /// A value type id and its encoded bytes, written verbatim (for impossible values).
    Raw(u32, Vec<u8>),
}

/// One tensor-directory entry plus its data. `offset: None` places it after the previous one.
#[derive(Clone)]
struct GgufTensor {
    name: String,
    dims: Vec<u64>,
    ty: u32,
    offset: Option<u64>,
    data: Vec<u8>,
}

/// A GGUF v3 file under construction; `build` lays it out with 32-byte alignment.
#[derive(Clone, Default)]
struct Gguf {
    kvs: Vec<(String, Kv)>,
    tensors: Vec<GgufTensor>,
}

const GGML_F32: u32 = 0;

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Gguf {
    fn set(&mut self, key: &str, v: Kv) -> &mut Self {
        match self.kvs.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = v,
            None => self.kvs.push((key.into(), v)),
        }
        self
    }

    fn remove_kv(&mut self, key: &str) -> &mut Self {
        self.kvs.retain(|(k, _)| k != key);
        self
    }

    fn f32_tensor(&mut self, name: &str, dims: &[u64]) -> &mut Self {
        let n: u64 = dims.iter().product();
        let data = (0..n)
            .flat_map(|i| value(i as usize).to_le_bytes())
            .collect();
        self.tensors.push(GgufTensor {
            name: name.into(),
            dims: dims.into(),
            ty: GGML_F32,
            offset: None,
            data,
        });
        self
    }

    fn tensor_mut(&mut self, name: &str) -> &mut GgufTensor {
        self.tensors
            .iter_mut()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
    }

    fn remove_tensor(&mut self, name: &str) -> &mut Self {
        self.tensors.retain(|t| t.name != name);
        self
    }

    fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut out, k);
            write_kv(&mut out, v);
        }
        let mut data = Vec::new();
        for t in &self.tensors {
            while !data.len().is_multiple_of(32) {
                data.push(0);
            }
            put_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ty.to_le_bytes());
            out.extend(t.offset.unwrap_or(data.len() as u64).to_le_bytes());
            data.extend(&t.data);
        }
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        out.extend(data);
        out
    }
}

fn write_kv(out: &mut Vec<u8>, v: &Kv) {
    let array = |out: &mut Vec<u8>, elem_ty: u32, n: usize| {
        out.extend(9u32.to_le_bytes());
        out.extend(elem_ty.to_le_bytes());
        out.extend((n as u64).to_le_bytes());
    };
    match v {
        Kv::U32(x) => {
            out.extend(4u32.to_le_bytes());
            out.extend(x.to_le_bytes());
        }
        Kv::F32(x) => {
            out.extend(6u32.to_le_bytes());
            out.extend(x.to_le_bytes());
        }
        Kv::Bool(x) => {
            out.extend(7u32.to_le_bytes());
            out.push(*x as u8);
        }
        Kv::Str(s) => {
            out.extend(8u32.to_le_bytes());
            put_str(out, s);
        }
        Kv::StrArr(items) => {
            array(out, 8, items.len());
            items.iter().for_each(|s| put_str(out, s));
        }
        Kv::F32Arr(items) => {
            array(out, 6, items.len());
            items.iter().for_each(|x| out.extend(x.to_le_bytes()));
        }
        Kv::I32Arr(items) => {
            array(out, 5, items.len());
            items.iter().for_each(|x| out.extend(x.to_le_bytes()));
        }
        Kv::Raw(ty, bytes) => {
            out.extend(ty.to_le_bytes());
            out.extend(bytes);
        }
    }
}

/// Deterministic small weights, so that a tiny model loads (and could run) without NaNs.
fn value(i: usize) -> f32 {
    ((i % 7) as f32 - 3.0) * 0.05
}

// ---------------------------------------------------------------------------------------------
// The tiny model, in both formats
// ---------------------------------------------------------------------------------------------

const VOCAB: usize = 8;
const HIDDEN: usize = 4;
const HEADS: usize = 2;
const KV_HEADS: usize = 1;
const HEAD_DIM: usize = 2;
const INTER: usize = 8;

/// (Hugging Face name, GGUF name, rows, cols) of every tensor a 1-layer tied Llama needs.
fn tiny_tensors() -> Vec<(&'static str, &'static str, usize, usize)> {
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    vec![
        (
            "model.embed_tokens.weight",
            "token_embd.weight",
            VOCAB,
            HIDDEN,
        ),
        ("model.norm.weight", "output_norm.weight", 1, HIDDEN),
        (
            "model.layers.0.input_layernorm.weight",
            "blk.0.attn_norm.weight",
            1,
            HIDDEN,
        ),
        (
            "model.layers.0.self_attn.q_proj.weight",
            "blk.0.attn_q.weight",
            q,
            HIDDEN,
        ),
        (
            "model.layers.0.self_attn.k_proj.weight",
            "blk.0.attn_k.weight",
            kv,
            HIDDEN,
        ),
        (
            "model.layers.0.self_attn.v_proj.weight",
            "blk.0.attn_v.weight",
            kv,
            HIDDEN,
        ),
        (
            "model.layers.0.self_attn.o_proj.weight",
            "blk.0.attn_output.weight",
            HIDDEN,
            q,
        ),
        (
            "model.layers.0.post_attention_layernorm.weight",
            "blk.0.ffn_norm.weight",
            1,
            HIDDEN,
        ),
        (
            "model.layers.0.mlp.gate_proj.weight",
            "blk.0.ffn_gate.weight",
            INTER,
            HIDDEN,
        ),
        (
            "model.layers.0.mlp.up_proj.weight",
            "blk.0.ffn_up.weight",
            INTER,
            HIDDEN,
        ),
        (
            "model.layers.0.mlp.down_proj.weight",
            "blk.0.ffn_down.weight",
            HIDDEN,
            INTER,
        ),
    ]
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// A tiny Llama GGUF with a byte-level BPE (`gpt2`) vocabulary.
fn tiny_gguf() -> Gguf {
    let mut g = Gguf::default();
    g.set("general.architecture", Kv::Str("llama".into()))
        .set("llama.embedding_length", Kv::U32(HIDDEN as u32))
        .set("llama.attention.head_count", Kv::U32(HEADS as u32))
        .set("llama.attention.head_count_kv", Kv::U32(KV_HEADS as u32))
        .set("llama.block_count", Kv::U32(1))
        .set("llama.feed_forward_length", Kv::U32(INTER as u32))
        .set("llama.context_length", Kv::U32(64))
        .set("llama.rope.freq_base", Kv::F32(10_000.0))
        .set("llama.attention.layer_norm_rms_epsilon", Kv::F32(1e-5))
        .set("tokenizer.ggml.model", Kv::Str("gpt2".into()))
        .set("tokenizer.ggml.pre", Kv::Str("smollm".into()))
        .set(
            "tokenizer.ggml.tokens",
            Kv::StrArr(strings(&[
                "H",
                "e",
                "l",
                "o",
                "He",
                "ll",
                "<|im_start|>",
                "<|im_end|>",
            ])),
        )
        .set(
            "tokenizer.ggml.token_type",
            Kv::I32Arr(vec![1, 1, 1, 1, 1, 1, 3, 3]),
        )
        .set(
            "tokenizer.ggml.merges",
            Kv::StrArr(strings(&["H e", "l l"])),
        )
        .set("tokenizer.ggml.bos_token_id", Kv::U32(6))
        .set("tokenizer.ggml.eos_token_id", Kv::U32(7))
        .set("tokenizer.ggml.add_bos_token", Kv::Bool(false));
    for (_, name, rows, cols) in tiny_tensors() {
        // GGUF lists the contiguous dimension first; a vector has just that one.
        let dims: Vec<u64> = if rows == 1 {
            vec![cols as u64]
        } else {
            vec![cols as u64, rows as u64]
        };
        g.f32_tensor(name, &dims);
    }
    g
}

/// The same model's vocabulary as a SentencePiece (`llama`) tokenizer, for fuzz seeds.
fn tiny_gguf_spm() -> Gguf {
    let mut g = tiny_gguf();
    g.remove_kv("tokenizer.ggml.merges")
        .remove_kv("tokenizer.ggml.pre")
        .set("tokenizer.ggml.model", Kv::Str("llama".into()))
        .set(
            "tokenizer.ggml.tokens",
            Kv::StrArr(strings(&[
                "<unk>",
                "<s>",
                "</s>",
                "<0x41>",
                "\u{2581}",
                "\u{2581}a",
                "a",
                "b",
            ])),
        )
        .set(
            "tokenizer.ggml.token_type",
            Kv::I32Arr(vec![2, 3, 3, 6, 1, 1, 1, 1]),
        )
        .set(
            "tokenizer.ggml.scores",
            Kv::F32Arr(vec![0.0, 0.0, 0.0, 0.0, -1.0, -0.5, -2.0, -3.0]),
        )
        .set("tokenizer.ggml.unknown_token_id", Kv::U32(0))
        .set("tokenizer.ggml.bos_token_id", Kv::U32(1))
        .set("tokenizer.ggml.eos_token_id", Kv::U32(2))
        .set("tokenizer.ggml.add_bos_token", Kv::Bool(true));
    g
}

/// One safetensors tensor: name, dtype string, shape, data.
type StTensor = (String, String, Vec<usize>, Vec<u8>);

/// A safetensors file: u64 LE header length, JSON header, then the data back to back.
fn safetensors(tensors: &[StTensor]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let start = data.len();
        data.extend(bytes);
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    safetensors_raw(&Value::Object(header).to_string(), &data)
}

fn safetensors_raw(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

fn f32_bytes(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| value(i).to_le_bytes()).collect()
}

fn tiny_st_tensors() -> Vec<StTensor> {
    tiny_tensors()
        .into_iter()
        .map(|(name, _, rows, cols)| {
            let shape = if rows == 1 {
                vec![cols]
            } else {
                vec![rows, cols]
            };
            (
                name.to_string(),
                "F32".to_string(),
                shape,
                f32_bytes(rows * cols),
            )
        })
        .collect()
}

fn tiny_config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": 1,
        "vocab_size": VOCAB,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2
    })
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn write_gguf(dir: &Path, bytes: &[u8]) -> PathBuf {
    let path = dir.join("model.gguf");
    std::fs::write(&path, bytes).expect("write gguf");
    path
}

/// A Hugging Face folder with `config` and one `model.safetensors`.
fn write_hf(dir: &Path, config: &Value, st: &[u8]) -> PathBuf {
    std::fs::write(dir.join("config.json"), config.to_string()).expect("write config");
    std::fs::write(dir.join("model.safetensors"), st).expect("write safetensors");
    dir.to_path_buf()
}

/// Opens and loads on the CPU backend: the whole path a server runs before serving.
fn open_and_load(path: &Path) -> Result<(), ModelError> {
    let files = ModelFiles::open(path)?;
    let backend = CpuBackend::new(CpuOptions::default());
    Model::load(&backend, files.tensors(), files.config.clone())?;
    Ok(())
}

/// Asserts that loading `path` fails with a message naming `file` and containing each of `words`.
#[track_caller]
fn assert_refused(path: &Path, file: &Path, words: &[&str]) -> String {
    let err = match open_and_load(path) {
        Ok(()) => panic!("{} loaded, but should have been refused", path.display()),
        Err(e) => e.to_string(),
    };
    let file_text = file.display().to_string();
    assert!(
        err.contains(&file_text),
        "error does not name {file_text}: {err}"
    );
    for w in words {
        assert!(err.contains(w), "error does not mention {w:?}: {err}");
    }
    err
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

// ---------------------------------------------------------------------------------------------
// Controls: the unbroken tiny models load, so each failure below is the one thing broken
// ---------------------------------------------------------------------------------------------

#[test]
fn tiny_gguf_loads() {
    let dir = tmp();
    let path = write_gguf(dir.path(), &tiny_gguf().build());
    open_and_load(&path).expect("tiny gguf");
    let files = ModelFiles::open(&path).expect("open");
    let header = files.gguf().expect("gguf").header();
    kiln_model::tokenizer::tokenizer_from_gguf(header).expect("gpt2 tokenizer");
    let spm = tiny_gguf_spm().build();
    let header = kiln_model::gguf::GgufHeader::parse(&spm, spm.len() as u64).expect("spm header");
    kiln_model::tokenizer::tokenizer_from_gguf(&header).expect("spm tokenizer");
}

#[test]
fn tiny_hf_folder_loads() {
    let dir = tmp();
    let path = write_hf(dir.path(), &tiny_config(), &safetensors(&tiny_st_tensors()));
    open_and_load(&path).expect("tiny hf folder");
}

// ---------------------------------------------------------------------------------------------
// GGUF
// ---------------------------------------------------------------------------------------------

/// Copies the first `len` bytes of the real model, reading no more than that.
fn truncated_real_model(dir: &Path, len: u64) -> PathBuf {
    let real = kiln_hub::ensure_starter_model(false).expect("starter model");
    let mut prefix = Vec::new();
    std::fs::File::open(&real)
        .expect("open starter model")
        .take(len)
        .read_to_end(&mut prefix)
        .expect("read prefix");
    assert_eq!(
        prefix.len() as u64,
        len,
        "starter model is shorter than {len} bytes"
    );
    write_gguf(dir, &prefix)
}

#[test]
fn real_model_truncated_in_the_header() {
    let dir = tmp();
    let path = truncated_real_model(dir.path(), 1 << 20);
    // 1 MB ends inside the vocabulary arrays (for the starter model, the merges array's count no
    // longer fits in what is left); the message names the array.
    assert_refused(&path, &path, &["tokenizer.ggml."]);
}

#[test]
fn real_model_truncated_in_the_data() {
    let dir = tmp();
    let path = truncated_real_model(dir.path(), 50 << 20);
    // The header is intact; some tensor's bytes now run past the end of the file.
    assert_refused(&path, &path, &[".weight: offset", "run past"]);
}

#[test]
fn gguf_wrong_magic() {
    let dir = tmp();
    let mut bytes = tiny_gguf().build();
    bytes[..4].copy_from_slice(b"GGML");
    let path = write_gguf(dir.path(), &bytes);
    assert_refused(&path, &path, &["magic"]);
}

#[test]
fn gguf_unsupported_version() {
    let dir = tmp();
    let mut bytes = tiny_gguf().build();
    bytes[4..8].copy_from_slice(&7u32.to_le_bytes());
    let path = write_gguf(dir.path(), &bytes);
    assert_refused(&path, &path, &["version"]);
}

#[test]
fn gguf_tensor_offset_past_the_end() {
    let dir = tmp();
    let mut g = tiny_gguf();
    g.tensor_mut("blk.0.ffn_up.weight").offset = Some(1 << 30);
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(&path, &path, &["blk.0.ffn_up.weight: offset"]);
}

#[test]
fn gguf_misaligned_tensor_offset() {
    let dir = tmp();
    let mut g = tiny_gguf();
    g.tensor_mut("blk.0.ffn_up.weight").offset = Some(4);
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(&path, &path, &["blk.0.ffn_up.weight: offset", "aligned"]);
}

#[test]
fn gguf_absurd_dims() {
    let dir = tmp();
    let mut g = tiny_gguf();
    g.tensor_mut("blk.0.attn_q.weight").dims = vec![1 << 32, 1 << 32];
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(&path, &path, &["blk.0.attn_q.weight: dims"]);

    let mut g = tiny_gguf();
    g.tensor_mut("blk.0.attn_q.weight").dims = vec![4, 0];
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(&path, &path, &["blk.0.attn_q.weight: dims"]);

    let mut g = tiny_gguf();
    g.tensor_mut("blk.0.attn_q.weight").dims = vec![1; 9];
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(&path, &path, &["blk.0.attn_q.weight: n_dims"]);
}

#[test]
fn gguf_three_dim_tensor_is_not_a_matrix() {
    let dir = tmp();
    let mut g = tiny_gguf();
    // Same element count, so the header is valid; the loader must refuse the rank.
    g.tensor_mut("blk.0.attn_q.weight").dims = vec![4, 2, 2];
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(&path, &path, &["blk.0.attn_q.weight", "not a matrix"]);
}

#[test]
fn gguf_absurd_counts() {
    let dir = tmp();
    let mut bytes = tiny_gguf().build();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let path = write_gguf(dir.path(), &bytes);
    assert_refused(&path, &path, &["tensor_count"]);

    let mut bytes = tiny_gguf().build();
    bytes[16..24].copy_from_slice(&(1u64 << 62).to_le_bytes());
    let path = write_gguf(dir.path(), &bytes);
    assert_refused(&path, &path, &["kv_count"]);

    // An array claiming 2^40 strings, with none following.
    let mut g = tiny_gguf();
    let mut raw = 8u32.to_le_bytes().to_vec();
    raw.extend((1u64 << 40).to_le_bytes());
    g.set("tokenizer.ggml.tokens", Kv::Raw(9, raw));
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(&path, &path, &["tokenizer.ggml.tokens"]);

    // A string claiming 2^60 bytes.
    let mut g = tiny_gguf();
    g.set(
        "general.name",
        Kv::Raw(8, (1u64 << 60).to_le_bytes().to_vec()),
    );
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(&path, &path, &["general.name"]);
}

#[test]
fn gguf_absurd_config_values() {
    let dir = tmp();
    // Counts that would size per-layer tables must be refused before anything is allocated.
    for (key, words) in [
        ("llama.block_count", ["llama", "num_hidden_layers"]),
        ("llama.embedding_length", ["llama", "hidden_size"]),
        ("llama.feed_forward_length", ["llama", "intermediate_size"]),
    ] {
        let mut g = tiny_gguf();
        g.set(key, Kv::U32(u32::MAX));
        let path = write_gguf(dir.path(), &g.build());
        assert_refused(&path, &path, &words);
    }
}

#[test]
fn gguf_unknown_tensor_dtype() {
    let dir = tmp();
    let mut g = tiny_gguf();
    g.tensor_mut("blk.0.attn_k.weight").ty = 77;
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(&path, &path, &["blk.0.attn_k.weight: type", "77"]);
}

#[test]
fn gguf_unknown_metadata_type() {
    let dir = tmp();
    let mut g = tiny_gguf();
    g.set("general.name", Kv::Raw(99, vec![]));
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(
        &path,
        &path,
        &["general.name", "unknown metadata value type 99"],
    );
}

#[test]
fn gguf_unknown_architecture() {
    let dir = tmp();
    let mut g = tiny_gguf();
    g.set("general.architecture", Kv::Str("foo".into()));
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(&path, &path, &["architecture", "\"foo\""]);
}

#[test]
fn gguf_missing_config_keys() {
    let dir = tmp();
    for key in [
        "general.architecture",
        "llama.embedding_length",
        "llama.attention.head_count",
        "llama.block_count",
        "llama.feed_forward_length",
    ] {
        let mut g = tiny_gguf();
        g.remove_kv(key);
        let path = write_gguf(dir.path(), &g.build());
        assert_refused(&path, &path, &[key, "missing"]);
    }
}

#[test]
fn gguf_wrong_config_value_types() {
    let dir = tmp();
    let mut g = tiny_gguf();
    g.set("llama.block_count", Kv::Str("one".into()));
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(&path, &path, &["llama.block_count", "unsigned integer"]);
}

#[test]
fn gguf_inconsistent_heads_and_vocab() {
    let dir = tmp();
    let mut g = tiny_gguf();
    g.set("llama.attention.head_count_kv", Kv::U32(3));
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(
        &path,
        &path,
        &["num_attention_heads 2 is not a multiple of num_key_value_heads 3"],
    );

    let mut g = tiny_gguf();
    g.set("llama.attention.key_length", Kv::U32(3));
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(&path, &path, &["head_dim 3 must be even"]);

    let mut g = tiny_gguf();
    g.set("llama.vocab_size", Kv::U32(0));
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(&path, &path, &["vocab_size = 0"]);
}

#[test]
fn gguf_required_tensor_missing() {
    let dir = tmp();
    let mut g = tiny_gguf();
    g.remove_tensor("blk.0.ffn_down.weight");
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(
        &path,
        &path,
        &["tensor model.layers.0.mlp.down_proj.weight", "missing"],
    );
}

#[test]
fn gguf_tensor_with_the_wrong_shape() {
    let dir = tmp();
    let mut g = tiny_gguf();
    // Transposed: [INTER, HIDDEN] in GGUF order is HIDDEN rows of INTER columns.
    g.tensor_mut("blk.0.ffn_up.weight").dims = vec![INTER as u64, HIDDEN as u64];
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(
        &path,
        &path,
        &[
            "tensor model.layers.0.mlp.up_proj.weight",
            "shape [4, 8], expected [8, 4]",
        ],
    );
}

#[test]
fn gguf_bad_alignment() {
    let dir = tmp();
    let mut g = tiny_gguf();
    g.set("general.alignment", Kv::U32(3));
    let path = write_gguf(dir.path(), &g.build());
    assert_refused(&path, &path, &["general.alignment"]);
}

// ---------------------------------------------------------------------------------------------
// Hugging Face folders: safetensors
// ---------------------------------------------------------------------------------------------

#[test]
fn safetensors_header_length_past_the_end() {
    let dir = tmp();
    let mut st = safetensors(&tiny_st_tensors());
    st[..8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let path = write_hf(dir.path(), &tiny_config(), &st);
    assert_refused(&path, &path.join("model.safetensors"), &["header length"]);

    // Beyond what any header may be: refused before reading it.
    let mut st = safetensors(&tiny_st_tensors());
    st[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let path = write_hf(dir.path(), &tiny_config(), &st);
    assert_refused(
        &path,
        &path.join("model.safetensors"),
        &["header too large"],
    );
}

#[test]
fn safetensors_invalid_json_header() {
    let dir = tmp();
    let st = safetensors_raw("{\"a\": {\"dtype\": \"F32\", ", &[]);
    let path = write_hf(dir.path(), &tiny_config(), &st);
    assert_refused(
        &path,
        &path.join("model.safetensors"),
        &["invalid JSON in header"],
    );
}

#[test]
fn safetensors_overlapping_offsets() {
    let dir = tmp();
    let header = json!({
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
    });
    let st = safetensors_raw(&header.to_string(), &f32_bytes(6));
    let path = write_hf(dir.path(), &tiny_config(), &st);
    assert_refused(
        &path,
        &path.join("model.safetensors"),
        &["invalid offset for tensor `b`"],
    );
}

#[test]
fn safetensors_data_not_covered() {
    let dir = tmp();
    let mut st = safetensors(&tiny_st_tensors());
    st.extend([0u8; 16]);
    let path = write_hf(dir.path(), &tiny_config(), &st);
    assert_refused(
        &path,
        &path.join("model.safetensors"),
        &["not fully covered"],
    );
}

#[test]
fn safetensors_unsupported_dtype() {
    let dir = tmp();
    let mut tensors = tiny_st_tensors();
    let up = tensors
        .iter_mut()
        .find(|t| t.0 == "model.layers.0.mlp.up_proj.weight")
        .expect("up_proj");
    // Same byte length as f32 would be half; I64 needs 8 bytes an element.
    up.1 = "I64".into();
    up.3 = vec![0; INTER * HIDDEN * 8];
    let path = write_hf(dir.path(), &tiny_config(), &safetensors(&tensors));
    assert_refused(
        &path,
        &path.join("model.safetensors"),
        &[
            "tensor model.layers.0.mlp.up_proj.weight",
            "I64",
            "not supported",
        ],
    );
}

#[test]
fn safetensors_shard_index_escaping_the_folder() {
    let dir = tmp();
    let path = write_hf(dir.path(), &tiny_config(), &safetensors(&tiny_st_tensors()));
    let index = json!({"weight_map": {"model.embed_tokens.weight": "../escape.safetensors"}});
    let index_path = path.join("model.safetensors.index.json");
    std::fs::write(&index_path, index.to_string()).expect("index");
    assert_refused(
        &path,
        &index_path,
        &["../escape.safetensors", "leaves the folder"],
    );

    let index = json!({"weight_map": {"model.embed_tokens.weight": "/etc/passwd"}});
    std::fs::write(&index_path, index.to_string()).expect("index");
    assert_refused(&path, &index_path, &["/etc/passwd", "leaves the folder"]);

    let index = json!({"metadata": {}});
    std::fs::write(&index_path, index.to_string()).expect("index");
    assert_refused(&path, &index_path, &["weight_map"]);
}

#[test]
fn safetensors_shard_missing() {
    let dir = tmp();
    let path = write_hf(dir.path(), &tiny_config(), &safetensors(&tiny_st_tensors()));
    let index =
        json!({"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}});
    std::fs::write(path.join("model.safetensors.index.json"), index.to_string()).expect("index");
    assert_refused(&path, &path.join("model-00001-of-00002.safetensors"), &[]);
}

#[test]
fn hf_required_tensor_missing() {
    let dir = tmp();
    let mut tensors = tiny_st_tensors();
    tensors.retain(|t| t.0 != "model.norm.weight");
    let path = write_hf(dir.path(), &tiny_config(), &safetensors(&tensors));
    assert_refused(&path, &path, &["tensor model.norm.weight", "missing"]);
}

#[test]
fn hf_tensor_with_the_wrong_shape() {
    let dir = tmp();
    let mut tensors = tiny_st_tensors();
    let k = tensors
        .iter_mut()
        .find(|t| t.0 == "model.layers.0.self_attn.k_proj.weight")
        .expect("k_proj");
    k.2 = vec![HIDDEN, KV_HEADS * HEAD_DIM];
    let path = write_hf(dir.path(), &tiny_config(), &safetensors(&tensors));
    assert_refused(
        &path,
        &path.join("model.safetensors"),
        &[
            "tensor model.layers.0.self_attn.k_proj.weight",
            "shape [4, 2], expected [2, 4]",
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// Hugging Face folders: config.json
// ---------------------------------------------------------------------------------------------

/// Writes the tiny folder with `edit` applied to its config and checks the refusal.
#[track_caller]
fn assert_config_refused(edit: impl FnOnce(&mut serde_json::Map<String, Value>), words: &[&str]) {
    let dir = tmp();
    let mut config = tiny_config();
    edit(config.as_object_mut().expect("object"));
    let path = write_hf(dir.path(), &config, &safetensors(&tiny_st_tensors()));
    assert_refused(&path, &path.join("config.json"), words);
}

#[test]
fn config_unknown_architecture() {
    assert_config_refused(
        |c| drop(c.insert("model_type".into(), json!("foo"))),
        &["architecture", "\"foo\""],
    );
    assert_config_refused(|c| drop(c.remove("model_type")), &["architecture", "\"\""]);
}

#[test]
fn config_missing_required_keys() {
    for key in [
        "hidden_size",
        "num_attention_heads",
        "num_hidden_layers",
        "intermediate_size",
        "vocab_size",
    ] {
        assert_config_refused(|c| drop(c.remove(key)), &[key, "missing"]);
    }
}

#[test]
fn config_wrong_value_types() {
    assert_config_refused(
        |c| drop(c.insert("hidden_size".into(), json!("4"))),
        &["hidden_size", "non-negative integer"],
    );
    assert_config_refused(
        |c| drop(c.insert("num_hidden_layers".into(), json!(-1))),
        &["num_hidden_layers"],
    );
    assert_config_refused(
        |c| drop(c.insert("rms_norm_eps".into(), json!([1]))),
        &["rms_norm_eps"],
    );
    assert_config_refused(
        |c| drop(c.insert("tie_word_embeddings".into(), json!(1))),
        &["tie_word_embeddings"],
    );
}

#[test]
fn config_heads_not_divisible() {
    assert_config_refused(
        |c| {
            c.insert("num_attention_heads".into(), json!(3));
            c.insert("head_dim".into(), json!(2));
            c.insert("num_key_value_heads".into(), json!(2));
        },
        &["num_attention_heads 3 is not a multiple of num_key_value_heads 2"],
    );
}

#[test]
fn config_odd_head_dim() {
    assert_config_refused(
        |c| drop(c.insert("head_dim".into(), json!(3))),
        &["head_dim 3 must be even"],
    );
}

#[test]
fn config_encoder_variants_kiln_does_not_run() {
    let nomic = |key: &'static str, v: Value| {
        move |c: &mut serde_json::Map<String, Value>| {
            c.insert("model_type".into(), json!("nomic_bert"));
            for k in ["hidden_size", "num_hidden_layers", "num_attention_heads"] {
                c.remove(k);
            }
            c.insert("n_embd".into(), json!(16));
            c.insert("n_layer".into(), json!(1));
            c.insert("n_head".into(), json!(2));
            c.insert(key.into(), v);
        }
    };
    assert_config_refused(nomic("prenorm", json!(true)), &["prenorm", "nomic-bert"]);
    assert_config_refused(
        nomic("rotary_emb_fraction", json!(0.5)),
        &["rotary_emb_fraction"],
    );
    assert_config_refused(nomic("qkv_proj_bias", json!(true)), &["qkv_proj_bias"]);
    assert_config_refused(
        nomic("activation_function", json!("gelu")),
        &["activation_function", "swiglu"],
    );
    assert_config_refused(
        |c| {
            c.insert("model_type".into(), json!("xlm-roberta"));
            c.insert("hidden_act".into(), json!("gelu"));
            c.insert("max_position_embeddings".into(), json!(4));
            c.insert("pad_token_id".into(), json!(3));
        },
        &["pad_token_id", "no positions"],
    );
    assert_config_refused(
        |c| drop(c.insert("model_type".into(), json!("bert"))),
        &["hidden_act", "gelu"],
    );
}

#[test]
fn config_zero_vocab() {
    assert_config_refused(
        |c| drop(c.insert("vocab_size".into(), json!(0))),
        &["vocab_size = 0 is out of range"],
    );
}

#[test]
fn config_absurd_sizes() {
    // Refused before a per-layer table of that length is built.
    assert_config_refused(
        |c| drop(c.insert("num_hidden_layers".into(), json!(1u64 << 40))),
        &["num_hidden_layers"],
    );
    assert_config_refused(
        |c| drop(c.insert("num_hidden_layers".into(), json!(u64::MAX))),
        &["num_hidden_layers"],
    );
    assert_config_refused(
        |c| drop(c.insert("hidden_size".into(), json!(1u64 << 40))),
        &["hidden_size"],
    );
    assert_config_refused(
        |c| drop(c.insert("num_key_value_heads".into(), json!(0))),
        &["num_key_value_heads = 0"],
    );
}

#[test]
fn config_bad_rope_and_layers() {
    assert_config_refused(
        |c| drop(c.insert("rope_theta".into(), json!(0.5))),
        &["rope_theta"],
    );
    assert_config_refused(
        |c| {
            drop(c.insert(
                "rope_scaling".into(),
                json!({"rope_type": "yarn", "factor": 4.0}),
            ))
        },
        &["rope_scaling.rope_type", "yarn"],
    );
    assert_config_refused(
        |c| {
            drop(c.insert(
                "rope_scaling".into(),
                json!({"rope_type": "llama3", "factor": 8.0}),
            ))
        },
        &["rope_scaling.low_freq_factor", "missing"],
    );
    assert_config_refused(
        |c| {
            drop(c.insert(
                "layer_types".into(),
                json!(["full_attention", "full_attention"]),
            ))
        },
        &["layer_types has 2 entries for 1 layers"],
    );
    assert_config_refused(
        |c| drop(c.insert("layer_types".into(), json!(["sideways"]))),
        &["layer_types", "sideways"],
    );
    assert_config_refused(
        |c| drop(c.insert("hidden_act".into(), json!("relu"))),
        &["hidden_act", "relu"],
    );
}

#[test]
fn config_not_json() {
    let dir = tmp();
    std::fs::write(dir.path().join("config.json"), "{\"model_type\": ").expect("config");
    std::fs::write(
        dir.path().join("model.safetensors"),
        safetensors(&tiny_st_tensors()),
    )
    .expect("st");
    assert_refused(dir.path(), &dir.path().join("config.json"), &["(json)"]);
}

#[test]
fn config_missing_file() {
    let dir = tmp();
    std::fs::write(
        dir.path().join("model.safetensors"),
        safetensors(&tiny_st_tensors()),
    )
    .expect("st");
    assert_refused(dir.path(), &dir.path().join("config.json"), &[]);
}

// ---------------------------------------------------------------------------------------------
// Fuzz seeds
// ---------------------------------------------------------------------------------------------

/// The fuzz seeds (small valid inputs the fuzzers mutate) as (target, file name, bytes). Names
/// avoid the `.gguf` and `.safetensors` extensions, which the repository ignores.
fn fuzz_seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut seeds = Vec::new();
    let mut put = |target: &'static str, name: &'static str, bytes: &[u8]| {
        seeds.push((target, name, bytes.to_vec()))
    };
    put("gguf_header", "tiny_llama_gpt2.bin", &tiny_gguf().build());
    put(
        "gguf_header",
        "tiny_llama_spm.bin",
        &tiny_gguf_spm().build(),
    );
    let mut gemma = tiny_gguf_spm();
    gemma
        .remove_kv("general.architecture")
        .set("general.architecture", Kv::Str("gemma3".into()))
        .set("gemma3.embedding_length", Kv::U32(HIDDEN as u32))
        .set("gemma3.attention.head_count", Kv::U32(HEADS as u32))
        .set("gemma3.attention.head_count_kv", Kv::U32(KV_HEADS as u32))
        .set("gemma3.attention.key_length", Kv::U32(HEAD_DIM as u32))
        .set("gemma3.attention.sliding_window", Kv::U32(16))
        .set("gemma3.block_count", Kv::U32(1))
        .set("gemma3.feed_forward_length", Kv::U32(INTER as u32))
        .set("gemma3.rope.scaling.type", Kv::Str("linear".into()))
        .set("gemma3.rope.scaling.factor", Kv::F32(8.0));
    gemma.tensors.clear();
    gemma.f32_tensor("token_embd.weight", &[HIDDEN as u64, VOCAB as u64]);
    put("gguf_header", "gemma3_meta.bin", &gemma.build());

    put(
        "safetensors_header",
        "tiny_llama.bin",
        &safetensors(&tiny_st_tensors()),
    );
    let mixed: Vec<StTensor> = vec![
        ("a".into(), "F16".into(), vec![2, 3], vec![0; 12]),
        ("b".into(), "BF16".into(), vec![4], vec![0; 8]),
        ("c".into(), "I64".into(), vec![1, 1, 2], vec![0; 16]),
        ("d".into(), "U8".into(), vec![0], vec![]),
    ];
    put(
        "safetensors_header",
        "mixed_dtypes.bin",
        &safetensors(&mixed),
    );
    let with_meta = safetensors_raw(
        &json!({"__metadata__": {"format": "pt"}, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).to_string(),
        &f32_bytes(2),
    );
    put("safetensors_header", "with_metadata.bin", &with_meta);

    put(
        "hf_config",
        "llama.json",
        tiny_config().to_string().as_bytes(),
    );
    let mut qwen = tiny_config();
    qwen["model_type"] = json!("qwen2");
    qwen["use_sliding_window"] = json!(false);
    qwen["sliding_window"] = json!(32);
    put("hf_config", "qwen2.json", qwen.to_string().as_bytes());
    let mut llama3 = tiny_config();
    llama3["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    put(
        "hf_config",
        "llama3_rope.json",
        llama3.to_string().as_bytes(),
    );
    let gemma = json!({
        "model_type": "gemma3",
        "eos_token_id": [1, 106],
        "text_config": {
            "hidden_size": HIDDEN, "intermediate_size": INTER, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "num_hidden_layers": 2,
            "vocab_size": VOCAB, "sliding_window": 16, "query_pre_attn_scalar": 2,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}
            }
        }
    });
    put("hf_config", "gemma3.json", gemma.to_string().as_bytes());
    seeds
}

/// The committed seeds match the builders above, so they stay valid inputs as formats evolve.
/// `KILN_WRITE_FUZZ_SEEDS=1` rewrites them instead of comparing.
#[test]
fn fuzz_seeds_are_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds");
    let write = std::env::var_os("KILN_WRITE_FUZZ_SEEDS").is_some_and(|v| v == "1");
    for (target, name, bytes) in fuzz_seeds() {
        let path = root.join(target).join(name);
        if write {
            std::fs::create_dir_all(root.join(target)).expect("seed dir");
            std::fs::write(&path, &bytes).expect("write seed");
        } else {
            let on_disk = std::fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (KILN_WRITE_FUZZ_SEEDS=1 writes it)",
                    path.display()
                )
            });
            assert!(
                on_disk == bytes,
                "{} is stale: rerun with KILN_WRITE_FUZZ_SEEDS=1",
                path.display()
            );
        }
    }
}
