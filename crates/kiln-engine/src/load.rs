//! Loading a model with everything generation needs: weights on a backend, tokenizer, chat
//! template, EOS set and sampling defaults.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use kiln_model::arch::Model;
use kiln_model::backend::Backend;
use kiln_model::chat_template::ChatTemplate;
use kiln_model::config::ModelConfig;
use kiln_model::files::{GenerationDefaults, ModelFiles, ModelFormat};
use kiln_model::tokenizer::{KilnTokenizer, tokenizer_from_gguf};

use crate::EngineError;

/// A model ready to generate.
pub struct LoadedModel<B: Backend> {
    /// Where it came from.
    pub path: PathBuf,
    /// GGUF or Hugging Face folder.
    pub format: ModelFormat,
    /// Architecture description.
    pub config: ModelConfig,
    /// Weights on the backend.
    pub model: Model<B>,
    /// Tokenizer with BOS/EOS facts.
    pub tokenizer: KilnTokenizer,
    /// The same tokenizer, shared with incremental decoders.
    pub hf_tokenizer: Arc<tokenizers::Tokenizer>,
    /// Chat template, when the model ships one.
    pub chat_template: Option<ChatTemplate>,
    /// Every token id that ends generation.
    pub eos_ids: Vec<u32>,
    /// Sampling defaults from `generation_config.json`.
    pub generation: GenerationDefaults,
    /// How an embedding model pools (`None`: a generative model).
    pub embedding: Option<kiln_model::embedding::EmbeddingConfig>,
    /// Bytes of weight data in the files.
    pub weight_bytes: u64,
    /// Seconds spent loading.
    pub load_secs: f64,
}

/// Loads the model at `path` (a `.gguf` file or a Hugging Face folder) onto `backend`.
pub fn load_model<B: Backend>(backend: &B, path: &Path) -> Result<LoadedModel<B>, EngineError> {
    let started = Instant::now();
    let files = ModelFiles::open(path)?;
    let (tokenizer, template_source) = match files.gguf() {
        Some(gguf) => {
            let tok = tokenizer_from_gguf(gguf.header())?;
            let tmpl = gguf
                .header()
                .get("tokenizer.chat_template")
                .and_then(|v| v.as_str())
                .map(String::from);
            (tok, tmpl)
        }
        None => (
            KilnTokenizer::from_hf_folder(path)?,
            hf_chat_template(path)?,
        ),
    };
    let chat_template = match template_source {
        Some(src) => Some(ChatTemplate::new(
            &src,
            tokenizer.bos_token().as_deref(),
            tokenizer.eos_token().as_deref(),
        )?),
        None => None,
    };
    let mut eos_ids: Vec<u32> = files.config.eos_token_ids.clone();
    eos_ids.extend(&files.generation.eos_token_ids);
    eos_ids.extend(tokenizer.eos_ids());
    eos_ids.sort_unstable();
    eos_ids.dedup();
    if files.config.bidirectional && files.embedding.is_none() {
        return Err(EngineError::Request(format!(
            "{}: a bidirectional model (an encoder, EmbeddingGemma) serves embeddings only, and this model names no pooling (sentence-transformers' modules.json and 1_Pooling/config.json, or a GGUF's pooling_type)",
            path.display()
        )));
    }
    let model = Model::load_for(
        backend,
        files.tensors(),
        files.config.clone(),
        files.embedding.is_none(),
    )?;
    let weight_bytes = files.tensors().total_tensor_bytes();
    let hf_tokenizer = Arc::new(tokenizer.inner().clone());
    Ok(LoadedModel {
        path: path.into(),
        format: files.format,
        config: files.config.clone(),
        model,
        tokenizer,
        hf_tokenizer,
        chat_template,
        eos_ids,
        generation: files.generation.clone(),
        embedding: files.embedding,
        weight_bytes,
        load_secs: started.elapsed().as_secs_f64(),
    })
}

/// The chat template of a Hugging Face folder: `chat_template.jinja`, else the
/// `chat_template` of `tokenizer_config.json` (a string, or a list of named templates of which
/// `default` is used).
fn hf_chat_template(dir: &Path) -> Result<Option<String>, EngineError> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|e| EngineError::Request(format!("{}: {e}", jinja.display())));
    }
    let cfg_path = dir.join("tokenizer_config.json");
    if !cfg_path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&cfg_path)
        .map_err(|e| EngineError::Request(format!("{}: {e}", cfg_path.display())))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| EngineError::Request(format!("{}: {e}", cfg_path.display())))?;
    Ok(match json.get("chat_template") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template"))
            .and_then(|t| t.as_str())
            .map(String::from),
        _ => None,
    })
}
