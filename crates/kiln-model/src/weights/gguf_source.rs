//! Tensors from a GGUF file, renamed to Hugging Face names, with llama.cpp's Q/K row permutation
//! undone so that every architecture runs the same rotate-half RoPE.

use std::path::Path;

use super::TensorSource;
use crate::ModelError;
use crate::backend::HostTensor;
use crate::config::Architecture;
use crate::gguf::GgufFile;

/// Every per-layer Hugging Face tensor suffix [`GgufSource::gguf_name`] maps.
const HF_LAYER_TENSORS: [&str; 16] = [
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_proj.bias",
    "self_attn.k_proj.bias",
    "self_attn.v_proj.bias",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "post_attention_layernorm.weight",
    "pre_feedforward_layernorm.weight",
    "post_feedforward_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
];

/// BERT's whole-model tensors: Hugging Face name (bare, as `BertModel` saves them) and GGUF name,
/// as llama.cpp's converter writes them (a cross-encoder's pooler is `cls`, its classifier
/// `cls.output`).
const BERT_TENSORS: [(&str, &str); 9] = [
    ("embeddings.word_embeddings.weight", "token_embd.weight"),
    (
        "embeddings.position_embeddings.weight",
        "position_embd.weight",
    ),
    (
        "embeddings.token_type_embeddings.weight",
        "token_types.weight",
    ),
    ("embeddings.LayerNorm.weight", "token_embd_norm.weight"),
    ("embeddings.LayerNorm.bias", "token_embd_norm.bias"),
    ("pooler.dense.weight", "cls.weight"),
    ("pooler.dense.bias", "cls.bias"),
    ("classifier.weight", "cls.output.weight"),
    ("classifier.bias", "cls.output.bias"),
];

/// BERT's per-layer modules: Hugging Face name under `encoder.layer.N.`, GGUF name under
/// `blk.N.`; each has a `.weight` and a `.bias`.
const BERT_LAYER_MODULES: [(&str, &str); 8] = [
    ("attention.self.query", "attn_q"),
    ("attention.self.key", "attn_k"),
    ("attention.self.value", "attn_v"),
    ("attention.output.dense", "attn_output"),
    ("attention.output.LayerNorm", "attn_output_norm"),
    ("intermediate.dense", "ffn_up"),
    ("output.dense", "ffn_down"),
    ("output.LayerNorm", "layer_output_norm"),
];

/// nomic-bert's whole-model tensors: nomic's Hugging Face name and llama.cpp's GGUF name.
const NOMIC_TENSORS: [(&str, &str); 4] = [
    ("embeddings.word_embeddings.weight", "token_embd.weight"),
    (
        "embeddings.token_type_embeddings.weight",
        "token_types.weight",
    ),
    ("emb_ln.weight", "token_embd_norm.weight"),
    ("emb_ln.bias", "token_embd_norm.bias"),
];

/// nomic-bert's per-layer modules: Hugging Face name under `encoder.layers.N.`, GGUF name under
/// `blk.N.` (the fused Q/K/V projection stays fused).
const NOMIC_LAYER_MODULES: [(&str, &str); 7] = [
    ("attn.Wqkv", "attn_qkv"),
    ("attn.out_proj", "attn_output"),
    ("norm1", "attn_output_norm"),
    ("mlp.fc11", "ffn_up"),
    ("mlp.fc12", "ffn_gate"),
    ("mlp.fc2", "ffn_down"),
    ("norm2", "layer_output_norm"),
];

/// An encoder's names in both layouts: whole-model tensors, the Hugging Face prefix of layer
/// `N`'s modules (`encoder.layer.` + N) and the per-layer modules.
struct EncoderNames {
    tensors: &'static [(&'static str, &'static str)],
    layer_prefix: &'static str,
    modules: &'static [(&'static str, &'static str)],
}

const BERT_NAMES: EncoderNames = EncoderNames {
    tensors: &BERT_TENSORS,
    layer_prefix: "encoder.layer.",
    modules: &BERT_LAYER_MODULES,
};

const NOMIC_NAMES: EncoderNames = EncoderNames {
    tensors: &NOMIC_TENSORS,
    layer_prefix: "encoder.layers.",
    modules: &NOMIC_LAYER_MODULES,
};

impl EncoderNames {
    /// The GGUF name of Hugging Face tensor `hf`.
    fn gguf_name(&self, hf: &str) -> Option<String> {
        if let Some((_, g)) = self.tensors.iter().find(|(h, _)| *h == hf) {
            return Some(g.to_string());
        }
        let (layer, rest) = hf.strip_prefix(self.layer_prefix)?.split_once('.')?;
        let (module, kind) = rest.rsplit_once('.')?;
        if kind != "weight" && kind != "bias" {
            return None;
        }
        let (_, g) = self.modules.iter().find(|(h, _)| *h == module)?;
        Some(format!("blk.{layer}.{g}.{kind}"))
    }

    /// The Hugging Face name of GGUF tensor `gguf` (the inverse of [`EncoderNames::gguf_name`]).
    fn hf_name(&self, gguf: &str) -> Option<String> {
        if let Some((h, _)) = self.tensors.iter().find(|(_, g)| *g == gguf) {
            return Some(h.to_string());
        }
        let (layer, rest) = gguf.strip_prefix("blk.")?.split_once('.')?;
        let (module, kind) = rest.rsplit_once('.')?;
        if kind != "weight" && kind != "bias" {
            return None;
        }
        let (h, _) = self.modules.iter().find(|(_, g)| *g == module)?;
        Some(format!("{}{layer}.{h}.{kind}", self.layer_prefix))
    }
}

/// A GGUF file as a [`TensorSource`].
pub struct GgufSource {
    file: GgufFile,
    arch: Architecture,
    n_heads: usize,
    n_kv_heads: usize,
}

impl GgufSource {
    /// Wraps an open GGUF file; head counts are needed to undo the Q/K permutation.
    pub fn new(file: GgufFile, arch: Architecture, n_heads: usize, n_kv_heads: usize) -> Self {
        Self {
            file,
            arch,
            n_heads,
            n_kv_heads,
        }
    }

    fn encoder_names(&self) -> Option<&'static EncoderNames> {
        match self.arch {
            Architecture::Bert => Some(&BERT_NAMES),
            Architecture::NomicBert => Some(&NOMIC_NAMES),
            _ => None,
        }
    }

    /// The underlying file.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The GGUF name of Hugging Face tensor `hf`, when the file's layout has one.
    pub fn gguf_name(&self, hf: &str) -> Option<String> {
        if let Some(names) = self.encoder_names() {
            return names.gguf_name(hf);
        }
        let direct = match hf {
            "model.embed_tokens.weight" => Some("token_embd.weight"),
            "model.norm.weight" => Some("output_norm.weight"),
            "lm_head.weight" => Some("output.weight"),
            // EmbeddingGemma's Dense modules, under llama.cpp's names in both layouts.
            "dense_2.weight" if self.arch == Architecture::Gemma3 => Some("dense_2.weight"),
            "dense_3.weight" if self.arch == Architecture::Gemma3 => Some("dense_3.weight"),
            _ => None,
        };
        if let Some(n) = direct {
            return Some(n.to_string());
        }
        let rest = hf.strip_prefix("model.layers.")?;
        let (layer, suffix) = rest.split_once('.')?;
        let gemma = self.arch == Architecture::Gemma3;
        let mapped = match suffix {
            "input_layernorm.weight" => "attn_norm.weight",
            "self_attn.q_proj.weight" => "attn_q.weight",
            "self_attn.k_proj.weight" => "attn_k.weight",
            "self_attn.v_proj.weight" => "attn_v.weight",
            "self_attn.o_proj.weight" => "attn_output.weight",
            "self_attn.q_proj.bias" => "attn_q.bias",
            "self_attn.k_proj.bias" => "attn_k.bias",
            "self_attn.v_proj.bias" => "attn_v.bias",
            "self_attn.q_norm.weight" => "attn_q_norm.weight",
            "self_attn.k_norm.weight" => "attn_k_norm.weight",
            "post_attention_layernorm.weight" if gemma => "post_attention_norm.weight",
            "post_attention_layernorm.weight" => "ffn_norm.weight",
            "pre_feedforward_layernorm.weight" => "ffn_norm.weight",
            "post_feedforward_layernorm.weight" => "post_ffw_norm.weight",
            "mlp.gate_proj.weight" => "ffn_gate.weight",
            "mlp.up_proj.weight" => "ffn_up.weight",
            "mlp.down_proj.weight" => "ffn_down.weight",
            _ => return None,
        };
        Some(format!("blk.{layer}.{mapped}"))
    }

    /// The Hugging Face name of GGUF tensor `gguf` (the inverse of [`GgufSource::gguf_name`]).
    pub fn hf_name(&self, gguf: &str) -> Option<String> {
        if let Some(names) = self.encoder_names() {
            return names.hf_name(gguf);
        }
        let mut candidates: Vec<String> = ["model.embed_tokens.weight", "model.norm.weight"]
            .into_iter()
            .chain(["lm_head.weight", "dense_2.weight", "dense_3.weight"])
            .map(String::from)
            .collect();
        if let Some(layer) = gguf.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
            let p = format!("model.layers.{}", layer.0);
            candidates.extend(HF_LAYER_TENSORS.iter().map(|s| format!("{p}.{s}")));
        }
        candidates
            .into_iter()
            .find(|hf| self.gguf_name(hf).as_deref() == Some(gguf))
    }

    /// Whether tensor `hf` is stored with llama.cpp's Q/K row permutation, and over how many heads.
    pub fn permuted_heads(&self, hf: &str) -> Option<usize> {
        self.heads_to_unpermute(hf)
    }

    /// llama.cpp's converter permutes Q/K rows of llama-family models into its interleaved RoPE
    /// layout; other families are stored as in Hugging Face.
    fn heads_to_unpermute(&self, hf: &str) -> Option<usize> {
        if self.arch != Architecture::Llama {
            return None;
        }
        if hf.ends_with("self_attn.q_proj.weight") {
            Some(self.n_heads)
        } else if hf.ends_with("self_attn.k_proj.weight") {
            Some(self.n_kv_heads)
        } else {
            None
        }
    }
}

/// Row order that undoes llama.cpp's permutation: within each head, GGUF row `2i + c` is Hugging
/// Face row `c * half + i`.
pub fn unpermute_order(rows: usize, n_heads: usize) -> Option<Vec<usize>> {
    if n_heads == 0 || !rows.is_multiple_of(n_heads) || !(rows / n_heads).is_multiple_of(2) {
        return None;
    }
    let head_dim = rows / n_heads;
    let half = head_dim / 2;
    let mut order = vec![0; rows];
    for h in 0..n_heads {
        for c in 0..2 {
            for i in 0..half {
                order[h * head_dim + c * half + i] = h * head_dim + 2 * i + c;
            }
        }
    }
    Some(order)
}

impl TensorSource for GgufSource {
    fn path(&self) -> &Path {
        self.file.path()
    }

    fn tensor(&self, name: &str) -> Result<Option<HostTensor>, ModelError> {
        let Some(gguf_name) = self.gguf_name(name) else {
            return Ok(None);
        };
        let Some(info) = self.file.header().tensor(&gguf_name) else {
            return Ok(None);
        };
        let too_big = || ModelError::Tensor {
            path: self.path().into(),
            name: gguf_name.clone(),
            reason: format!("dims {:?} are not a matrix or vector", info.dims),
        };
        let (cols, rows) = match info.dims.as_slice() {
            [c] => (*c as usize, 1),
            [c, r] => (*c as usize, *r as usize),
            _ => return Err(too_big()),
        };
        let mut t = HostTensor {
            ty: info.ty,
            rows,
            cols,
            bytes: self.file.tensor_bytes(info),
        };
        if let Some(heads) = self.heads_to_unpermute(name) {
            let order = unpermute_order(rows, heads).ok_or_else(|| ModelError::Tensor {
                path: self.path().into(),
                name: gguf_name.clone(),
                reason: format!("{rows} rows do not split into {heads} heads of even width"),
            })?;
            t.permute_rows(&order)?;
        }
        Ok(Some(t))
    }

    fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let mut out: Vec<(String, Vec<usize>)> = (self.file.header().tensors.iter())
            .filter_map(|t| {
                let shape = t.dims.iter().rev().map(|&d| d as usize).collect();
                Some((self.hf_name(&t.name)?, shape))
            })
            .collect();
        out.sort();
        out
    }

    fn largest_tensor_bytes(&self) -> u64 {
        let tensors = &self.file.header().tensors;
        tensors.iter().map(|t| t.size_bytes).max().unwrap_or(0)
    }

    fn total_tensor_bytes(&self) -> u64 {
        // Tensors may overlap in a hostile file, so their sizes can add up past u64 (a panic with
        // overflow checks on): saturate, the answer is "too much" either way.
        self.file
            .header()
            .tensors
            .iter()
            .map(|t| t.size_bytes)
            .fold(0, u64::saturating_add)
    }
}
